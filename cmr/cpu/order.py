"""The order of keys and values at reduce: keys by ``sort_key`` (plain sorting where it is
the same order), and each key's values by the job's ``value_order`` when it sorts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from cmr import usercode
from cmr.job import Job, Step

sort_key = usercode.sort_key  # the order of keys within a part (see cmr.Job)
PLAIN_KEYS = (str, int, bytes)  # kinds whose own order is sort_key's, == its grouping


def value_sorting(job: Job, step: Step | None = None) -> tuple[bool, Callable[[Any], Any] | None]:
    """(sort_values, value_order) of a step: its own when the job declares steps, the job
    class's for a one-step job (its default step)."""
    if step is not None and type(job).steps is not Job.steps:
        return step.sort_values, step.value_order
    return bool(job.sort_values), job.value_order


def sorted_keys(groups: dict[Any, list[Any]]) -> list[Any]:
    """The keys in sort_key order; plain sorting when all are str, all int or all bytes
    (the same order, ~4x faster than calling sort_key per key)."""
    if len(set(map(type, groups))) == 1 and type(next(iter(groups))) in PLAIN_KEYS:
        return sorted(groups)
    return sorted(groups, key=sort_key)


class ValueOrder:
    """How a job's values reach reduce when it sorts them (``Job.sort_values``): by
    ``value_order`` (a key function over values, the user's) or in natural order
    (``sort_key``). Spilled runs then hold one entry per value, (key, (value,)), in
    (key, value) order, so the merge of the runs hands each key's values over sorted, one
    at a time: a key with more values than memory holds is sorted on disk like the keys."""

    def __init__(self, job: Job, value_order: Callable[[Any], Any] | None) -> None:
        self.method = f"{type(job).__name__}.value_order"
        self.custom = value_order
        self.key: Callable[[Any], Any] = value_order if value_order is not None else sort_key

    def sorted(self, values: list[Any]) -> list[Any]:
        if self.custom is None and (
            all(type(v) is str for v in values) or all(type(v) is int for v in values)
        ):
            return sorted(values)  # the same order as sort_key's, ~4x faster
        try:
            return sorted(values, key=self.key)
        except TypeError as exc:
            raise self.failed(exc) from exc

    def guarded(self, merged: Iterator[Any]) -> Iterator[Any]:
        """The merge of the runs, its errors said as value_order's: it is pulled from inside
        the user's reduce, which would otherwise take the blame."""
        try:
            yield from merged
        except Exception as exc:
            problem = self.failed(exc)
            if problem is exc:
                raise
            raise problem from exc

    def failed(self, exc: Exception) -> Exception:
        if usercode.culprit(exc) is not None:  # value_order raised: its frames say where
            return usercode.UserCodeError(usercode.describe(exc).rstrip("\n"))
        if isinstance(exc, TypeError):  # what value_order returned does not compare
            return usercode.UserCodeError(
                f"{self.method} returned sort keys that cannot be compared with each other "
                f"({exc}): return one kind of value for every value (numbers, str, or tuples "
                "of them)"
            )
        return exc
