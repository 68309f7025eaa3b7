"""Task time limits: user code that never returns is stopped, and the task counts as failed.

A task's limit is the job's ``task_timeout_s``, or when that is 0 a default that grows with
the bytes the task reads: ``BASE_S`` plus one second per ``BYTES_PER_S`` (a map of a 64 MiB
split gets about 22 minutes, far beyond any sane per-byte cost, yet an endless loop ends).

Two layers stop a task. In the pool process, SIGALRM raises :class:`TimeLimitExceeded` in the
user's code at the limit, so the error carries a traceback that shows where it was stuck.
Code that does not return to the interpreter (a C call that never ends, or one that blocks
the signal) is stopped by the worker: past the limit and a grace period it kills its pool's
processes and starts new ones (``cmr.api.CpuPool.restart``).

Time a task spends blocked on the store is not its code's: a reduce writing its output
into the pipe its worker uploads from (cmr.poolpipe) waits while the store is slow, and
that wait (:func:`paused`) moves the limit on by as long. The worker's hard limit moves on
by the time its end of the pipe went unread while full (``Runtime.cpu``'s ``stalled``).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

BASE_S = 300.0
BYTES_PER_S = 64 * 1024
FORGIVE_MIN_S = BASE_S  # the least waiting on the store a limit forgives (forgiven)


class _Running:
    """The limit running in this process's main thread, if one is: when it strikes, since
    when a pause holds it, and how much waiting on the store it may still forgive."""

    deadline: float | None = None  # time.monotonic()
    paused_at: float | None = None
    forgive_s: float = 0.0


_running = _Running()


def default_limit(nbytes: int) -> float:
    return BASE_S + nbytes / BYTES_PER_S


def task_limit(timeout_s: int, nbytes: int) -> float:
    """The time limit of a task that reads ``nbytes``, under a job's ``task_timeout_s``."""
    return float(timeout_s) if timeout_s > 0 else default_limit(nbytes)


def hard_limit(limit_s: float) -> float:
    """When the worker stops waiting for a task that ignored its SIGALRM."""
    return limit_s * 1.1 + 10.0


def forgiven(limit_s: float, waited_s: float) -> float:
    """How much of ``waited_s`` on the store a task's limit forgives: as much again as the
    limit, and at least FORGIVE_MIN_S (a short --task-timeout is about the job's code, not
    the store's moods), no more: a store too slow to take a task's output ends it too."""
    return min(waited_s, max(limit_s, FORGIVE_MIN_S))


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
        if _running.paused_at is not None:
            # Blocked on the store, not in the job's code: only past what may be forgiven
            # does the limit strike; the pause's end sets the time left. The interrupted
            # call resumes (PEP 475).
            deadline = _running.deadline or 0.0  # set while the limit runs
            left = deadline + _running.forgive_s - time.monotonic()
            if left > 0:
                signal.setitimer(signal.ITIMER_REAL, left)
                return
            raise TimeLimitExceeded(
                f"{what} waited on the store for {forgiven(seconds, math.inf):.0f} s beyond "
                f"its time limit of {seconds:.0f} s (writing its output: the store took it too "
                "slowly; if it is only busy, give the job more with --task-timeout SECONDS)"
            )
        raise TimeLimitExceeded(
            f"{what} ran past its time limit of {seconds:.0f} s (the job's code did not "
            f"return; give the job more with --task-timeout SECONDS if it needs it)"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    _running.deadline = time.monotonic() + seconds
    _running.paused_at, _running.forgive_s = None, forgiven(seconds, math.inf)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _running.deadline = _running.paused_at = None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The time spent in here (a write that waits for the store) does not count against the
    running limit, if one runs in this thread: the limit strikes that much later, up to
    :func:`forgiven` in all."""
    if (
        _running.deadline is None
        or _running.paused_at is not None
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    _running.paused_at = time.monotonic()
    struck = False
    try:
        yield
    except TimeLimitExceeded:
        struck = True  # past what may be forgiven: nothing is left to re-arm
        raise
    finally:
        now = time.monotonic()
        if _running.deadline is not None and _running.paused_at is not None:
            waited = min(now - _running.paused_at, _running.forgive_s)
            _running.forgive_s -= waited
            _running.deadline += waited
            if not struck:
                signal.setitimer(signal.ITIMER_REAL, max(_running.deadline - now, 0.001))
        _running.paused_at = None
