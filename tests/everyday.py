"""The everyday subset, ``pytest -m "not slow"`` (scripts/test.sh -m "not slow"): the full
suite less the tests marked ``slow``. A table of many cases of one kind (the CLI's mistakes,
mrjob's examples) keeps a few of them in it, spread over the table; the full suite runs
them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest


def spread(
    values: Sequence[Any], ids: Sequence[str] | Callable[[Any], str], every: int
) -> list[Any]:
    """``values`` as parametrize arguments named by ``ids``: the first and then every
    ``every``-th stay in the everyday subset, the others are marked slow. A tuple value
    fills several arguments, as in ``parametrize(("a", "b"), ...)``."""
    names = [ids(v) for v in values] if callable(ids) else list(ids)
    return [
        pytest.param(
            *(v if isinstance(v, tuple) else (v,)),
            id=name,
            marks=() if i % every == 0 else pytest.mark.slow,
        )
        for i, (v, name) in enumerate(zip(values, names, strict=True))
    ]
