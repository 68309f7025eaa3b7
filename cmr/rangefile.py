"""Ranges of stored objects streamed into the pool process through named pipes, for a map
task whose split is larger than it should hold in memory.

Fixed-width records (TeraSort's rows) are partitioned and sorted a piece at a time
(cmr.cpu.fixedsort), so a map task needs its split whole only because the split arrived as
one ``bytes``. A large split is what makes the blob shuffle cheap at scale: each reducer
reads one part of every map task's object, so the GETs of a job grow as map tasks times
reducers, and fewer, larger map tasks cut them (benchmarks/cloudsort.py). Such a task's
ranges are fetched here in ranged reads of PIECE_BYTES, at most IN_FLIGHT at once for the
whole task, and written, range after range and piece after piece, into one FIFO per range
(in a private directory of the worker's spool) while the pool process maps them: it reads
each FIFO a piece at a time as it would a file (cmr.cpu.mapping.FileSlice.pieces). No byte
of the split touches the local disk (a copy written and read back was two passes over the
split on the disk that bounds a large sort: benchmarks/RESULTS.md), and fetching overlaps
mapping. Memory in flight: PIECE_BYTES x IN_FLIGHT (a piece fetched
ahead of its turn waits, held, until the pipe takes it), plus a pipe's buffer.

The event loop writes without blocking: its end of each FIFO is opened ``O_RDWR |
O_NONBLOCK`` (so neither side's open waits for the other), and a full pipe is waited on as
the loop waits on a socket. The pool process reads exactly a range's length, and each
range's end is opened before the pool process may come to it (a FIFO with no writer reads
as empty at once: a short read, never a wait). An end is closed only once the pool process
has taken every byte of its range (a FIFO's unread bytes are dropped when nobody holds it
open, and the pool process may not have opened it yet), and only then is the next range
written, so one pipe holds bytes at a time. When the fetch fails, every end is closed at
once: the pool process reads a short range and stops (its error is the worker's, retried),
and the caller reports the fetch's error, which is the cause. The pool process may stop
reading early (a bad record, its time limit, its death): the caller then cancels the pump,
which would otherwise wait for room in a pipe, or for it to empty, forever.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import shutil
import struct
import tempfile
import termios
from dataclasses import dataclass
from types import TracebackType

from cmr.backends.base import Blobs

PIECE_BYTES = 64 * 1024 * 1024  # one GET; S3 serves a range at a connection's full speed
IN_FLIGHT = 4  # GETs of one map task at once, and so the pieces it holds
STREAM_FROM = 64 * 1024 * 1024  # a task past this (the largest split cmr chooses itself)
PIPE_BYTES = 1024 * 1024  # a FIFO's buffer (Linux's default is 64 KiB: a wake-up per 64 KiB)
DRAIN_POLL_S = 0.02  # at most this long between looks at a written range's pipe


def streams(task_bytes: int) -> bool:
    """Whether a map task of fixed records reading ``task_bytes`` from a remote store streams
    its ranges into the pool process rather than reading them into memory."""
    return task_bytes > STREAM_FROM


def unread(fd: int) -> int:
    """The bytes in a pipe that its reader has not taken."""
    (n,) = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))
    return int(n)


def _wake(room: asyncio.Future[None]) -> None:
    if not room.done():  # the loop may call again before the writer is removed
        room.set_result(None)


@dataclass
class _Range:
    url: str
    start: int
    end: int
    path: str
    fd: int = -1  # the loop's end of the FIFO while open; -1 before, -2 once closed
    waiting: bool = False  # for room in the pipe: the loop watches ``fd``


class Stream:
    """A map task's streamed ranges: a FIFO for each (:meth:`add`), the pump that fills them
    (:meth:`start`), and, on :meth:`close` (a context manager's exit), their directory gone
    whatever happened. Used from the event loop's thread only."""

    def __init__(self, blobs: Blobs, spool_dir: str) -> None:
        self.blobs = blobs
        self.dir = tempfile.mkdtemp(prefix="split-", suffix=".fifos", dir=spool_dir)
        self._ranges: dict[int, _Range] = {}
        # The key of the range whose fetch failed (the caller names its input), if one did.
        self.failed: int | None = None
        # The pump waits for the store, nothing left to write: a pool process that ran past
        # its time limit meanwhile was waiting for its input.
        self.starved = False

    def __len__(self) -> int:
        return len(self._ranges)

    def add(self, key: int, url: str, start: int, end: int) -> str:
        """A FIFO that will carry bytes [start, end) of ``url``: its path, for the pool
        process to read. Ranges are written in the order of their keys (the order the pool
        process reads them in), whatever order they are added in."""
        path = os.path.join(self.dir, f"{key}.range")
        os.mkfifo(path, 0o600)
        self._ranges[key] = _Range(url, start, end, path)
        return path

    def start(self) -> asyncio.Task[None]:
        """The pump, started. The first range's end is opened here, before the pool process
        is handed its slices: a FIFO opened for reading with no writer reads as empty at
        once (never waits), so each range's end must be open before the pool process may
        come to it (the pump opens the next range's when it starts writing one)."""
        keys = sorted(self._ranges)
        order = [self._ranges[k] for k in keys]
        if order:
            self._open(order[0])
        return asyncio.create_task(self._pump(order, keys))

    async def _pump(self, order: list[_Range], keys: list[int]) -> None:
        pieces = iter(
            [(i, at) for i, r in enumerate(order) for at in range(r.start, r.end, PIECE_BYTES)]
        )
        ahead: collections.deque[tuple[int, int, asyncio.Task[bytes]]] = collections.deque()
        try:
            while True:
                # Fetched ahead in order, at most IN_FLIGHT pieces held or coming, the
                # one to write next among them: a piece waits for its turn, never for room.
                while len(ahead) < IN_FLIGHT and (p := next(pieces, None)) is not None:
                    ahead.append((*p, asyncio.create_task(self._get(order[p[0]], p[1]))))
                if not ahead:
                    return
                i, at, got = ahead.popleft()
                r = order[i]
                if at == r.start and i + 1 < len(order):
                    # Open before the pool process can finish this range: it then comes to
                    # the next at once, before the pump sees this one drained.
                    self._open(order[i + 1])
                self.starved = not got.done()
                try:
                    data = await got
                except Exception:
                    self.failed = keys[i]
                    raise
                finally:
                    self.starved = False
                del got  # the task holds the piece too
                await self._write(r, data)
                del data
                if at + PIECE_BYTES >= r.end:
                    # All written. Its end is closed once the reader has taken every byte:
                    # a FIFO's unread bytes are dropped when nobody holds it open, and the
                    # reader may not have opened it yet. Until then the next range waits
                    # (its pipe would fill while no one reads it: one pipe holds bytes).
                    await self._drained(r)
                    self._close(r)
        finally:
            # However it ends: the reader sees the end of its range at once (a short one,
            # if the pump stopped early), and no GET goes on.
            for r in order:
                self._close(r)
            for *_, t in ahead:
                t.cancel()
            if ahead:
                await asyncio.wait([t for *_, t in ahead])
                for *_, t in ahead:
                    if not t.cancelled():
                        t.exception()  # taken: a sibling's error is not the one reported

    async def _get(self, r: _Range, at: int) -> bytes:
        want = min(PIECE_BYTES, r.end - at)
        data = await self.blobs.get_range(r.url, at, at + want)
        if len(data) != want:
            raise EOFError(f"{r.url[:200]} ends at byte {at + len(data):,}, before {r.end:,}")
        return data

    async def _write(self, r: _Range, data: bytes) -> None:
        """All of ``data`` into the range's FIFO, waiting (never blocking) while it is full."""
        view = memoryview(data)
        loop = asyncio.get_running_loop()
        while view:
            try:
                view = view[os.write(r.fd, view) :]
                continue
            except BlockingIOError:
                pass
            room: asyncio.Future[None] = loop.create_future()
            loop.add_writer(r.fd, _wake, room)
            r.waiting = True
            try:
                await room
            finally:
                self._unwatch(r)

    async def _drained(self, r: _Range) -> None:
        """Until the range's pipe is empty: nothing signals that, so it is looked at, at
        first often (a reader waiting for the next range's bytes waits as long as this),
        then every DRAIN_POLL_S (a reader mapping a large piece)."""
        wait = 0.0005
        while unread(r.fd):
            await asyncio.sleep(wait)
            wait = min(2 * wait, DRAIN_POLL_S)

    def _open(self, r: _Range) -> None:
        """The loop's end of a range's FIFO. Read and write: it opens at once with or
        without a reader, and while it is open the reader never sees end-of-file."""
        if r.fd != -1:
            return  # open, or closed for good
        r.fd = os.open(r.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        resize = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux's
        with contextlib.suppress(OSError):  # past the user's pipe limits: the default size
            if resize is not None:
                fcntl.fcntl(r.fd, resize, PIPE_BYTES)

    def _unwatch(self, r: _Range) -> None:
        if r.waiting:
            r.waiting = False
            asyncio.get_running_loop().remove_writer(r.fd)

    def _close(self, r: _Range) -> None:
        # Never watched once closed, and closed once only (a descriptor number may be
        # another's by then).
        self._unwatch(r)
        fd, r.fd = r.fd, -2
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Every end closed, the FIFOs and their directory removed (a pool process still
        reading one sees its end; one yet to open one finds it gone: either is a short
        read, never a wait)."""
        for r in self._ranges.values():
            self._close(r)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
