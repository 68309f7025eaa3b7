"""A worker's local scratch directory (map spools, reduce spill runs), and the sweep of the
ones dead workers left.

A worker removes its directory as it stops, however it stops. A worker that is killed
(SIGKILL, the out-of-memory killer, a lost machine) cannot, and its spill runs can be
gigabytes: a machine whose workers are restarted after each such death would fill its disk.
So each directory holds a lock file, locked (``flock``) by its worker for as long as it
lives; the kernel drops the lock when the process dies, however it dies. A worker starting
takes the lock of every other directory it finds in the same place: one it gets belongs to
a dead worker, and is removed. A process id would not do: ids are reused, and a spill
directory shared between containers sees ids of other namespaces.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "cmr-"
LOCK = ".owner.lock"  # in each directory: held by its worker while it lives


class Spool:
    """One worker's directory, locked as its worker's own until ``close``."""

    def __init__(self, under: str) -> None:
        self.path = tempfile.mkdtemp(prefix=PREFIX, dir=under)
        # Locked under another name, then renamed: a sweep never sees the lock file unlocked
        # (it would take this living worker's directory for a dead one's).
        making = os.path.join(self.path, LOCK + ".new")
        self._fd: int | None = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
        os.rename(making, os.path.join(self.path, LOCK))

    def close(self) -> None:
        """Remove the directory (what is in it was this worker's alone), then let go."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_swept: set[str] = set()  # by this process: once is enough (its own workers are alive)


def sweep_once(under: str) -> list[str]:
    """``sweep``, the first time this process asks for ``under``."""
    key = os.path.realpath(under)
    if key in _swept:
        return []
    _swept.add(key)
    return sweep(under)


def sweep(under: str) -> list[str]:
    """Remove the directories under ``under`` whose workers died; the removed ones' paths.
    A directory without a lock file (being made this moment, or not ours) is left alone, as
    is one whose lock another process holds (its worker lives)."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(under) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(under, name)
        try:
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:  # no lock file, not a directory, not ours to open
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its worker holds it: alive
            # Ours now: its worker is dead. Held while removing, so that a second worker
            # sweeping at the same moment skips it. The lock file goes last, as a directory
            # that lost it half-removed would be skipped by the next sweep.
            with contextlib.suppress(OSError):
                for entry in os.scandir(path):
                    if entry.name != LOCK:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path, ignore_errors=True)
                        else:
                            os.unlink(entry.path)
                os.unlink(os.path.join(path, LOCK))
                os.rmdir(path)
                removed.append(path)
        finally:
            os.close(fd)
    return removed
