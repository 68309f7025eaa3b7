"""Stable partitioning: the same key lands on the same reducer on every machine.

Python's ``hash()`` is salted per process, so it would scatter one key over several
reducers; crc32 of the key's bytes is stable and fast.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack


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
