"""The CPU pool a worker runs user code in: processes started at once (forks of a fork
server: cmr.poolstart), that die with the worker and can be restarted to stop a task that
overran its time limit."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

from cmr import poolstart, taskprogress

T = TypeVar("T")


def _start_child(channel: Any, environ: dict[str, str]) -> None:
    poolstart.leave_server()
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


def _die_with_parent() -> None:
    """Pool processes exit when the worker dies, even by SIGKILL (Linux): a fleet node
    whose main process is OOM-killed must not keep its pool processes running forever."""
    with contextlib.suppress(OSError, AttributeError):
        # The symbols already loaded into this process, libc's among them: find_library
        # would run `ldconfig -p` in a child process, once per pool process started.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)


def _noop() -> None:
    time.sleep(0.1)  # stay busy so every submit below starts a process of its own


class CpuPool(Executor):
    """A process pool for user code, started at once, that a worker can restart (to stop a
    task that overran its time limit), with the queue its processes report live counters on.

    Children load job code by reference, never from ``__main__``, so we hide the main
    module while they start: a user's script without an ``if __name__ == "__main__"``
    guard (or a notebook) would otherwise be re-run in every child.
    """

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._ctx = poolstart.context()  # a fork server's, where there is one
        self.progress: Any = self._ctx.Queue()
        self.generation = 0  # restarts so far: a task that ran in an older pool is not at fault
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        poolstart.ensure_server(self._ctx)
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
