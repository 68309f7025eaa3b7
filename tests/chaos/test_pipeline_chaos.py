"""A two-step pipeline with a worker crashing dead at each point of the hand-over from step
1 to step 2, and at the points of step 2 where an attempt's work is lost. Nobody waits on the job
and nobody replaces the crashed worker: the one other worker must still run both steps and
end the pipeline with exactly the sequential output, leaving nothing behind."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.faults import FaultPlan
from cmr.runtime import STEPS, Runtime, WorkerCrashed
from cmr.testing import chaos_run, read_output, sequential
from tests.engine.corpus import edge_cases

TOPWORDS = "examples/topwords.py"
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
