"""A worker told to stop stops: no wait of ours loses a cancellation. Python 3.11's
``asyncio.wait_for`` returns the result of an inner that finished as the waiter was
cancelled, and drops the cancellation: a stopping worker's slot ran on and logged "a slot's
cancellation was swallowed" in good runs (a message arriving in the embedded queue's long
poll, a pool result arriving in ``Runtime.cpu``, just as the worker stopped)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.embedded.queues import EmbeddedQueues
from cmr.runtime import Runtime
from cmr.settings import WorkerSettings

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


def test_no_asyncio_wait_for_in_cmr() -> None:
    """Python 3.11's wait_for loses cancellations (above): asyncio.timeout instead."""
    used = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "cmr").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line)
    ]
    assert used == []
