"""Live counters from user code in pool processes to the job record.

User code runs in pool processes, far from the event loop that talks to the table. A job
calls ``self.progress(ops=120, errors=3)`` (increments); the counters travel through a
multiprocessing queue to the worker, which folds them into the job record about once a
second as ``c_<name>``, where ``cmr status`` and progress displays read them. Best effort:
counters are for watching a job, never for deciding anything.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
PREFIX = "c_"

_channel: Any = None  # a multiprocessing queue, set in each pool process
_job: str | None = None  # the job whose task this process is running


def attach(channel: Any) -> None:
    global _channel  # noqa: PLW0603 - one channel per pool process, set at its start
    _channel = channel


@contextlib.contextmanager
def running(job_id: str) -> Iterator[None]:
    """Counters reported inside go to ``job_id``, and to no job once the task is over: a
    process that ran another job's task before must never credit that job (a pool process
    runs one task at a time, of whichever job)."""
    global _job  # noqa: PLW0603 - a pool process runs one task at a time
    _job = job_id
    try:
        yield
    finally:
        _job = None


def report(**counters: int) -> None:
    if _channel is None or _job is None:
        return
    clean = {k: int(v) for k, v in counters.items() if _NAME.match(k) and v}
    if clean:
        _channel.put((_job, clean))
