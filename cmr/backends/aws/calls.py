"""What every service's client shares: counting the requests it sends (botocore's
before-send event, so retries count too), and running calls side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Coroutine, Iterable
from typing import Any

from cmr.aio import TaskGroup, first_error


def _counting(calls: Counter[str]) -> Any:
    """An event handler counting every HTTP request a client sends, retries included."""

    def count(event_name: str, **_kwargs: Any) -> None:
        _, service, op = event_name.split(".", 2)
        calls[f"{service}.{op}"] += 1

    return count


async def _all(calls: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run the calls concurrently; the first failure is raised as itself, not as a group."""
    try:
        async with TaskGroup() as tg:
            for call in calls:
                tg.create_task(call)
    except ExceptionGroup as group:
        first = first_error(group)
        raise first from first.__cause__
