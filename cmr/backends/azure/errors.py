"""The one reading of Azure Storage errors (azure-core's exceptions) into :mod:`cmr.errors`.

As :mod:`cmr.backends.aws.errors` reads botocore's: :func:`translated` builds our error,
keeping the service (``blob``, ``queue``), the operation and Azure's error code (the
``x-ms-error-code`` header, which the storage SDKs put on ``error_code``) on it;
:func:`translate` re-raises inside a ``with`` block. By class first, then by code and status:

    ServiceRequestError, refused or no host    Unreachable: nothing listens there
    other ServiceRequestError, ServiceResponseError (a connection lost, an answer cut short,
                                               a timeout)  BackendError: transient, retried
    ClientAuthenticationError, 401 / 403       Unreachable: the key, the SAS or the clock
    503 ServerBusy, 500 OperationTimedOut ...  Throttled: the service asks us to slow down
    other 5xx                                  BackendError: transient
    412 ConditionNotMet, BlobAlreadyExists     ConditionFailed (If-Match / If-None-Match: *)
    QueueNotFound / QueueBeingDeleted          QueueGone
    BlobNotFound                               BlobMissing
    ContainerNotFound, TableNotFound           BucketOrTableMissing: an answer, never retried
    RequestBodyTooLarge, InvalidXmlDocument... Rejected: the same request fails the same way
    anything else                              BackendError

The SDK retries first (:data:`cmr.backends.azure.clients.RETRY`), the engine's Retry
middleware after it, as botocore's retry modes come before it on the aws backend.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
)

from cmr.errors import (
    BackendError,
    BlobMissing,
    BucketOrTableMissing,
    ConditionFailed,
    QueueGone,
    Rejected,
    Throttled,
    Unreachable,
)

# Azure's "slow down" (Azure Storage's scalability targets: 503 ServerBusy, 500
# OperationTimedOut); retried by the engine like SQS's and S3's throttling.
THROTTLING = {"ServerBusy", "OperationTimedOut", "TooManyRequests"}
CONDITION_FAILED = {"ConditionNotMet", "BlobAlreadyExists", "TargetConditionNotMet"}
QUEUE_GONE = {"QueueNotFound", "QueueBeingDeleted", "QueueDisabled"}
BLOB_MISSING = {"BlobNotFound", "CannotVerifyCopySource"}
CONTAINER_MISSING = {"ContainerNotFound", "ContainerBeingDeleted"}
DENIED = {
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "InsufficientAccountPermissions",
    "AccountIsDisabled",
}
REJECTED = {
    "RequestBodyTooLarge",
    "InvalidXmlDocument",
    "InvalidInput",
    "InvalidQueryParameterValue",
    "InvalidHeaderValue",
    "InvalidResourceName",
    "InvalidUri",
    "InvalidBlockList",
    "InvalidBlobOrBlock",
    "OutOfRangeInput",
    "OutOfRangeQueryParameterValue",
    "UnsupportedHeader",
    "MessageTooLarge",
    "EntityTooLarge",
    "PropertyValueTooLarge",
    "KeyValueTooLarge",
    "TooManyProperties",
    "PropertiesNeedValue",
    "InvalidDuplicateRow",
}
TABLE_MISSING = {"TableNotFound", "TableBeingDeleted"}
_SETTING_HINT = (
    "set AZURE_STORAGE_CONNECTION_STRING "
    '(for the local stack\'s Azurite: eval "$(scripts/stack.sh env)")'
)


def error_code(exc: BaseException) -> str:
    """Azure's error code of a storage failure (``x-ms-error-code``); "" for anything else.
    The storage SDKs give it as a StorageErrorCode (a str enum), or as the bare string."""
    code = getattr(exc, "error_code", None)
    if code is None:
        return ""
    return str(getattr(code, "value", code))


def http_status(exc: BaseException) -> int:
    return int(getattr(exc, "status_code", None) or 0) if isinstance(exc, HttpResponseError) else 0


def _nobody_there(exc: BaseException) -> bool:
    """A connection refused, or a host that does not resolve, somewhere in the causes
    (azure-core keeps aiohttp's error as ``inner_exception``, which keeps the OSError)."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError | socket.gaierror):
            return True
        todo += [getattr(e, n, None) for n in ("inner_exception", "os_error", "__cause__")]
    return False


def _judged(service: str, exc: BaseException, subject: str) -> tuple[type[BackendError], str]:
    """The class and the one-line message of our error for an azure-core failure."""
    about = f" ({subject})" if subject else ""
    if isinstance(exc, ServiceRequestTimeoutError):
        return BackendError, f"{service} is slow: no connection in time{about}"
    if isinstance(exc, ServiceRequestError) and _nobody_there(exc):
        # Refused, or no such host: nothing we can retry (as botocore's refused endpoint).
        return Unreachable, (
            f"cannot reach Azure {service} storage{about}: {exc.message}; is the endpoint in "
            "AZURE_STORAGE_CONNECTION_STRING right (for Azurite: is the local stack running? "
            "`scripts/stack.sh start`)?"
        )
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        # A connection lost on the way, or an answer cut short: transient, retried.
        return BackendError, f"{service}: no complete exchange{about}: {exc.message}"
    if isinstance(exc, ClientAuthenticationError) and not http_status(exc):
        return Unreachable, f"no usable Azure credentials for {service}: {_SETTING_HINT}"
    if not isinstance(exc, HttpResponseError):
        return BackendError, f"{service}: {exc}{about}"
    code = error_code(exc)
    status = http_status(exc)
    message = (exc.reason or code or str(status)).strip()
    what = f"{code or status}: {message}"
    if code in THROTTLING or status == 503:
        return Throttled, f"{service} throttled{about}: {what}"
    if code in DENIED or status in (401, 403) or isinstance(exc, ClientAuthenticationError):
        return Unreachable, (
            f"{service} access denied{about}: {what}; check the account key or SAS in "
            "AZURE_STORAGE_CONNECTION_STRING (and the clock: a signature is valid 15 minutes)"
        )
    if service == "queue" and code in QUEUE_GONE:
        return QueueGone, f"queue {subject or '?'} does not exist"
    if code in CONDITION_FAILED or status == 412 or isinstance(exc, ResourceModifiedError):
        return ConditionFailed, f"precondition failed on {subject or '?'}"
    # A 400 without a code is a request the service will refuse again (Azurite gives some
    # codes, an over-long key's among them, in the body only).
    if code in REJECTED or status == 413 or (status == 400 and not code):
        return Rejected, f"{service} rejected{about}: {what}"
    if code in CONTAINER_MISSING:
        return (
            BucketOrTableMissing,
            f"{service}: container does not exist{about}: create it, or name one that does",
        )
    if code in TABLE_MISSING:
        return (
            BucketOrTableMissing,
            f"{service}: table does not exist{about}: create it, or name one that does",
        )
    if service == "blob" and code in BLOB_MISSING:
        return BlobMissing, f"no blob at {subject or '?'}"
    if isinstance(exc, ResourceExistsError):
        return BackendError, f"{service}: already exists{about}: {what}"
    return BackendError, f"{service} failed{about}: {what} (HTTP {status})"


def classify(service: str, exc: BaseException) -> type[BackendError]:
    """Which :mod:`cmr.errors` class an azure-core failure of ``service`` is."""
    return _judged(service, exc, "")[0]


def translated(
    service: str, exc: BaseException, subject: str = "", operation: str = ""
) -> BackendError:
    """Our error for an azure-core failure; ``subject`` names the queue or URL involved."""
    cls, message = _judged(service, exc, subject)
    return cls(message, service=service, operation=operation, code=error_code(exc))


@contextmanager
def translate(service: str, subject: str = "", operation: str = "") -> Iterator[None]:
    """Re-raise azure-core's exceptions as ours, like httpx's ``map_httpcore_exceptions``."""
    try:
        yield
    except AzureError as exc:
        raise translated(service, exc, subject, operation) from exc
