"""Every error cmr raises on purpose.

    CmrError                      root: catch this to catch everything below
    ├── UsageError                the user asked for something impossible (bad path, bad flag,
    │                             a setting out of range): the message says what to change
    │   └── StoreMissing          the store's bucket (container) or table is missing, and may
    │                             not be created here (`cmr status`)
    ├── NotFound                  something named at run time is not there (a job id, a job's
    │                             results, a load test's queue)
    ├── JobCodeError              loading or running the user's job class failed
    ├── JobFailed                 a job ended in the FAILED state (carries the recorded reason)
    ├── WorkersGone               every worker process a command started exited before its
    │                             job ended (the job itself may still be finished by others)
    ├── BackendError              a cloud service (or its embedded stand-in) failed; carries
    │   │                         ``service``, ``operation`` and the service's ``code``
    │   ├── Unreachable           endpoint down or no credentials: nothing we can retry
    │   ├── Throttled             the service asked us to slow down
    │   │   └── sim.ServiceUnavailable    the load test's simulated store is over capacity
    │   ├── QueueGone             the queue was deleted (the job was finished or cleaned up)
    │   ├── ConditionFailed       a conditional write lost; the caller decides what that means
    │   │   └── sim.ConditionalCheckFailed  ... in the simulated store (with its version)
    │   ├── BlobMissing           no blob at that URL
    │   ├── BucketOrTableMissing  the bucket or table itself does not exist (a typo, or
    │   │                         deleted): an answer, not a hiccup, so never retried
    │   ├── Rejected              the service refused the request as invalid (an item over
    │   │                         400 KB, a bad name): retrying the same request cannot help
    │   └── loadgen.targets.OpFailed  one load-test operation failed; ``kind`` is its column
    │                             in the jam report (throttled, unavailable, timeout, ...)
    ├── FleetError                ``cmr fleet`` cannot go on (a stack in a bad state, no
    │                             default VPC, the wheel did not build)
    ├── WireError                 a message or record failed validation (never a crash)
    ├── JobRefused                a worker will not serve a job whose record asks for what its
    │                             configuration does not allow (code, output, scratch)
    ├── TaskError                 a task cannot succeed however often it is retried (its input
    │                             vanished or is unreadable): the job fails at once
    ├── publish.OutputConflict    the output place holds something that is not ours
    ├── runtime.PoolRestarted     the worker's process pool was replaced under a task
    └── runtime.TaskTimedOut      a task ran past its time limit

Not errors but signals, so outside the tree on purpose: ``runtime.WorkerCrashed`` (a pool
process died: the pool is rebuilt), ``timelimit.TimeLimitExceeded`` (a BaseException, so
that user code's ``except Exception`` cannot swallow it) and ``cli.Interrupted`` (Ctrl-C).

Service exceptions are translated into these at the backend edge (``raise ... from exc``,
see :mod:`cmr.backends.aws.errors`), so the engine never sees botocore's types; the
service's own error code stays on the error as ``code``. This module imports nothing heavy:
``cmr run`` on the embedded backend must not load botocore.
"""

from __future__ import annotations


class CmrError(Exception):
    """Root of every error cmr raises on purpose."""


class UsageError(CmrError):
    """The request cannot be carried out as given; the message says what to change."""


class StoreMissing(UsageError):
    """The store's bucket (container) or table is missing and this opening may not create
    it: the caller knows best what the user should do about it (``cmr status`` never
    creates anything). ``kind``: "bucket", "container" or "table"."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.name = kind, name


class NotFound(CmrError):
    """Something the command names does not exist (any more) when it is looked up."""


class WorkersGone(CmrError):
    """The worker processes a command started have all exited while their job runs on."""


class JobCodeError(CmrError):
    """The user's job file could not be loaded or its code raised."""


class JobFailed(CmrError):
    """A job ended FAILED; ``reason`` is what the job record says, traceback included."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason


class BackendError(CmrError):
    """A queue, blob store or table call failed.

    ``service`` (``sqs``, ``s3``, ``dynamodb`` ...), ``operation`` (``ReceiveMessage``) and
    ``code`` (the service's error code, ``ConditionalCheckFailedException``) say which call
    failed how, when the failure came from a service; they are empty otherwise."""

    def __init__(
        self, message: str = "", *, service: str = "", operation: str = "", code: str = ""
    ) -> None:
        super().__init__(message)
        self.service = service
        self.operation = operation
        self.code = code


class Unreachable(BackendError):
    """The service cannot be reached or will not let us in."""


class Throttled(BackendError):
    """The service refused the call because of load; try again later."""


class QueueGone(BackendError):
    """The queue no longer exists, usually because its job finished."""


class ConditionFailed(BackendError):
    """A conditional table write found the condition false."""


class BlobMissing(BackendError):
    """No blob at that URL."""


class BucketOrTableMissing(BackendError):
    """The bucket or the table a call named does not exist."""


class Rejected(BackendError):
    """The service refused the request itself (validation, size limits): not transient."""


class FleetError(CmrError):
    """``cmr fleet`` cannot go on; the message is meant for the user."""


class JobRefused(CmrError):
    """A worker will not serve a job: its code, input, output, scratch or queue prefix lies
    outside what the worker was configured to run (``cmr worker --jobs-from``,
    ``--inputs-under``, ``--outputs-under``, its store)."""


class WireError(CmrError):
    """Bytes that are not a valid cmr message or record."""


class TaskError(CmrError):
    """A permanent task failure: retrying it elsewhere would fail the same way."""
