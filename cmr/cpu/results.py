"""What a pool task hands back (MapResult, ReduceResult), and how whatever its body raises
becomes text in it: the method that raised and the user's own frames (:mod:`cmr.usercode`),
or the time limit's message. Errors are recorded in the job, never re-raised across the
process boundary.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cmr import counters, formats, usercode
from cmr.timelimit import TimeLimitExceeded, time_limit


class InputGone(formats.InputError):
    """A map task's input could not be read: no retry would read it (MapResult.permanent)."""


@dataclass
class MapResult:
    spool: str = ""  # msgpack stream of [partition, seq, records, body, spilled?]
    batches: list[int] = field(default_factory=list)  # per partition
    records: list[int] = field(default_factory=list)  # per partition
    records_in: int = 0
    bytes_in: int = 0
    error: str = ""  # "Type: message\ntraceback" when user code raised
    counters: counters.Flat = field(default_factory=dict)  # Job.increment_counter totals
    status: str = ""  # the last Job.set_status line
    permanent: bool = False  # the error is the input's (gone): the job fails at once


@dataclass
class ReduceResult:
    records_out: int = 0
    spills: int = 0
    # The output file's digest (cmr.digest), hashed as it was written; the commit names it.
    digest: str = ""
    error: str = ""
    counters: counters.Flat = field(default_factory=dict)
    status: str = ""


def take_counters(counted: Any, result: MapResult | ReduceResult) -> None:
    """The task's counters and status line into its result; a counter limit the task broke
    fails it, even if its code caught the error (its counters could not be kept whole)."""
    result.counters, result.status = counted.counts, counted.status
    if counted.error and not result.error:
        result.error = counted.error


def _timed_out(exc: TimeLimitExceeded) -> str:
    # The user's frames show where the code was stuck when the limit struck.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not usercode.ours(f.filename)]
    return f"TimeLimitExceeded: {exc}\n" + "".join(traceback.format_list(frames[-8:]))


@contextlib.contextmanager
def reported(result: MapResult | ReduceResult, limit_s: float, what: str) -> Iterator[None]:
    """Run a task's body under its time limit; whatever it raises becomes ``result.error``
    (what the user's code did wrong and its frames, or the time limit's message), never an
    exception out of the pool."""
    try:
        with time_limit(limit_s, what):
            yield
    except TimeLimitExceeded as exc:
        result.error = _timed_out(exc)
    except Exception as exc:
        result.error = usercode.describe(exc)
        if isinstance(exc, InputGone) and isinstance(result, MapResult):
            result.permanent = True
