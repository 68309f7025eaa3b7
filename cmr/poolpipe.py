"""What a pool process writes as a file, read by the event loop as it comes, through a FIFO:
never on the disk.

A reduce task's output went to a file in the spool, which the worker then read to upload:
at 100 TB that is two of the nine bytes of local-disk traffic a sorted byte cost, and the
instance store's speed bounded the sort (benchmarks/cloudsort.py). The pool process opens
the FIFO's path as it would open a file (for writing: its writes block while the pipe is
full, so the upload paces it); the event loop reads chunks as they come and hands them to
the blob store's ``upload_stream``.

The loop opens its end for reading *and* writing: so the pool's open never waits for a
reader, and the loop's reads never see an end of file before the pool has even opened the
path. The end of the output is told by the pool's call having returned (everything it
wrote is then in the pipe) and the pipe being empty. Closing the loop's end, the only
reader, makes the pool's next write fail (EPIPE): a pool process whose output is no longer
wanted stops at its next write rather than writing on (one still sorting runs until it
writes, or until its time limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from cmr.rangefile import unread

CHUNK_BYTES = 1 << 20  # read at once: the most a chunk holds
PIPE_BYTES = 1 << 20  # the pipe's buffer (Linux's default is 64 KiB): fewer wake-ups
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class PoolFailed(Exception):
    """The pool's call failed or was refused: what it wrote is not to be stored."""


class PoolPipe:
    """A FIFO at ``path`` in ``directory``; close() removes it (however the task ends)."""

    def __init__(self, directory: str, name: str = "output.fifo") -> None:
        self.path = os.path.join(directory, name)
        os.mkfifo(self.path, 0o600)
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a smaller pipe works too, only more slowly
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, PIPE_BYTES)
        try:
            self._full = fcntl.fcntl(self._fd, _F_GETPIPE_SZ) // 2
        except OSError:
            self._full = 0  # unknown: every wait of ours counts as the pool's
        self._stalled_s = 0.0

    def stalled(self) -> float:
        """The seconds so far that the pipe stood full while its consumer (an upload's parts
        in flight) did not read it: the pool process's writes waited on the store, not on
        the job's code (Runtime.cpu's hard limit moves on by them, as cmr.timelimit.paused
        moves the pool's own). Counted whole when the pipe is found full at the consumer's
        return: at most the time it was away."""
        return self._stalled_s

    async def chunks(
        self, call: asyncio.Future[Any], ok: Callable[[Any], bool]
    ) -> AsyncIterator[bytes]:
        """What the pool writes, at most CHUNK_BYTES at a time, until ``call`` (its run in the
        pool) has finished and the pipe is empty. PoolFailed at the end, instead of the end,
        when ``call`` raised or ``ok`` refuses its result: a stream's consumer then stores
        nothing."""
        loop = asyncio.get_running_loop()
        fd = self._fd
        last = b""  # held back until the call's outcome is known: a failed call's end
        while True:
            try:
                data = os.read(fd, CHUNK_BYTES)
            except BlockingIOError:
                if call.done():  # all it wrote was in the pipe, and has been read
                    break
                # Watched only while waiting: the loop's polling is level-triggered, and
                # a pipe left watched while its consumer is away (an upload's parts in
                # flight) would wake it at every turn, a core spinning.
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _wake, readable)
                try:
                    await asyncio.wait((readable, call), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if self._fd == fd:  # not closed meanwhile (its number may be reused)
                        loop.remove_reader(fd)
                continue
            # As read, not gathered: the consumer gathers its parts anyway, and each copy of
            # a reduce's output costs a core ~0.1 s per GB.
            if last:
                away = time.monotonic()
                yield last
                if self._fd == fd and unread(fd) >= self._full:
                    self._stalled_s += time.monotonic() - away
            last = data
        if call.cancelled() or call.exception() is not None or not ok(call.result()):
            raise PoolFailed("the pool's call failed: its output is not stored")
        if last:
            yield last

    def close(self) -> None:
        """The FIFO removed, then the loop's end closed (a pool still writing gets EPIPE at
        its next write; one that has not opened the path yet finds none)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._fd >= 0:
            loop_reader_removed(self._fd)
            os.close(self._fd)
            self._fd = -1


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # the loop may call again before the reader is removed
        waiter.set_result(None)


def loop_reader_removed(fd: int) -> None:
    """No reader callback left on ``fd`` (an abandoned ``chunks`` may not have run its
    finally yet): closing a descriptor the loop still watches confuses its selector."""
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop().remove_reader(fd)
