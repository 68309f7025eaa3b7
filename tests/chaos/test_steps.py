"""A worker crashes (stops dead) or pauses past its lease (SIGSTOP-like) at each named step
of the protocol, finalize, publish and cleanup included. Nobody waits on the job and nobody
replaces the crashed worker: the one other worker must still end it with exactly the
sequential output and nothing left behind, and nothing the crashed or paused attempt made
may be published."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.faults import FaultPlan
from cmr.publish import Manifest
from cmr.runtime import STEPS, Runtime, WorkerCrashed
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases

LEASE_S = 2
REDUCERS = 2


class Once:
    """Crash or pause the first worker that reaches ``step``; remember what it was doing."""

    def __init__(self, step: str, action: str) -> None:
        self.step, self.action = step, action
        self.context: dict[str, Any] | None = None
        self.owner = ""

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != self.step or self.context is not None:
            return
        self.context, self.owner = context, rt.worker_id
        if self.action == "crash":
            raise WorkerCrashed(step)
        await rt.pause(LEASE_S * 2.5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    data = edge_cases(tmp_path_factory.mktemp("steps") / "in")
    return data, sequential("examples/wordcount.py", data, REDUCERS)


# A one-step job never hands over (tests/chaos/test_pipeline_chaos.py stops workers there).
ONE_STEP = [s for s in STEPS if not s.startswith("pipeline.")]


@pytest.mark.parametrize("action", ["crash", "pause"])
@pytest.mark.parametrize("step", ONE_STEP)
@in_virtual_time
async def test_worker_stopped_at_a_step(
    step: str, action: str, corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    once = Once(step, action)
    result = await chaos_run(
        "examples/wordcount.py",
        data,
        tmp_path / "out",
        seed=1,
        pool=pool,
        plan=FaultPlan(seed=1),
        hooks=[once, once],
        workers=2,
        reducers=REDUCERS,
        visibility_s=LEASE_S,
        split_bytes=4096,
        clientless=True,
        # Where the map output goes: through the blob store for the step only it has.
        shuffle="blob" if step == "map.shuffle_written" else "queue",
    )
    assert once.context is not None, f"no worker reached {step}"
    assert diff_outputs(expected, read_output(tmp_path / "out", REDUCERS)) == []
    rec = result.record
    assert rec["state"] == "succeeded"
    assert result.leftovers == []
    published = [
        p.attempt for p in Manifest.from_bytes((tmp_path / "out" / "_SUCCESS").read_bytes()).parts
    ]
    assert len(published) == REDUCERS
    ctx = once.context
    if step == "map.partly_sent":
        # The stopped attempt never committed: its task ran again, and the exact output above
        # shows its batch was not counted. Whether a reducer saw that batch (and counted it
        # in batches_filtered) depends on delivery order: a reducer whose counts were met
        # first leaves it to be deleted with the queue, so that counter is not asserted.
        assert rec.get("tasks_restarted", 0) + rec.get("tasks_retried", 0) >= 1
    elif step == "map.shuffle_written":
        # The stopped attempt's object was never named by a commit: its task ran again, and
        # the object went with the job's cleanup (no leftovers above).
        assert rec.get("tasks_restarted", 0) + rec.get("tasks_retried", 0) >= 1
        assert rec.get("shuffle") == "blob"
    elif step == "map.committed":
        assert ctx["won"]
        # Its commit stands (the job may end before its message is delivered again; if it
        # is, the task is recognised as done): every map is counted once, from the commits.
        assert rec["maps_done"] == rec["maps"]
    elif step == "reduce.draining":
        # The stopped owner's partition was taken over and fenced: another claim's output
        # (a later epoch) was published for it.
        stopped = published[ctx["partition"]]
        assert ctx["token"] not in stopped, published
        assert "-e1-" not in stopped, published
    elif step == "reduce.output_written":
        stopped = published[ctx["partition"]]
        assert ctx["output"].rsplit("/", 1)[-1] != stopped, published
        assert "-e1-" not in stopped, published
    elif step == "reduce.committed":  # its commit is legitimate and is what was published
        assert ctx["output"].rsplit("/", 1)[-1] in published
