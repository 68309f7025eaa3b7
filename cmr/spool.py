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

The spill directory is often the shared /tmp, where another user can plant names: a sweep
looks only at directories it owns with the mode ``mkdtemp`` gives (0700), opened without
following a symbolic link, and removes what is in one through that open directory, so a
name swapped for a link while it works leads nowhere else. On a file system without
``flock`` (NFS without its lock daemon) a spool has no lock file: it is removed as its worker
stops, and never by a sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable

PREFIX = "cmr-"
LOCK = ".owner.lock"  # in each directory: held by its worker while it lives
# This process's living spools, by (device, inode): never swept, whatever the locks say (a
# file system that emulates flock with per-process locks would let us take our own).
_ours: set[tuple[int, int]] = set()
_swept: set[str] = set()  # spill directories this process has swept


class Spool:
    """One worker's directory, locked as its worker's own until ``close``."""

    def __init__(self, under: str) -> None:
        self.path = tempfile.mkdtemp(prefix=PREFIX, dir=under)
        self.locked = True
        # Locked under another name, then renamed: a sweep never sees the lock file unlocked
        # (it would take this living worker's directory for a dead one's).
        making = os.path.join(self.path, LOCK + ".new")
        self._fd: int | None = None
        try:
            self._fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody has it
            except OSError:  # ENOLCK and the like: no lock to be had here, so no lock file
                os.close(self._fd)
                self._fd = None
                self.locked = False
                os.unlink(making)
            else:
                os.rename(making, os.path.join(self.path, LOCK))
        except OSError:
            # Out of descriptors, of quota: nothing may be left that no sweep would take.
            if self._fd is not None:
                os.close(self._fd)
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        st = os.stat(self.path)
        self._id = (st.st_dev, st.st_ino)
        _ours.add(self._id)

    def close(self) -> None:
        """Remove the directory (what is in it was this worker's alone), then let go. If
        something cannot be removed (a pool process still writing), the lock file stays,
        unlocked: the next worker to start here removes the rest."""
        _ours.discard(self._id)
        fd, self._fd = self._fd, None
        try:
            dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # gone already
            if fd is not None:
                os.close(fd)
            return
        try:
            _remove(dfd, fd, lambda: os.rmdir(self.path))
        finally:
            os.close(dfd)


def _remove(dfd: int, lock_fd: int | None, rmdir: Callable[[], None]) -> bool:
    """Empty the open directory, let go of its lock, then remove the lock file and the
    directory: whether it is gone. The lock file goes last (after its descriptor is closed:
    NFS keeps an open file as .nfsXXXX), so a directory left half-removed (a pool process
    still writing) keeps it, and the next sweep finishes the work."""
    try:
        emptied = _empty_but_lock(dfd)
    except OSError:
        emptied = False
    if lock_fd is not None:
        os.close(lock_fd)
    if not emptied:
        return False
    with contextlib.suppress(OSError):  # none: an unlocked spool's
        os.unlink(LOCK, dir_fd=dfd)
    try:
        rmdir()
    except OSError:
        return False
    return True


def _empty_but_lock(dfd: int) -> bool:
    """Remove everything in the open directory but its lock file: whether nothing else is
    left. Through the directory's descriptor: a name swapped meanwhile changes nothing."""
    for entry in os.scandir(dfd):
        if entry.name == LOCK:
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.name, dir_fd=dfd)
            else:
                os.unlink(entry.name, dir_fd=dfd)
    return all(entry.name == LOCK for entry in os.scandir(dfd))


def sweep_once(under: str) -> list[str]:
    """``sweep``, the first time this process asks for ``under``: a worker that dies later
    is swept by the next process to start there."""
    key = os.path.realpath(under)
    if key in _swept:
        return []
    _swept.add(key)
    return sweep(under)


def sweep(under: str) -> list[str]:
    """Remove the directories under ``under`` whose workers died; the removed ones' paths.
    Left alone: a directory without a lock file (being made this moment, or not a spool),
    one whose lock another process holds (its worker lives), one of this process, and one
    not ours (another owner, another mode, a link)."""
    removed: list[str] = []
    try:
        ufd = os.open(under, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return removed
    try:
        names = [e.name for e in os.scandir(ufd) if e.name.startswith(PREFIX)]
        removed = [os.path.join(under, name) for name in names if _sweep_one(ufd, name)]
    finally:
        os.close(ufd)
    return removed


def _sweep_one(ufd: int, name: str) -> bool:
    try:
        dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=ufd)
    except OSError:  # gone, not a directory, a link, not ours to open
        return False
    try:
        st = os.fstat(dfd)
        # Permission bits only: a setgid spill directory (a team's) gives its spools 2700.
        if st.st_uid != os.geteuid() or st.st_mode & 0o777 != 0o700:
            return False
        if (st.st_dev, st.st_ino) in _ours:
            return False
        try:
            lfd = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:  # no lock file: a spool being made, or none
            return False
        try:
            fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lfd)
            return False  # its worker holds it: alive
        # Ours now: its worker is dead. Held while emptying, so that a second worker
        # sweeping at the same moment skips it.
        return _remove(dfd, lfd, lambda: os.rmdir(name, dir_fd=ufd))
    finally:
        os.close(dfd)
