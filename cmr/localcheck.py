"""A local input file, read only as it was at submit.

Submit records each local input's identity (device, inode, size: a :class:`cmr.plan.Check`)
in the job's plan. A worker opens the path (following links: a link inside the input
directory, which submit allowed, is read where it points) and compares the identity of
what it opened, by ``fstat`` on that descriptor, before reading a byte; every read goes
through that descriptor. A link or another file swapped in after submit (by whoever can
write the input directory: a file outside it, someone's secret) is therefore never read,
however the path resolves between checks; the task fails, naming what changed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
from types import TracebackType

from cmr.errors import CmrError
from cmr.plan import Check

INLINE_READ_BYTES = 256 * 1024  # smaller reads run on the event loop (page cache: µs)


class InputChanged(CmrError):
    """A local input is not the file the job was submitted with: no retry would read it."""


def identity(path: str | os.PathLike[str]) -> Check:
    """What submit records of a local input file (its target, if a link)."""
    return stat_identity(os.stat(path))


def stat_identity(st: os.stat_result) -> Check:
    """:func:`identity` of a file already stat-ed (links followed)."""
    return Check(st.st_size, device=st.st_dev, inode=st.st_ino)


def open_checked(path: str, name: str, check: Check | None) -> int:
    """A read-only descriptor of ``path``, which is the file ``check`` recorded (when it
    records one); InputChanged otherwise, OSError when it cannot be opened."""
    # Non-blocking: a named pipe swapped in opens at once (then is refused), not when a
    # writer comes; a regular file reads the same either way.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory is there now", path)
        if check is None or check.inode < 0:
            return fd
        if (st.st_dev, st.st_ino, st.st_size) != (check.device, check.inode, check.size):
            raise InputChanged(_changed(path, name, check, st))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _changed(path: str, name: str, check: Check, st: os.stat_result) -> str:
    if os.path.islink(path):
        what = "it is now a link"
        if (st.st_dev, st.st_ino) == (check.device, check.inode):
            what += f" to a file of {st.st_size:,} bytes, not {check.size:,}"
        else:
            what += " to another file"
    elif (st.st_dev, st.st_ino) != (check.device, check.inode):
        what = "it is now another file"
    else:
        what = f"it now holds {st.st_size:,} bytes, not {check.size:,}"
    return (
        f"input {name[:200]} ({path[:200]}) changed since the job was submitted ({what}): "
        "the job reads only what it was submitted with; resubmit it"
    )


class CheckedFile:
    """An opened, checked local input that answers ``get_range`` (what cmr.split reads
    with) from its own descriptor; a context manager that closes it. A read in a thread
    that outlives the context (its task was cancelled) closes it when done, so the number
    is never reused under a read in flight (which would read another file)."""

    def __init__(self, path: str, name: str, check: Check | None) -> None:
        self.fd = open_checked(path, name, check)
        self._lock = threading.Lock()
        self._reading = 0
        self._closing = False

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        n = max(0, end - start)
        if n <= INLINE_READ_BYTES:
            return self._read(n, start)
        return await asyncio.to_thread(self._read, n, start)

    def _read(self, n: int, start: int) -> bytes:
        with self._lock:
            if self._closing:
                raise OSError(errno.EBADF, "the input was closed: its task ended")
            self._reading += 1
        try:
            return os.pread(self.fd, n, start)
        finally:
            with self._lock:
                self._reading -= 1
                if self._closing and not self._reading:
                    os.close(self.fd)

    def __enter__(self) -> CheckedFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._closing = True
            if not self._reading:
                os.close(self.fd)
