"""What every service's client shares: counting the requests it sends (botocore's
before-send event, so retries count too), and running calls side by side."""

from __future__ import annotations

from collections import Counter
from typing import Any

from cmr.aio import run_all


def _counting(calls: Counter[str]) -> Any:
    """An event handler counting every HTTP request a client sends, retries included."""

    def count(event_name: str, **_kwargs: Any) -> None:
        _, service, op = event_name.split(".", 2)
        calls[f"{service}.{op}"] += 1

    return count


# Every aws protocol runs its calls side by side as the other backends do (cmr.aio).
_all = run_all
