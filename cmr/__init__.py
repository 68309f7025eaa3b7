"""cmr: a masterless Cloud MapReduce for Python."""

from cmr.api import RunResult, run, run_async
from cmr.errors import CmrError, JobFailed, UsageError
from cmr.job import Job

__all__ = ["CmrError", "Job", "JobFailed", "RunResult", "UsageError", "run", "run_async"]
__version__ = "0.1.0"
