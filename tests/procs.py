"""Real processes under test: their peak memory and state, read from /proc.

Peak RSS is each process's VmHWM, sampled while it lives: not wait4's ru_maxrss, which for
a child starts at what the forking process (pytest, 200+ MiB late in a run) held and keeps
that across exec."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


def _read(path: str) -> bytes:
    """A /proc file's bytes, b"" once its process is gone. os-level: the samplers below
    read two files per process 50 times a second, and pathlib's text reading cost ~5% of a
    core per sampled tree."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""
    finally:
        os.close(fd)


def vm_hwm_mib(pid: int) -> float:
    """The process's peak resident memory since its exec, in MiB (0 once it is gone)."""
    status = _read(f"/proc/{pid}/status")
    at = status.find(b"\nVmHWM:")
    if at < 0:
        return 0.0
    return int(status[at + 7 : status.index(b"\n", at + 1)].split()[0]) / 1024


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, now."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [int(c) for c in _read(f"/proc/{p}/task/{p}/children").split()]
    return found


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, as the CMR_STOP_AT aid leaves it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


class Peaks:
    """Each process's peak RSS in a tree, by pid, sampled every ``every`` seconds from a
    thread while the context is open (a process that lives less than that may be missed)."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        self.pid, self.every = pid, every
        self.by_pid: dict[int, float] = {}
        self._stop = threading.Event()

    def _sample(self) -> None:
        while True:
            for p in descendants(self.pid):
                self.by_pid[p] = max(self.by_pid.get(p, 0.0), vm_hwm_mib(p))
            if self._stop.wait(self.every):
                return

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Peaks]:
        t = threading.Thread(target=self._sample, daemon=True)
        t.start()
        try:
            yield self
        finally:
            self._stop.set()
            t.join()

    def most(self) -> float:
        """The largest peak of any one process seen, in MiB."""
        return max(self.by_pid.values(), default=0.0)
