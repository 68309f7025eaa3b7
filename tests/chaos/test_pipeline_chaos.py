"""A two-step pipeline with a worker crashing dead at each point of the hand-over from step
1 to step 2, and at the points of step 2 where an attempt's work is lost. Nobody waits on the job
and nobody replaces the crashed worker: the one other worker must still run both steps and
end the pipeline with exactly the sequential output, leaving nothing behind."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cmr.api import run_async
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import UsageError
from cmr.finalize import finalize
from cmr.lifecycle import load_spec
from cmr.records import JobSpec, job_pk
from cmr.runtime import STEPS, Runtime, WorkerCrashed
from cmr.testing import chaos_run, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases

TOPWORDS = "examples/topwords.py"
JOBS = "tests/engine/pipeline_jobs.py"
PARAMS = {"top": "40"}
# Where a pipeline differs from a one-step job (whose every step tests/chaos/test_steps.py
# stops a worker at): step 1 ends by handing over instead of publishing, and its cleanup
# keeps its outputs; step 2 reads pairs and cleans up what step 1 kept. Each point of the
# hand-over, and the points of step 2 that lose an attempt's work.
CASES = [
    *(
        (step, 1)
        for step in (
            "reduce.committed",
            "finalize.begin",
            "pipeline.next_made",
            "pipeline.handed_over",
            "finalize.succeeded",
            "cleanup.scratch",
            "cleanup.done",
        )
    ),
    *(
        (step, 2)
        for step in (
            "map.partly_sent",
            "map.committed",
            "reduce.draining",
            "reduce.output_written",
            "publish.marked",
            "cleanup.scratch",
        )
    ),
]
assert all(step in STEPS for step, _ in CASES)


class CrashIn:
    """Crash the first worker reaching ``step`` while it works on pipeline step ``which``."""

    def __init__(self, step: str, which: int) -> None:
        self.step, self.which = step, which
        self.context: dict[str, Any] | None = None

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != self.step or self.context is not None:
            return
        job = str(context.get("job", ""))
        if job.endswith("-s2") != (self.which == 2):
            return
        self.context = context
        raise WorkerCrashed(step)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    data = edge_cases(tmp_path_factory.mktemp("pipeline") / "in")
    return data, sequential(TOPWORDS, data, None, PARAMS)


@pytest.mark.parametrize(("step", "which"), CASES)
@in_virtual_time
async def test_a_pipeline_outlives_a_crash_at_any_step_of_either_step(
    step: str, which: int, corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    crash = CrashIn(step, which)
    result = await chaos_run(
        TOPWORDS,
        data,
        tmp_path / "out",
        seed=1,
        pool=pool,
        plan=FaultPlan(seed=1),
        hooks=[crash, crash],
        workers=2,
        reducers=None,
        visibility_s=2,
        split_bytes=4096,
        params=PARAMS,
        clientless=True,
    )
    assert crash.context is not None, f"no worker reached {step} in step {which}"
    assert read_output(tmp_path / "out", 1) == expected
    assert result.record["state"] == "succeeded"
    assert result.record["job_steps"] == 2
    assert result.leftovers == []


class FinalizeTwice:
    """At the first hand-over's ``pipeline.next_made``, a second finalizer of the same step
    runs to completion first (duplicate finalizers are the rule: the last committer, a
    redelivered reduce message, a repair check); then the first one goes on, late."""

    def __init__(self) -> None:
        self.done = False

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != "pipeline.next_made" or self.done:
            return
        self.done = True
        spec, _ = await load_spec(rt.backend, str(context["job"]))
        assert await finalize(rt, spec)


@in_virtual_time
async def test_a_late_duplicate_hand_over_leaves_the_next_step_running(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    twice = FinalizeTwice()
    result = await chaos_run(
        TOPWORDS, data, tmp_path / "out", seed=3, pool=pool, plan=FaultPlan(seed=3),
        hooks=[twice, twice], workers=2, reducers=None, visibility_s=2, params=PARAMS,
        clientless=True,
    )  # fmt: skip
    assert twice.done
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert read_output(tmp_path / "out", 1) == expected
    assert result.leftovers == []


@in_virtual_time
async def test_a_forged_record_of_the_next_step_fails_the_step_naming_it(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    """Whoever can write the table can write step 2's record first (its id is derived): the
    hand-over must not adopt it (it would get step 1's data and the output place)."""
    data, _ = corpus

    async def forge(be: Backend, spec: JobSpec) -> None:
        fake = replace(spec, job_id=f"{spec.job_id}-s2", step=1, output="file:///elsewhere/")
        await be.table.put(job_pk(fake.job_id), "job", {**fake.to_item(), "state": "running"})

    result = await chaos_run(
        TOPWORDS, data, tmp_path / "out", seed=4, pool=pool, plan=FaultPlan(seed=4),
        workers=2, reducers=None, visibility_s=2, params=PARAMS, clientless=True,
        after_submit=forge,
    )  # fmt: skip
    assert result.record["state"] == "failed"
    assert "exists that no hand-over of this step made" in result.record["error"]
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@in_virtual_time
async def test_a_failed_pipeline_keeps_exactly_the_committed_outputs_of_the_step_before(
    pool: Executor, tmp_path: Path
) -> None:
    """A reducer of step 1 dies after uploading its output, before committing it: its file
    is an orphan. Step 2 fails; what step 1 kept for a resume is its committed outputs only,
    and `--from-step 2` over them reads each pair once."""
    src = tmp_path / "in.txt"
    src.write_text("a b c a b a\n" * 50)
    crash = CrashIn("reduce.output_written", 1)
    result = await chaos_run(
        f"{JOBS}:Failing", src, tmp_path / "out", seed=5, pool=pool, plan=FaultPlan(seed=5),
        hooks=[crash, crash], workers=2, reducers=None, visibility_s=2, clientless=True,
    )  # fmt: skip
    assert crash.context is not None
    assert result.record["state"] == "failed"
    kept = [b.rsplit("/", 1)[-1] for b in result.leftovers]
    # Failing's step 1 has 4 partitions: 4 committed outputs, the crashed upload gone.
    assert len(kept) == 4 and len({k[:6] for k in kept}) == 4, result.leftovers


@in_virtual_time
async def test_total_order_in_a_pipeline_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    with pytest.raises(UsageError, match="total order applies to one-step jobs"):
        await run_async(TOPWORDS, str(src), str(tmp_path / "o"), total_order=True)
