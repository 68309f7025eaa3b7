"""Ranges of stored objects copied to local files in pieces, for a map task whose split is
larger than it should hold in memory.

Fixed-width records (TeraSort's rows) are partitioned and sorted a piece at a time
(cmr.cpu.fixedsort), so a map task needs its split whole only because the split arrived as
one ``bytes``. A large split is what makes the blob shuffle cheap at scale: each reducer
reads one part of every map task's object, so the GETs of a job grow as map tasks times
reducers, and fewer, larger map tasks cut them (benchmarks/cloudsort.py). Such a task's
ranges are fetched here in ranged reads of PIECE_BYTES, at most IN_FLIGHT at once for the
whole task (one ``Gate`` shared by its ranges), each written at its offset as it comes; the
pool process then reads each file a piece at a time (cmr.cpu.mapping.FileSlice.pieces).
Memory in flight: PIECE_BYTES x IN_FLIGHT, whatever the task's size; its ranges take their
size on the worker's spool disk until the task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile

from cmr.aio import TaskGroup, first_error
from cmr.backends.base import Blobs

PIECE_BYTES = 64 * 1024 * 1024  # one GET; S3 serves a range at a connection's full speed
IN_FLIGHT = 4  # GETs of one map task at once
STREAM_FROM = 64 * 1024 * 1024  # a task past this (the largest split cmr chooses itself)


def streams(task_bytes: int) -> bool:
    """Whether a map task of fixed records reading ``task_bytes`` from a remote store copies
    its ranges to local files rather than reading them into memory."""
    return task_bytes > STREAM_FROM


def gate() -> asyncio.Semaphore:
    """The GETs in flight of one map task, all its ranges together."""
    return asyncio.Semaphore(IN_FLIGHT)


def _write_all(path: str, data: bytes, at: int) -> None:
    """``data`` at offset ``at`` of ``path``, every byte of it (a full disk's short write
    is an OSError, never a hole of zeros mapped as records). The file is opened for this
    write alone: a write still running in its thread after the copy was given up can only
    reach this file, never a descriptor since reused."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            done = os.pwrite(fd, view, at)
            if done <= 0:
                raise OSError(f"no room to write {path}")
            view, at = view[done:], at + done
    finally:
        os.close(fd)


async def fetch(
    blobs: Blobs, url: str, start: int, end: int, spool_dir: str, held: asyncio.Semaphore
) -> str:
    """A new file in ``spool_dir`` holding bytes [start, end) of ``url``; the caller deletes
    it. ``held``: the task's gate (:func:`gate`). A short read (the object is shorter than
    the plan says) is an EOFError naming the byte it stopped at; the store's and the disk's
    errors pass on as they are. Nothing is left behind on failure or cancellation."""
    fd, path = tempfile.mkstemp(prefix="split-", suffix=".range", dir=spool_dir)
    os.close(fd)

    async def piece(at: int) -> None:
        want = min(PIECE_BYTES, end - at)
        async with held:
            data = await blobs.get_range(url, at, at + want)
            if len(data) != want:
                raise EOFError(f"{url[:200]} ends at byte {at + len(data):,}, before {end:,}")
            await asyncio.to_thread(_write_all, path, data, at - start)

    try:
        try:
            async with TaskGroup() as group:
                for at in range(start, end, PIECE_BYTES):
                    group.create_task(piece(at))
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path
