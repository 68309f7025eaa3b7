"""cmr: a masterless Cloud MapReduce for Python.

The engine, in the order a job goes (DESIGN.md's "the job, step by step"):

    split      cut the input into record-aligned splits
    submit     check, plan, create the queues, make the job exist (one transaction)
    mapper     run a map task, send tagged batches, commit the attempt
    claim      claim a partition: one owner, fenced by token and epoch
    reducer    drain, keep the winners' batches, reduce, commit the partition
    lifecycle  the job's state changes; finalize and publish: finishing a job, which any
               worker does; janitor: the duties any worker takes (cleanup, repair)
    watch      progress, waiting, fetching output home: only reads

Around it: ``worker`` (the loop every worker runs), ``backends`` (the three services, the
middleware seam), ``cli`` (the commands), ``fleet`` and ``loadgen``.

Names load lazily: a job file's ``import cmr`` (in every pool process) pulls in only what
``cmr.Job`` needs, not the client, the SDKs or the terminal UI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cmr.errors import CmrError, JobFailed, UsageError
from cmr.job import Job, Step

if TYPE_CHECKING:
    from cmr.api import RunOptions, RunResult, run, run_async

__all__ = [
    "CmrError",
    "Job",
    "JobFailed",
    "RunOptions",
    "RunResult",
    "Step",
    "UsageError",
    "run",
    "run_async",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("RunOptions", "RunResult", "run", "run_async"):
        return getattr(importlib.import_module("cmr.api"), name)
    raise AttributeError(f"module 'cmr' has no attribute {name!r}")
