"""Task time limits: user code that never returns is stopped, and the task counts as failed.

A task's limit is the job's ``task_timeout_s``, or when that is 0 a default that grows with
the bytes the task reads: ``BASE_S`` plus one second per ``BYTES_PER_S`` (a map of a 64 MiB
split gets about 22 minutes, far beyond any sane per-byte cost, yet an endless loop ends).

Two layers stop a task. In the pool process, SIGALRM raises :class:`TimeLimitExceeded` in the
user's code at the limit, so the error carries a traceback that shows where it was stuck.
Code that does not return to the interpreter (a C call that never ends, or one that blocks
the signal) is stopped by the worker: past the limit and a grace period it kills its pool's
processes and starts new ones (``cmr.api.CpuPool.restart``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

BASE_S = 300.0
BYTES_PER_S = 64 * 1024


def default_limit(nbytes: int) -> float:
    return BASE_S + nbytes / BYTES_PER_S


def task_limit(timeout_s: int, nbytes: int) -> float:
    """The time limit of a task that reads ``nbytes``, under a job's ``task_timeout_s``."""
    return float(timeout_s) if timeout_s > 0 else default_limit(nbytes)


def hard_limit(limit_s: float) -> float:
    """When the worker stops waiting for a task that ignored its SIGALRM."""
    return limit_s * 1.1 + 10.0


class TimeLimitExceeded(BaseException):
    """Raised in user code at its time limit. A BaseException, so that user code catching
    ``Exception`` does not swallow it and run on."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeLimitExceeded in this (main) thread after ``seconds``; 0: no limit."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded(
            f"{what} ran past its time limit of {seconds:.0f} s (the job's code did not "
            f"return; give the job more with --task-timeout SECONDS if it needs it)"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
