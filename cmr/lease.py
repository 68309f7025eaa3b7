"""Keeping things alive while we work: a task's message lease, and the background loops that
renew claims and leases for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from cmr.backends.base import Queues
from cmr.errors import BackendError


@contextlib.asynccontextmanager
async def in_background(loop: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``loop`` while the block runs, and stop it after. Stopping it never swallows a
    cancellation of our own (the classic ``suppress(CancelledError): await task`` does, and a
    worker told to stop would then run on)."""
    task = asyncio.create_task(loop)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])  # raises CancelledError only if *we* are cancelled
        if not task.cancelled():
            task.exception()  # retrieved: a loop's error is not "never retrieved" noise


@contextlib.asynccontextmanager
async def message_lease(
    queues: Queues, queue: str, receipt: str, seconds: int, awake: asyncio.Event
) -> AsyncIterator[None]:
    """Extend the message's visibility every third of its timeout until the block ends, so a
    slow but healthy task is not handed to a second worker. Best effort: if a renewal fails
    the message may be redelivered, which the protocols tolerate."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(max(0.2, seconds / 3))
            await awake.wait()  # a paused process renews nothing
            with contextlib.suppress(BackendError):
                await queues.change_visibility(queue, [receipt], seconds)

    async with in_background(renew()):
        yield
