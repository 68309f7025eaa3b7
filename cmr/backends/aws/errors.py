"""The one reading of AWS service errors, for the engine's backend, ``cmr fleet`` and the
load generator.

:func:`classify` says which :mod:`cmr.errors` class a botocore failure is; :func:`translated`
builds that error, keeping the service, the operation and the service's error code on it;
:func:`translate` re-raises inside a ``with`` block, like httpx's ``map_httpcore_exceptions``.
:func:`service_fault` separates a service failing on its side (a 5xx) from one asking us to
slow down, which the engine retries alike but the load generator counts apart.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
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

# The service asks us to slow down (SQS's OverLimit: too many messages in flight).
THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "SlowDown",
    "OverLimit",
    "AWS.SimpleQueueService.RequestThrottled",
}
# The service failed on its side; any 5xx status says the same.
SERVER_FAULT = {
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
}
# Retried like throttling by the engine: the service is busy, not broken.
_BUSY = THROTTLING | {"ServiceUnavailable"}
QUEUE_GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
DENIED = {
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidSecurity",
    "MissingAuthenticationToken",
    "AuthFailure",
}
BLOB_MISSING = {"NoSuchKey", "404", "NotFound"}
# The request itself is wrong: the same request will fail the same way.
REJECTED = {
    "ValidationException",
    "SerializationException",
    "ItemCollectionSizeLimitExceededException",
    "EntityTooLarge",
    "InvalidArgument",
    "KeyTooLongError",
    "InvalidObjectState",
}
# A conditional write found its condition false: DynamoDB's, S3's If-Match / If-None-Match,
# and SimpleDB's Expected (reported either way).
CONDITION_FAILED = {
    "ConditionalCheckFailedException",
    "ConditionalCheckFailed",
    "AttributeDoesNotExist",
    "PreconditionFailed",
    "412",
}
_CREDENTIALS_HINT = (
    "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    '(for the local stack: eval "$(scripts/stack.sh env)")'
)


def error_code(exc: BaseException) -> str:
    """The service's error code of a botocore failure; "" for anything else."""
    if not isinstance(exc, ClientError):
        return ""
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_codes(exc: BaseException) -> set[str]:
    """The code and, on SQS's JSON protocol, the older query-protocol code beside it."""
    if not isinstance(exc, ClientError):
        return set()
    error = exc.response.get("Error", {})
    return {str(error.get("Code", "")), str(error.get("QueryErrorCode", ""))} - {""}


def http_status(exc: BaseException) -> int:
    if not isinstance(exc, ClientError):
        return 0
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def service_fault(exc: BaseException) -> bool:
    """The service failed on its side (a 5xx, InternalError ...), rather than throttling us."""
    codes = error_codes(exc)
    if codes & THROTTLING:
        return False
    return bool(codes & SERVER_FAULT) or http_status(exc) >= 500


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _look_at(url: str, slow: bool) -> str:
    if _is_loopback(url):
        if slow:
            return "; the local stack is busy or stalled (`scripts/stack.sh status`, `... logs`)"
        return "; is the local stack running? start it with `scripts/stack.sh start`"
    return (
        "; check the endpoint (AWS_ENDPOINT_URL*, the profile's endpoint_url), the region, "
        "the credentials and the network"
    )


def down_message(services: str, url: str, why: str) -> str:
    """Nothing answers at ``url`` (refused, no such host, no route): said at once."""
    return f"cannot reach {services} at {url}: {why}{_look_at(url, slow=False)}"


def slow_message(services: str, url: str, what: str, seconds: float) -> str:
    """``url`` accepts connections or answers too slowly: said after waiting ``seconds``."""
    return (
        f"{services} at {url} is slow, not down: {what} within {seconds:g} s"
        f"{_look_at(url, slow=True)}; try again when it answers"
    )


def _why_down(exc: EndpointConnectionError) -> str:
    # aiobotocore keeps aiohttp's error: refused and unresolved both arrive as this class
    error = exc.kwargs.get("error")
    cause = getattr(error, "os_error", None) or error
    if isinstance(cause, ConnectionRefusedError):
        return "nothing is listening there"
    if isinstance(cause, socket.gaierror):
        return "its host does not resolve"
    return "no connection"


def _judged(service: str, exc: BaseException, subject: str) -> tuple[type[BackendError], str]:
    """The class and the one-line message of our error for a botocore failure."""
    about = f" ({subject})" if subject else ""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        whose = f" for {service}" if service != "aws" else ""  # fleet's calls span services
        return Unreachable, f"no usable AWS credentials{whose}: {_CREDENTIALS_HINT}"
    if isinstance(exc, EndpointConnectionError):
        url = str(exc.kwargs.get("endpoint_url", "?"))
        return Unreachable, down_message(service, url, _why_down(exc))
    if isinstance(exc, ConnectTimeoutError | ReadTimeoutError):
        # Retried like any service fault: slow is not down.
        url = str(exc.kwargs.get("endpoint_url", "?"))
        what = "no connection" if isinstance(exc, ConnectTimeoutError) else "no answer"
        return BackendError, f"{service} at {url} is slow: {what} in time{about}"
    if isinstance(exc, ProfileNotFound):
        return Unreachable, f"{exc}: fix AWS_PROFILE or the cmr profile setting"
    if not isinstance(exc, ClientError):
        return BackendError, f"{service}: {exc}{about}"
    code = error_code(exc)
    codes = error_codes(exc)
    op = exc.operation_name
    message = exc.response.get("Error", {}).get("Message") or code
    if codes & _BUSY or http_status(exc) == 503:
        return Throttled, f"{service}.{op} throttled{about}: {message}"
    if code in DENIED:
        owner = (
            ", and that the bucket belongs to the store's owner= account (ExpectedBucketOwner)"
            if service == "s3"
            else ""
        )
        return Unreachable, (
            f"{service}.{op} access denied{about}: {message}; check the credentials and "
            f"the IAM policy{owner}"
        )
    if service == "sqs" and codes & QUEUE_GONE:
        return QueueGone, f"queue {subject or '?'} does not exist"
    if code == "TransactionCanceledException":
        reasons = [str(r.get("Code", "")) for r in exc.response.get("CancellationReasons", [])]
        if "ConditionalCheckFailed" in reasons:
            return ConditionFailed, f"transaction cancelled: a condition failed ({subject})"
        if "ValidationError" in reasons or "ItemCollectionSizeLimitExceeded" in reasons:
            return Rejected, f"{service}.{op} rejected{about}: {', '.join(reasons)}"
        return Throttled, f"{service}.{op} conflicted{about}: {', '.join(reasons)}"
    if code == "TransactionInProgressException":
        return Throttled, f"{service}.{op}: the same transaction is in progress{about}"
    if codes & CONDITION_FAILED or http_status(exc) == 412:
        what = "precondition" if service == "s3" else "condition"
        return ConditionFailed, f"{what} failed on {subject or '?'}"
    if code in REJECTED:
        return Rejected, f"{service}.{op} rejected{about}: {code}: {message}"
    if service == "s3" and code in BLOB_MISSING:
        return BlobMissing, f"no blob at {subject or '?'}"
    if code == "NoSuchBucket":
        return (
            BucketOrTableMissing,
            f"s3.{op}: bucket does not exist{about}: create it, or name one that does",
        )
    if code == "ResourceNotFoundException" and service == "dynamodb":
        return BucketOrTableMissing, f"{service}.{op}: table does not exist{about}: {message}"
    return BackendError, f"{service}.{op} failed{about}: {code}: {message}"


def classify(service: str, exc: BaseException) -> type[BackendError]:
    """Which :mod:`cmr.errors` class a botocore failure of ``service`` is."""
    return _judged(service, exc, "")[0]


def translated(service: str, exc: BaseException, subject: str = "") -> BackendError:
    """Our error for a botocore failure; ``subject`` names the queue, URL or key involved."""
    cls, message = _judged(service, exc, subject)
    operation = exc.operation_name if isinstance(exc, ClientError) else ""
    return cls(message, service=service, operation=operation, code=error_code(exc))


@contextmanager
def translate(service: str, subject: str = "") -> Iterator[None]:
    """Re-raise botocore's exceptions as ours, like httpx's ``map_httpcore_exceptions``."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise translated(service, exc, subject) from exc
