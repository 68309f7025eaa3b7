"""A load test as a job: one map task per LoadTask, the reducer merges."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from cmr.api import job_ref
from cmr.backends.embedded import embedded_backend
from cmr.loadgen.job import JOB, LoadJob, cleanup, prepare, run_load, visibility_for
from cmr.loadgen.recorder import Measurement
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.summary import jam_report
from cmr.split import plan
from cmr.submit import list_input

FAST = {"read_median_ms": 2.0, "write_median_ms": 4.0}


def sim_task(i: int, **kw: object) -> LoadTask:
    base: dict[str, object] = {
        "kind": "jam",
        "target": "sim",
        "task": i,
        "seed": i,
        "readers": 2,
        "writers": 2,
        "items": 5,
        "ops": 150 + 50 * i,
        "sim": FAST,
    }
    return LoadTask(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.slow
async def test_run_load_merges_two_tasks_on_the_embedded_backend() -> None:
    tasks = [sim_task(0), sim_task(1, consistent_ratio=1.0)]
    m = await run_load(tasks)
    assert m.tasks == 2
    assert m.count() == 150 + 200  # every op of both tasks, once
    assert m.count("get", "consistent") > 0 and m.count("get", "eventual") > 0
    report = jam_report(m, "sim", len(tasks))
    assert sum(op["count"] for op in report["ops"]) == 350


def test_the_job_maps_one_task_and_merges_measurements() -> None:
    job = LoadJob()
    text = sim_task(0, ops=40).to_json()
    [(key, wire)] = list(job.map_chunk("task-00000.json", (text + "   ").encode()))
    assert key == "load"
    # values reach combine and reduce through msgpack, lists as tuples
    arrived = msgpack.unpackb(msgpack.packb(wire), use_list=False)
    [(_, combined)] = list(job.combine(key, iter([arrived, arrived])))
    [(_, reduced)] = list(job.reduce(key, iter([combined, arrived])))
    m = Measurement.from_wire(json.loads(job.format(key, reduced)))
    assert (m.tasks, m.count()) == (3, 120)
    job_ref(JOB)  # workers can import it by module


def test_a_split_holding_two_tasks_runs_both() -> None:
    data = "\n".join(sim_task(i, ops=30).to_json() for i in range(2)).encode()
    [(_, wire)] = list(LoadJob().map_chunk("tasks", data))
    assert (Measurement.from_wire(wire).tasks, Measurement.from_wire(wire).count()) == (2, 60)


async def test_padded_task_files_make_one_map_task_each(tmp_path: Path) -> None:
    """run_load pads every task file to one size and splits at that size."""
    texts = [sim_task(i).to_json() for i in range(3)] + [sim_task(9, sim={}).to_json()]
    width = max(len(t) for t in texts)
    for i, text in enumerate(texts):
        (tmp_path / f"task-{i:05d}.json").write_text(text.ljust(width) + "\n")
    backend = embedded_backend("/unused")
    _, inputs = await list_input(backend, str(tmp_path), "job")
    tasks = plan(inputs, width + 1)
    assert len(tasks) == 4 and all(len(t) == 1 for t in tasks)


def test_visibility_outlasts_the_longest_task() -> None:
    assert visibility_for([sim_task(0, ops=None, duration_s=600)]) >= 1200
    assert visibility_for([sim_task(0)], at_least=5000) == 5000


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_run_load_against_the_local_dynamodb() -> None:
    """The CLI's sequence: prepare the table, run the load job, clean up."""
    prepared = await prepare("dynamodb", {})
    resources = prepared.resources
    try:
        tasks = [
            LoadTask(
                kind="jam",
                target="dynamodb",
                task=i,
                seed=i,
                readers=3,
                writers=3,
                items=10,
                ops=60,
                consistent_ratio=0.5,
                conditional_ratio=0.5,
                resources=resources,
            )
            for i in range(2)
        ]
        m = await run_load(tasks)
        report = jam_report(m, "dynamodb", 2)
        assert m.count() == 120 and m.count(outcome="ok") == 120
        assert {(o["op"], o["mode"]) for o in report["ops"]} == {
            ("get", "eventual"),
            ("get", "consistent"),
            ("put", "plain"),
            ("put", "conditional"),
        }
    finally:
        await cleanup(prepared)
