"""What every target shares: the protocol, its reply, and the jam report's error classes.

Every failure leaves a target as :class:`OpFailed` carrying one of the jam report's error
classes, translated at this edge so the driver never sees botocore's types. The classes are
read from cmr's one classification of service errors (:mod:`cmr.backends.aws.errors`, which
the engine and ``cmr fleet`` use too; :mod:`cmr.backends.azure.errors` for the Azure
targets, :mod:`cmr.loadgen.targets.azure`):

    throttled           the service asked us to slow down: DynamoDB
                        ProvisionedThroughputExceeded / Throttling / RequestLimitExceeded,
                        S3 503 SlowDown, SQS RequestThrottled / OverLimit, Azure 503
                        ServerBusy / 500 OperationTimedOut
    unavailable         any other 5xx: ServiceUnavailable (SimpleDB's 503 under load, seed 000),
                        InternalServerError; and the simulated store over capacity, which
                        models exactly that SimpleDB 503
    timeout             connect or read timeouts (botocore's, azure-core's, aiohttp's, asyncio's)
    conditional_failed  a conditional write whose condition was false (Azure: 412, or 409 on
                        a create-only write)
    other               everything else (connection refused, a missing table, bad input)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from cmr.errors import BackendError, ConditionFailed, Throttled
from cmr.loadgen.sim import ConditionalCheckFailed, ServiceUnavailable

if TYPE_CHECKING:
    from cmr.loadgen.spec import Retries

ErrorClass = Literal["throttled", "unavailable", "timeout", "conditional_failed", "other"]
ERROR_CLASSES: tuple[ErrorClass, ...] = (
    "throttled",
    "unavailable",
    "timeout",
    "conditional_failed",
    "other",
)
Condition = Literal["absent", "version"]

VALUE = "v"  # the attribute holding the value
VERSION = "ver"  # the attribute version conditions test
NEVER = "cmr_never"  # the fictitious attribute of "absent" conditions: never written
KEY = "k"  # the DynamoDB table's hash key


class OpFailed(BackendError):
    """One operation failed; ``kind`` is its error class, ``retries`` the SDK retries spent,
    ``response`` the service's error reply (a failed DynamoDB condition's ALL_OLD item)."""

    def __init__(
        self,
        kind: ErrorClass,
        detail: str,
        retries: int = 0,
        *,
        service: str = "",
        operation: str = "",
        code: str = "",
        response: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{kind}: {detail}", service=service, operation=operation, code=code)
        self.kind: ErrorClass = kind
        self.retries = retries
        self.response: Mapping[str, Any] = response or {}


@dataclass(frozen=True, slots=True)
class Reply:
    value: int | None = None  # what a get saw (None: nothing yet); unused for puts
    retries: int = 0


class Target(Protocol):
    """A store under load. ``setup`` before the first call, ``close`` after the last."""

    name: str
    consistent_reads: bool  # False: get(consistent=True) is the same call as an eventual one
    conditional_writes: bool  # False: put(conditional=True) is the same call as a plain one
    time_scale: float  # model seconds per loop second (the simulated store may run fast)

    async def setup(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, key: str, consistent: bool = False) -> Reply: ...

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply: ...


class ClientTarget:
    """A cloud target: one service client for its life, opened from a task's options (its
    resources, SDK retry choice, concurrent operators and timeouts). The AWS and Azure
    targets are its kinds."""

    service: ClassVar[str]
    name: str
    consistent_reads = False
    conditional_writes = False
    time_scale = 1.0

    def __init__(
        self,
        resources: Mapping[str, str],
        *,
        retries: Retries = "off",
        connections: int = 10,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
    ) -> None:
        self.resources = dict(resources)
        self._retries = retries
        self._connections = max(1, connections)
        self._timeouts = (connect_timeout, read_timeout)
        self._client: Any = None


def _retries_of(response: Mapping[str, Any]) -> int:
    return int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


def error_class(service: str, exc: BaseException) -> ErrorClass:
    """The jam report's class of an azure-core failure (see the module notes)."""
    from azure.core.exceptions import ServiceRequestTimeoutError, ServiceResponseTimeoutError

    from cmr.backends.azure.errors import classify, http_status

    if isinstance(exc, ServiceRequestTimeoutError | ServiceResponseTimeoutError):
        return "timeout"
    if isinstance(getattr(exc, "inner_exception", None), TimeoutError):
        return "timeout"  # aiohttp's read timeout, kept under a ServiceResponseError
    cls = classify(service, exc)
    if issubclass(cls, ConditionFailed):
        return "conditional_failed"
    if issubclass(cls, Throttled):
        return "throttled"
    # the engine retries both alike; the jam report counts a 5xx apart from throttling
    return "unavailable" if http_status(exc) >= 500 else "other"


def classify(exc: BaseException, service: str = "") -> ErrorClass:
    """The error class of any exception a store call raised (see the module notes)."""
    if isinstance(exc, OpFailed):
        return exc.kind
    if isinstance(exc, TimeoutError):  # asyncio's and aiohttp's
        return "timeout"
    if isinstance(exc, ServiceUnavailable):
        return "unavailable"
    if isinstance(exc, ConditionalCheckFailed):
        return "conditional_failed"
    if "azure.core" in sys.modules:
        from azure.core.exceptions import AzureError

        if isinstance(exc, AzureError):
            return error_class(service, exc)
    if "botocore" not in sys.modules:
        # Nothing botocore raised, then; importing it now would stall a simulated run.
        return "other"
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    from cmr.backends.aws.errors import classify as service_class
    from cmr.backends.aws.errors import service_fault

    if isinstance(exc, ConnectTimeoutError | ReadTimeoutError):
        return "timeout"
    cls = service_class(service, exc)
    if issubclass(cls, ConditionFailed):
        return "conditional_failed"
    # The engine retries both alike; the jam report counts a 5xx apart from throttling.
    if service_fault(exc):
        return "unavailable"
    if issubclass(cls, Throttled):
        return "throttled"
    return "other"


def _failed(exc: Exception, service: str = "") -> OpFailed:
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        response = {}
    return OpFailed(
        classify(exc, service),
        f"{type(exc).__name__}: {exc}",
        _retries_of(response),
        service=service,
        operation=str(getattr(exc, "operation_name", "") or ""),
        code=str(response.get("Error", {}).get("Code", "")),
        response=response,
    )


def _int(data: bytes) -> int | None:
    """A stored value; anything that is not one of ours reads as nothing."""
    try:
        return int(data)
    except ValueError:
        return None
