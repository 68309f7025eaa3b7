"""Every error cmr raises on purpose.

    CmrError                      root: catch this to catch everything below
    ├── UsageError                the user asked for something impossible (bad path, bad flag)
    ├── JobCodeError              loading or running the user's job class failed
    ├── JobFailed                 a job ended in the FAILED state (carries the recorded reason)
    ├── BackendError              a cloud service (or its embedded stand-in) failed
    │   ├── Unreachable           endpoint down or no credentials: nothing we can retry
    │   ├── Throttled             the service asked us to slow down
    │   ├── QueueGone             the queue was deleted (the job was finished or cleaned up)
    │   ├── ConditionFailed       a conditional write lost; the caller decides what that means
    │   ├── BlobMissing           no blob at that URL
    │   └── Rejected              the service refused the request as invalid (an item over
    │                             400 KB, a bad name): retrying the same request cannot help
    ├── WireError                 a message or record failed validation (never a crash)
    └── TaskError                 a task cannot succeed however often it is retried (its input
                                  vanished or is unreadable): the job fails at once

Service exceptions are translated into these at the backend edge (``raise ... from exc``),
so the engine never sees botocore's types.
"""

from __future__ import annotations


class CmrError(Exception):
    """Root of every error cmr raises on purpose."""


class UsageError(CmrError):
    """The request cannot be carried out as given; the message says what to change."""


class JobCodeError(CmrError):
    """The user's job file could not be loaded or its code raised."""


class JobFailed(CmrError):
    """A job ended FAILED; ``reason`` is what the job record says, traceback included."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason


class BackendError(CmrError):
    """A queue, blob store or table call failed."""


class Unreachable(BackendError):
    """The service cannot be reached or will not let us in."""


class Throttled(BackendError):
    """The service refused the call because of load; try again later."""


class QueueGone(BackendError):
    """The queue no longer exists, usually because its job finished."""


class ConditionFailed(BackendError):
    """A conditional table write found the condition false."""


class WireError(CmrError):
    """Bytes that are not a valid cmr message or record."""


class BlobMissing(BackendError):
    """No blob at that URL."""


class Rejected(BackendError):
    """The service refused the request itself (validation, size limits): not transient."""


class TaskError(CmrError):
    """A permanent task failure: retrying it elsewhere would fail the same way."""
