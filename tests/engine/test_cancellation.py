"""A worker told to stop stops: no wait of ours loses a cancellation. Python 3.11's
``asyncio.wait_for`` returns the result of an inner that finished as the waiter was
cancelled, and drops the cancellation: a stopping worker's slot ran on and logged "a slot's
cancellation was swallowed" in good runs (a message arriving in the embedded queue's long
poll, a pool result arriving in ``Runtime.cpu``, just as the worker stopped). A TaskGroup's
errors win over its runner's cancellation the same way: a late duplicate attempt's sends
meeting QueueGone as its job is cleaned up and its worker told to stop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
import structlog

from cmr.api import cpu_pool
from cmr.backends.aws.calls import _all
from cmr.backends.base import Backend
from cmr.backends.embedded.queues import EmbeddedQueues
from cmr.backends.faults import FaultPlan
from cmr.errors import QueueGone, Unreachable
from cmr.runtime import Runtime
from cmr.settings import WorkerSettings
from cmr.testing import StepChaos, chaos_run
from cmr.virtualtime import in_virtual_time

ROOT = Path(__file__).resolve().parents[2]


async def _cancel_as_it_finishes(
    start: Callable[[], Any], finish: Callable[[], Any], spins: int
) -> str:
    """Start the wait, let it settle, make its result arrive, let the loop turn ``spins``
    times, cancel: 'cancelled', 'done first' (too late to cancel) or 'swallowed'."""
    task = asyncio.ensure_future(start())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    finished = finish()
    if asyncio.iscoroutine(finished):
        await finished
    for _ in range(spins):
        await asyncio.sleep(0)
    if not task.cancel():
        await task
        return "done first"
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    except Exception as exc:
        return f"swallowed: {exc!r}"
    return "swallowed"


@pytest.mark.parametrize("spins", range(4))
async def test_a_receive_cancelled_as_a_message_arrives_is_cancelled(spins: int) -> None:
    queues = EmbeddedQueues()
    await queues.create("q", visibility_s=30)
    got = await _cancel_as_it_finishes(
        lambda: queues.receive("q", max_messages=1, wait_s=5),
        lambda: queues.send("q", [b"x"]),
        spins,
    )
    assert got in ("cancelled", "done first")


class _HeldPool(concurrent.futures.Executor):
    """A pool whose one task finishes when the test says (a real pool's result arrives from
    another thread at a moment no test controls)."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self.future


@pytest.mark.parametrize("spins", range(4))
@pytest.mark.parametrize("limit_s", [0.0, 60.0])
async def test_a_cpu_wait_cancelled_as_its_result_arrives_is_cancelled(
    embedded: Any, tmp_path: Path, spins: int, limit_s: float
) -> None:
    pool = _HeldPool()
    rt = Runtime(embedded, WorkerSettings(), pool, str(tmp_path))
    got = await _cancel_as_it_finishes(
        lambda: rt.cpu(sum, [1, 2], limit_s=limit_s),
        lambda: pool.future.set_result(3),
        spins,
    )
    assert got in ("cancelled", "done first")


@pytest.mark.parametrize("spins", range(3))
async def test_calls_side_by_side_cancelled_as_one_fails_are_cancelled(spins: int) -> None:
    gone = asyncio.Event()

    async def send() -> None:
        await gone.wait()
        raise QueueGone("the job's queues were deleted")

    got = await _cancel_as_it_finishes(lambda: _all([send(), asyncio.sleep(60)]), gone.set, spins)
    assert got == "cancelled"


async def test_a_failed_call_side_by_side_leaves_its_task_uncancelled() -> None:
    """Python 3.11's TaskGroup cancels the task running it when a child fails after the
    body ended, and never uncancels it: everything after read that as a request to stop."""

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise QueueGone("the job's queues were deleted")

    with pytest.raises(QueueGone):
        await _all([fails(), asyncio.sleep(0.05)])
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


class _FirstSendFails:
    """Partition queues whose first batch send fails (a network error, as the job's end or a
    flaky link makes it), after the map has sent everything else."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        if re.search(r"-p\d+$", name) and not self.failed:
            self.failed = True
            await asyncio.sleep(0.05)  # the map's body has ended: the group waits for us
            raise Unreachable("connection reset", service="sqs", operation="SendMessageBatch")
        await self.inner.send(name, bodies)


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with cpu_pool(1) as p:
        yield p


@in_virtual_time
async def test_a_worker_whose_send_failed_keeps_serving_and_logs_no_error(
    pool: Executor, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b c\nb c\nc\n")
    queues: list[_FirstSendFails] = []

    def wrap(be: Backend) -> Backend:
        queues.append(_FirstSendFails(be.queues))
        return Backend(
            be.name, queues[-1], be.blobs, be.table, be.scratch, local_blobs=be.local_blobs
        )

    with structlog.testing.capture_logs() as logged:
        result = await chaos_run(
            "examples/wordcount.py", src, tmp_path / "out", seed=0, pool=pool,
            plan=FaultPlan(seed=0), steps=StepChaos(crash=0, pause=0), hooks=[None],
            workers=1, reducers=2, split_bytes=None, clientless=True, wrap=wrap,
            timeout_s=60,
        )  # fmt: skip
    assert queues[0].failed
    assert result.record["state"] == "succeeded", result.record.get("error")
    errors = [e for e in logged if e["log_level"] in ("error", "critical")]
    assert errors == []


@pytest.mark.parametrize(
    "pattern",
    [
        r"\basyncio\.wait_for\(",  # 3.11's loses cancellations: asyncio.timeout instead
        r"\basyncio\.TaskGroup\(",  # 3.11's leaves its task cancelling: cmr.aio.TaskGroup
    ],
)
def test_no_asyncio_call_that_loses_cancellations_in_cmr(pattern: str) -> None:
    used = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "cmr").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert used == []
