"""Stable partitioning: the same key lands on the same reducer on every machine; and the
range partitioner of total-order jobs.

Python's ``hash()`` is salted per process, so it would scatter one key over several
reducers; crc32 of the key's bytes is stable and fast.
"""

from __future__ import annotations

import bisect
import functools
import zlib
from collections.abc import Sequence
from typing import Any

import msgpack

from cmr.usercode import sort_key


def stable_partition(key: Any, partitions: int) -> int:
    if isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, bytes):
        data = key
    elif isinstance(key, dict):
        # Values are grouped by key, and a dict cannot be: refused where the map yields it.
        raise TypeError("a dict cannot be a key")
    else:
        data = msgpack.packb(key, use_bin_type=True)
    return zlib.crc32(data) % partitions


class StablePartitioner:
    """``stable_partition`` as the partition() of a job that keeps Job's: a type that
    Shuffle.add_pairs recognises, and then computes a str key's partition inline (a word
    count's: a call per key saved)."""

    def __call__(self, key: Any, partitions: int) -> int:
        return stable_partition(key, partitions)


# Total order (``Job.total_order``): the submitter samples the keys and stores cut points in
# the plan; a key's part is how many cut points sort at or before it, so every key of part i
# sorts before every key of part i+1 and the parts concatenate into one sorted sequence.
MAX_CUT_BYTES = 1024  # a cut point's msgpack encoding: a longer str or bytes key is cut short
MAX_KEY_DEPTH = 16  # tuples within tuples in a cut point (sort_key recurses on them)
_SCALARS = (str, bytes, int, float, bool, type(None))


def is_key(x: Any, depth: int = 0) -> bool:
    """Whether ``x`` is what a key may be on the wire (no dict, no list: tuples), nested at
    most MAX_KEY_DEPTH deep."""
    if type(x) in _SCALARS:
        return True
    return type(x) is tuple and depth < MAX_KEY_DEPTH and all(is_key(k, depth + 1) for k in x)


class RangePartitioner:
    """``partition(key, n)`` of a total-order job: the number of cut points sorting at or
    before ``key`` (cmr.usercode.sort_key). With no cut points every key goes to part 0."""

    def __init__(self, cuts: Sequence[Any]) -> None:
        self.cuts = tuple(cuts)
        self.bounds = [sort_key(c) for c in self.cuts]
        # Keys of one type compared as they are: the same order as sort_key, ~5x faster.
        kinds = {type(c) for c in self.cuts}
        self.plain: type | None = kinds.pop() if kinds in ({str}, {int}, {bytes}) else None

    def __call__(self, key: Any, partitions: int) -> int:
        if type(key) is self.plain:
            return bisect.bisect_right(self.cuts, key)
        return bisect.bisect_right(self.bounds, sort_key(key))

    def many(self, keys: list[Any], partitions: int) -> list[int]:
        """``self(key, partitions)`` of each key; by C alone when all are of the cuts' kind."""
        if self.plain is not None and set(map(type, keys)) <= {self.plain}:
            return list(map(functools.partial(bisect.bisect_right, self.cuts), keys))
        return [self(k, partitions) for k in keys]
