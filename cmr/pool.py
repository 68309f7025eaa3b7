"""The CPU pool a worker runs user code in: processes started at once, that die with the
worker and can be restarted to stop a task that overran its time limit."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

from cmr import taskprogress

T = TypeVar("T")


# What a pool process runs, imported once in the fork server so that each pool process
# starts with it loaded (a spawned process spent ~0.25 CPU-s importing it, every pool).
_PRELOAD = ["cmr.pool", "cmr.cpu.mapping", "cmr.cpu.reducing", "cmr.cpu.fixedsort"]
_SOCKET_PATH_TAIL = len("/pymp-12345678/listener-12345678")
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, with its NUL


def _start_child(channel: Any, environ: dict[str, str]) -> None:
    _leave_fork_server()
    _die_with_parent()
    # A forked process has the environment the fork server started with; user code sees
    # the worker's, as it would in a process spawned now.
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    # Ctrl-C is the worker's to handle (it cancels the job and shuts the pool down in
    # order); a pool process that took it too would die mid-task and leak its semaphores.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    taskprogress.attach(channel)


def _leave_fork_server() -> None:
    """A forked pool process holds the write end of the pipe by which the fork server
    learns that the worker is gone; closed here, the server exits when the worker dies,
    and with it (by ``_die_with_parent``, whose parent is the server) every pool process,
    even one in the middle of a long task."""
    try:
        from multiprocessing import forkserver
    except ImportError:  # no fork server here (Windows): spawned, nothing to close
        return
    server: Any = forkserver._forkserver  # private: no public way to close it
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def _die_with_parent() -> None:
    """Pool processes exit when the worker dies, even by SIGKILL (Linux): a fleet node
    whose main process is OOM-killed must not keep its pool processes running forever."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)


def _noop() -> None:
    time.sleep(0.1)  # stay busy so every submit below starts a process of its own


def _context() -> Any:
    """The fork server where there is one (Linux, macOS), else spawn.

    Not fork: forking a process that runs an event loop and SDK threads is unsafe. The fork
    server is a process of its own, single-threaded, started (once per worker process)
    with cmr's task modules loaded; each pool process is a fork of it, with the worker's
    working directory, import path and environment as spawn would give it. A spawned pool
    process cost ~0.25 CPU-s and ~0.4 s of wall time before its first task (its imports),
    every time a pool started: each ``cmr.run``, and each restart after a timeout.
    """
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    # The server listens on a socket at $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, and a
    # socket's path has at most 107 bytes: under a deep TMPDIR, spawn (slower, but it works).
    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_PATH_TAIL > _SOCKET_PATH_MAX:
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    # Only while it is not running: a server started by someone else keeps their list.
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class CpuPool(Executor):
    """A process pool for user code, started at once, that a worker can restart (to stop a
    task that overran its time limit), with the queue its processes report live counters on.

    Children load job code by reference, never from ``__main__``, so we hide the main
    module while they start: a user's script without an ``if __name__ == "__main__"``
    guard (or a notebook) would otherwise be re-run in every child.
    """

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._ctx = _context()
        self.progress: Any = self._ctx.Queue()
        self.generation = 0  # restarts so far: a task that ran in an older pool is not at fault
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            self.processes,
            mp_context=self._ctx,
            initializer=_start_child,
            initargs=(self.progress, dict(os.environ)),
        )
        main = sys.modules["__main__"]
        saved: dict[str, Any] = {
            k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__
        }
        try:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
            for f in [pool.submit(_noop) for _ in range(self.processes)]:
                f.result()
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)
        return pool

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def restart(self) -> None:
        """Kill every process of the pool and start new ones; what ran in them fails with
        BrokenProcessPool. (ProcessPoolExecutor cannot stop one running call, so we reach
        for its processes.)"""
        self.kill()
        self.generation += 1
        self._pool = self._start()

    def kill(self) -> None:
        """Stop every process now (an interrupted run): nothing in the pool is waited for."""
        # Idempotent: a pool already shut down has forgotten its processes (None).
        for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError):
                proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)  # prompt: its processes are gone

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        self.progress.close()
        self.progress.join_thread()


def cpu_pool(processes: int) -> CpuPool:
    return CpuPool(processes)
