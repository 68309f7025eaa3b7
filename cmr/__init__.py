"""cmr: a masterless Cloud MapReduce for Python.

Names load lazily: a job file's ``import cmr`` (in every pool process) pulls in only what
``cmr.Job`` needs, not the client, the SDKs or the terminal UI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cmr.errors import CmrError, JobFailed, UsageError
from cmr.job import Job

if TYPE_CHECKING:
    from cmr.api import RunOptions, RunResult, run, run_async

__all__ = [
    "CmrError",
    "Job",
    "JobFailed",
    "RunOptions",
    "RunResult",
    "UsageError",
    "run",
    "run_async",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("RunOptions", "RunResult", "run", "run_async"):
        return getattr(importlib.import_module("cmr.api"), name)
    raise AttributeError(f"module 'cmr' has no attribute {name!r}")
