"""A job as one submission sees it: where workers find its class (a :class:`JobRef`,
with the digest of the source the client saw), and the class itself, imported and checked.

The client resolves a job once (``cmr run``, ``cmr.run``) and hands this value along to
everything that asks the class something (the mrjob arguments, the steps and their
partitions, the formats, side files, sampling for total order): nothing on the way reads,
hashes or imports the job file again. Workers load by reference in each of their pool
processes (:mod:`cmr.cpu.instances`), once per process too.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

from cmr.errors import UsageError
from cmr.job import Job, JobRef, load_job_class


@dataclass(frozen=True)
class LoadedJob:
    """A job's reference and its class, loaded (and checked: ``job.check_job_class``)."""

    ref: JobRef
    cls: type[Job]


def load_job(job: str | type[Job] | LoadedJob) -> LoadedJob:
    """The job, loaded once: a path/module string (``path.py[:Class]``,
    ``module[:Class]``), a class defined in a file (workers import it from there), or a job
    already loaded (returned as it is).

    Fails here, with the user's error (or a class that is no job), before anything is
    submitted."""
    if isinstance(job, LoadedJob):
        return job
    if isinstance(job, str):
        ref = JobRef.parse(job)
    else:
        src = inspect.getsourcefile(job)
        if src is None or not os.path.exists(src):
            raise UsageError(
                f"{job.__name__} is not defined in a file; workers import jobs "
                "from files, so put it in a .py file"
            )
        ref = JobRef.parse(f"{src}:{job.__name__}")
    return LoadedJob(ref, load_job_class(ref))
