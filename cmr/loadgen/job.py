"""A load test is a job: each map task runs one :class:`LoadTask`, the reducer merges.

The input is one small file per task holding the task's JSON line, all padded to the same
size and split at exactly that size, so the splitter makes one map task per file (it packs
smaller files together and cuts larger ones). A map task runs its load in its pool process
with ``asyncio.run`` (in virtual time, ``run_virtual``, for the simulated store with
``virtual`` set) and emits ``("load", measurement.to_wire())``; combine and reduce merge
measurements; the single reducer writes the merged measurement as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cmr.api import run_async
from cmr.errors import UsageError, WireError
from cmr.job import Job, Pair
from cmr.loadgen.driver import run_task
from cmr.loadgen.recorder import Measurement
from cmr.loadgen.sim import run_virtual
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.targets import cleanup, prepare
from cmr.settings import AwsSettings, WorkerSettings
from cmr.watch import Progress

__all__ = ["JOB", "LoadJob", "cleanup", "prepare", "run_load", "visibility_for"]

JOB = "cmr.loadgen.job:LoadJob"  # workers import the job by module, never from a path
KEY = "load"
OPS_TASK_S = 900  # assumed length of a task bounded by --ops (its duration is unknown)


class LoadJob(Job):
    reducers = 1

    def map(self, key: str, value: str) -> Iterable[Pair]:
        yield from self.map_chunk(key, value.encode("utf-8"))

    def map_chunk(self, source: str, data: bytes) -> Iterable[Pair]:
        lines = [line for line in data.decode("utf-8").splitlines() if line.strip()]
        if lines:
            yield KEY, _run([LoadTask.from_json(line) for line in lines], self.progress)

    def combine(self, key: Any, values: Iterator[Any]) -> Iterable[Pair]:
        yield key, _merged(values)

    def reduce(self, key: Any, values: Iterator[Any]) -> Iterable[Pair]:
        yield key, _merged(values)

    def format(self, key: Any, value: Any) -> str:
        return json.dumps(value, sort_keys=True)


def _run(tasks: list[LoadTask], report: Callable[..., None] | None = None) -> dict[str, Any]:
    """Run the split's tasks (one, as run_load plans it; several still run all at once),
    reporting live operation and error counts through ``report``."""

    async def all_of() -> list[Measurement]:
        return list(await asyncio.gather(*(run_task(t, report=report) for t in tasks)))

    # the pool process has no running loop: the load owns one for its whole run. Virtual
    # time only if every task of the split is on the simulated store with it set (--sim
    # applies to all of a run's tasks, one per split): a real store's waits are real.
    virtual = all(t.target == "sim" and t.sim.get("virtual") for t in tasks)
    ran = run_virtual(all_of()) if virtual else asyncio.run(all_of())
    return Measurement.merged(ran).to_wire()


def _merged(values: Iterable[Any]) -> dict[str, Any]:
    return Measurement.merged(Measurement.from_wire(v) for v in values).to_wire()


def visibility_for(tasks: Sequence[LoadTask], at_least: int = 0) -> int:
    """A task lease comfortably longer than the longest task (leases are renewed too)."""
    longest = max(
        (OPS_TASK_S if t.duration_s is None else t.duration_s for t in tasks), default=0.0
    )
    return max(at_least, math.ceil(2 * longest) + 120)


async def run_load(
    tasks: Sequence[LoadTask],
    *,
    backend: str = "embedded",
    workers: int = 1,
    aws: AwsSettings | None = None,
    visibility_timeout: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> Measurement:
    """Run the tasks as one job (one map task each, one reducer) and return the merged
    measurement. Every task runs at once: each worker gets a map slot and a pool process per
    task it may hold. The visibility timeout is at least ``visibility_for(tasks)``.
    ``on_progress`` receives the engine's progress (tasks done, committed counters)."""
    if not tasks:
        raise UsageError("a load test needs at least one task")
    if workers < 1:
        raise UsageError("--workers must be at least 1 for a load test")
    texts = [t.to_json() for t in tasks]
    width = max(len(t.encode()) for t in texts)
    visibility = visibility_for(tasks, visibility_timeout or 0)
    per_worker = math.ceil(len(tasks) / workers)
    settings = WorkerSettings(
        map_slots=per_worker,
        # embedded workers share one pool; each aws worker process has its own
        processes=len(tasks) if backend == "embedded" else per_worker,
        reduce_slots=1,
    )
    with tempfile.TemporaryDirectory(prefix="cmr-load-") as tmp:
        inputs, output = Path(tmp) / "tasks", Path(tmp) / "out"
        inputs.mkdir()
        for i, text in enumerate(texts):
            # equal sizes, split at that size: exactly one map task per file
            pad = width - len(text.encode())
            (inputs / f"task-{i:05d}.json").write_text(text + " " * pad + "\n")
        result = await run_async(
            JOB,
            str(inputs),
            str(output),
            backend=backend,
            aws=aws,
            workers=workers,
            reducers=1,
            split_bytes=width + 1,
            visibility_timeout=visibility,
            # A load task runs for its duration by design: its time limit follows it, not
            # the task's (tiny) input.
            task_timeout=2 * visibility,
            worker_settings=settings,
            on_progress=on_progress,
        )
        lines = Path(result.parts[0]).read_text().splitlines()
    if len(lines) != 1:
        raise WireError(f"load job {result.job_id} produced {len(lines)} results, expected 1")
    m = Measurement.from_wire(json.loads(lines[0]))
    if m.tasks != len(tasks):
        raise WireError(f"load job {result.job_id} merged {m.tasks} of {len(tasks)} tasks")
    return m
