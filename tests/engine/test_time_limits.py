"""A task's time limit in its pool process (cmr.timelimit): what it counts and what it
forgives. Run here in the test's main thread, where SIGALRM is delivered as in a pool
process."""

from __future__ import annotations

import time

import pytest

from cmr import timelimit
from cmr.timelimit import TimeLimitExceeded, paused, time_limit


def _task(limit_s: float, waited_s: float, worked_s: float, what: str = "reduce") -> None:
    """A task under ``limit_s`` that waits ``waited_s`` on the store (a write into its full
    pipe), then works ``worked_s``."""
    with time_limit(limit_s, what):
        with paused():
            time.sleep(waited_s)  # interrupted by SIGALRM, and resumed (PEP 475)
        time.sleep(worked_s)


def test_time_waiting_on_the_store_moves_the_limit_on() -> None:
    """1.5 s waited inside ``paused`` and 0.3 s of work fit a 1 s limit: the wait is not
    the code's, and the signal that comes during it does not stop the wait."""
    _task(1.0, 1.5, 0.3)


def test_work_past_the_limit_still_strikes_after_a_pause() -> None:
    """The limit moves on by the wait, no further: work that then runs past it is stopped,
    as the job code's."""
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded, match="the job's code did not return"):
        _task(1.0, 0.5, 5)
    assert 1.4 < time.monotonic() - started < 2.5


def test_a_store_that_never_takes_the_output_ends_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Waiting is forgiven up to the limit again (here, with its floor of 300 s lowered),
    no more: a write that never returns is stopped with the store named as the cause."""
    monkeypatch.setattr(timelimit, "FORGIVE_MIN_S", 0.0)
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded, match="waited on the store for 1 s beyond its"):
        _task(1.0, 10, 0, "reduce of partition 3")
    assert 1.9 < time.monotonic() - started < 3.0
