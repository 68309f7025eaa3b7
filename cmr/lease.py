"""Keeping a received task's message invisible while we still work on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from cmr.backends.base import Queues
from cmr.errors import BackendError


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

    renewer = asyncio.create_task(renew())
    try:
        yield
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
