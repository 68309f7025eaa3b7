"""asyncio's TaskGroup as Python 3.12 has it, on 3.11 too, and what to raise for its
errors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any

# 3.11's TaskGroup never uncancels the task that runs it when a child fails after the
# ``async with`` body has ended (CPython fixed it in 3.12).
_LEAKS_CANCEL = sys.version_info < (3, 12)


class TaskGroup(asyncio.TaskGroup):
    """asyncio.TaskGroup, but the task running it is never left marked as cancelled. On 3.11
    a child failing while the group waits for its children cancels that task and never
    uncancels it: its ``cancelling()`` stays 1, and what runs after reads it as a request to
    stop (a worker's slot stopped after a failed send, logging "a slot's cancellation was
    swallowed")."""

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asked_before = getattr(self, "_parent_cancel_requested", False)
        try:
            await super().__aexit__(et, exc, tb)
        finally:
            # Asked while waiting for the children: 3.11 caught its own CancelledError and
            # forgot the request; 3.12 uncancels it here, and so do we.
            asked = getattr(self, "_parent_cancel_requested", False)
            parent: Any = getattr(self, "_parent_task", None)
            if _LEAKS_CANCEL and asked and not asked_before and parent is not None:
                parent.uncancel()


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What to raise for a TaskGroup's errors: the first, as itself; or CancelledError when
    the task that ran the group was told to stop meanwhile. A TaskGroup's errors win over
    that cancellation, and the task would then run on as if never told."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return asyncio.CancelledError()
    return group.exceptions[0]


async def run_all(calls: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run the calls concurrently; the first failure is raised as itself, not as a group."""
    try:
        async with TaskGroup() as tg:
            for call in calls:
                tg.create_task(call)
    except ExceptionGroup as group:
        first = first_error(group)
        raise first from first.__cause__
