"""A range of a stored object copied to a local file in pieces, for a map task whose split
is larger than it should hold in memory.

Fixed-width records (TeraSort's rows) are partitioned and sorted a piece at a time
(cmr.cpu.fixedsort), so a map task needs its split whole only because the split arrived as
one ``bytes``. A large split is what makes the blob shuffle cheap at scale: each reducer
reads one part of every map task's object, so the GETs of a job grow as map tasks times
reducers, and fewer, larger map tasks cut them (benchmarks/cloudsort.py). Such a split is
fetched here in ranged reads of PIECE_BYTES, at most IN_FLIGHT at once, each written at its
offset as it comes; the pool process then reads the file a piece at a time
(cmr.cpu.mapping.FileSlice.pieces). Memory in flight: PIECE_BYTES x IN_FLIGHT, whatever
the split's size; the split takes its size on the worker's spool disk until the task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile

from cmr.aio import TaskGroup, first_error
from cmr.backends.base import Blobs

PIECE_BYTES = 64 * 1024 * 1024  # one GET; S3 serves a range at a connection's full speed
IN_FLIGHT = 4
STREAM_FROM = 64 * 1024 * 1024  # a range past this (the largest split cmr chooses itself)


def streams(length: int) -> bool:
    """Whether a fixed-record range of ``length`` bytes on a remote store is copied to a
    local file rather than read into memory."""
    return length > STREAM_FROM


async def fetch(blobs: Blobs, url: str, start: int, end: int, spool_dir: str) -> str:
    """A new file in ``spool_dir`` holding bytes [start, end) of ``url``; the caller deletes
    it. A short read (the object is shorter than the plan says) is an EOFError naming the
    byte it stopped at; the store's errors pass on as they are. Nothing is left behind on
    failure."""
    fd, path = await asyncio.to_thread(
        tempfile.mkstemp, prefix="split-", suffix=".range", dir=spool_dir
    )
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def piece(at: int) -> None:
        want = min(PIECE_BYTES, end - at)
        async with gate:
            data = await blobs.get_range(url, at, at + want)
            if len(data) != want:
                raise EOFError(f"{url[:200]} ends at byte {at + len(data):,}, before {end:,}")
            await asyncio.to_thread(os.pwrite, fd, data, at - start)

    try:
        try:
            async with TaskGroup() as group:
                for at in range(start, end, PIECE_BYTES):
                    group.create_task(piece(at))
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return path
