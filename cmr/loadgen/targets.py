"""The stores a load task drives, behind one small async protocol.

A target reads and writes integer values under string keys. ``get`` returns the value it saw
(None: nothing there yet) and ``put`` stores one; both report how many SDK retries the call
took. Every failure leaves a target as :class:`OpFailed` carrying one of the jam report's
error classes, translated at this edge so the driver never sees botocore's types. The
classes are read from cmr's one classification of service errors
(:mod:`cmr.backends.aws.errors`, which the engine and ``cmr fleet`` use too):

    throttled           the service asked us to slow down: DynamoDB
                        ProvisionedThroughputExceeded / Throttling / RequestLimitExceeded,
                        S3 503 SlowDown, SQS RequestThrottled / OverLimit
    unavailable         any other 5xx: ServiceUnavailable (SimpleDB's 503 under load, seed 000),
                        InternalServerError; and the simulated store over capacity, which
                        models exactly that SimpleDB 503
    timeout             connect or read timeouts (botocore's, aiohttp's, asyncio's)
    conditional_failed  a conditional write whose condition was false
    other               everything else (connection refused, a missing table, bad input)

Targets (``make_target``):

- ``dynamodb``: GetItem with or without ConsistentRead; PutItem with or without a condition.
- ``s3``: GetObject / PutObject. S3 has been strongly consistent for every read since 2020,
  so "consistent" reads and "conditional" writes both map to the plain calls (mode "plain").
- ``sqs``: put = SendMessage, get = ReceiveMessage then DeleteMessage of what it got; keys are
  ignored (one queue) and every operation is "plain".
- ``simpledb``: GetAttributes with ConsistentRead; PutAttributes with Expected. moto's server,
  the only local SimpleDB, accepts ConsistentRead and Expected but ignores both.
- ``sim``: :class:`cmr.loadgen.sim.SimStore` in this process (one store per task).

Conditional writes come in two styles (``condition=``), both from seed 000:

- ``"absent"`` (the default): the condition is ``attribute_not_exists`` of a fictitious
  attribute that is never written, so it always holds. It measures what a conditional write
  costs without making concurrent writers fail each other, which is what seed 000 did for its
  multi-threaded runs ("checking a fictitious attribute to be non-existent").
- ``"version"``: the condition is that the item's version attribute still holds the version
  this target last read or wrote (absent if it has seen none), as in seed 000's single-thread
  run. Concurrent writers make most of these fail; a failure refreshes the remembered version.
  The simulated store only has version conditions, so ``sim`` always uses this style.

Endpoints and credentials come only from the standard AWS settings (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_<SERVICE>``, ``AWS_PROFILE``, ...). botocore names SimpleDB's variable
``AWS_ENDPOINT_URL_SIMPLEDB``; ``AWS_ENDPOINT_URL_SDB`` is accepted as an alias.
SDK retries follow ``LoadTask.retries``: ``off`` is one attempt, ``standard``/``adaptive`` are
botocore's modes, and the attempts botocore added (``ResponseMetadata.RetryAttempts``) are
reported with each reply or failure.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from cmr.errors import BackendError, ConditionFailed, NotFound, Throttled, UsageError
from cmr.loadgen.sim import ConditionalCheckFailed, ServiceUnavailable, SimConfig, SimStore
from cmr.loadgen.spec import TARGETS, LoadTask, Retries
from cmr.settings import AwsSettings

__all__ = [
    "ERROR_CLASSES",
    "RESOURCE",
    "ErrorClass",
    "OpFailed",
    "Reply",
    "Target",
    "classify",
    "cleanup",
    "make_target",
    "prepare",
]

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


def _retries_of(response: Mapping[str, Any]) -> int:
    return int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


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


def _admin_failed(what: str, service: str, exc: Exception) -> BackendError:
    """A failed prepare or clean-up as cmr's error for it, saying what was being done."""
    from cmr.backends.aws.errors import translated

    err = translated(service, exc)
    return type(err)(f"{what}: {err}", service=err.service, operation=err.operation, code=err.code)


def retry_config(retries: Retries) -> dict[str, Any]:
    """botocore's ``retries`` setting for a task's retry choice."""
    if retries == "off":
        return {"mode": "standard", "total_max_attempts": 1}
    return {"mode": retries}


def _endpoint(service: str) -> str | None:
    """An explicit endpoint only for the SDB alias; botocore reads every other variable."""
    if service == "sdb" and not os.environ.get("AWS_ENDPOINT_URL_SIMPLEDB"):
        return os.environ.get("AWS_ENDPOINT_URL_SDB") or None
    return None


def _need(resources: Mapping[str, str], name: str, target: str) -> str:
    value = resources.get(name)
    if not value:
        raise UsageError(f"target {target} needs resources[{name!r}]: run prepare() first")
    return value


class _AwsTarget:
    """One aioboto3 client for the life of the target; calls translated by ``_call``."""

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
        self._stack = AsyncExitStack()
        self._client: Any = None

    def _extra_config(self) -> dict[str, Any]:
        return {}

    async def setup(self) -> None:
        import aioboto3
        from aiobotocore.config import AioConfig

        session = aioboto3.Session(region_name=self.resources.get("region") or None)
        config = AioConfig(
            retries=retry_config(self._retries),
            connect_timeout=self._timeouts[0],
            read_timeout=self._timeouts[1],
            # one pooled connection per concurrent operator, or requests queue in the client
            max_pool_connections=self._connections,
            **self._extra_config(),
        )
        try:
            self._client = await self._stack.enter_async_context(
                session.client(
                    self.service,
                    region_name=session.region_name or "us-east-1",
                    config=config,
                    endpoint_url=_endpoint(self.service),
                )
            )
        except Exception as exc:
            raise UsageError(f"cannot open a {self.service} client: {exc}") from exc

    async def close(self) -> None:
        await self._stack.aclose()

    async def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response: dict[str, Any] = await getattr(self._client, op)(**kwargs)
        except Exception as exc:
            raise _failed(exc, self.service) from exc
        return response


class DynamoDBTarget(_AwsTarget):
    service = "dynamodb"
    name = "dynamodb"
    consistent_reads = True
    conditional_writes = True

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.table = _need(resources, "table", self.name)
        self.condition: Condition = condition
        self._versions: dict[str, int] = {}  # the version this target last saw per key

    def _remember(self, key: str, item: Mapping[str, Any] | None) -> int | None:
        if not item:
            return None
        if VERSION in item:
            self._versions[key] = int(item[VERSION]["N"])
        return int(item[VALUE]["N"]) if VALUE in item else None

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "get_item", TableName=self.table, Key={KEY: {"S": key}}, ConsistentRead=consistent
        )
        return Reply(self._remember(key, got.get("Item")), _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        seen = self._versions.get(key)
        item = {
            KEY: {"S": key},
            VALUE: {"N": str(value)},
            VERSION: {"N": str((seen or 0) + 1)},
        }
        kwargs: dict[str, Any] = {}
        if conditional and self.condition == "absent":
            kwargs = {
                "ConditionExpression": "attribute_not_exists(#c)",
                "ExpressionAttributeNames": {"#c": NEVER},
            }
        elif conditional and seen is None:
            kwargs = {
                "ConditionExpression": "attribute_not_exists(#c)",
                "ExpressionAttributeNames": {"#c": VERSION},
            }
        elif conditional:
            kwargs = {
                "ConditionExpression": "#c = :seen",
                "ExpressionAttributeNames": {"#c": VERSION},
                "ExpressionAttributeValues": {":seen": {"N": str(seen)}},
            }
        if kwargs:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            got = await self._call("put_item", TableName=self.table, Item=item, **kwargs)
        except OpFailed as exc:
            if exc.kind == "conditional_failed":
                self._remember(key, exc.response.get("Item"))
            raise
        self._versions[key] = (seen or 0) + 1
        return Reply(None, _retries_of(got))


class S3Target(_AwsTarget):
    service = "s3"
    name = "s3"

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.bucket = _need(resources, "bucket", self.name)
        self.prefix = resources.get("prefix", "cmr-load/")

    def _extra_config(self) -> dict[str, Any]:
        return _s3_config()

    async def get(self, key: str, consistent: bool = False) -> Reply:
        try:
            got = await self._call("get_object", Bucket=self.bucket, Key=self.prefix + key)
            async with got["Body"] as body:
                data = await body.read()
        except OpFailed as exc:
            # a key nobody wrote yet reads as nothing, as DynamoDB's missing item does
            if exc.code in ("NoSuchKey", "404"):
                return Reply(None, exc.retries)
            raise
        except Exception as exc:
            raise _failed(exc, self.service) from exc
        return Reply(_int(data), _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        got = await self._call(
            "put_object", Bucket=self.bucket, Key=self.prefix + key, Body=str(value).encode()
        )
        return Reply(None, _retries_of(got))


class SQSTarget(_AwsTarget):
    service = "sqs"
    name = "sqs"

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.queue = _need(resources, "queue", self.name)
        self._url = ""

    async def setup(self) -> None:
        await super().setup()
        try:
            self._url = str((await self._call("get_queue_url", QueueName=self.queue))["QueueUrl"])
        except OpFailed as exc:
            await self.close()
            raise NotFound(f"no SQS queue {self.queue!r}: {exc}") from exc

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "receive_message", QueueUrl=self._url, MaxNumberOfMessages=1, WaitTimeSeconds=0
        )
        retries = _retries_of(got)
        messages = got.get("Messages") or []
        if not messages:
            return Reply(None, retries)
        try:
            deleted = await self._call(
                "delete_message", QueueUrl=self._url, ReceiptHandle=messages[0]["ReceiptHandle"]
            )
        except OpFailed as exc:
            exc.retries += retries
            raise
        return Reply(_int(messages[0]["Body"].encode()), retries + _retries_of(deleted))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        got = await self._call("send_message", QueueUrl=self._url, MessageBody=str(value))
        return Reply(None, _retries_of(got))


class SimpleDBTarget(_AwsTarget):
    service = "sdb"
    name = "simpledb"
    consistent_reads = True
    conditional_writes = True

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.domain = _need(resources, "domain", self.name)
        self.condition: Condition = condition
        self._versions: dict[str, int] = {}

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "get_attributes",
            DomainName=self.domain,
            ItemName=key,
            AttributeNames=[VALUE, VERSION],
            ConsistentRead=consistent,
        )
        attrs = {a["Name"]: a["Value"] for a in got.get("Attributes", [])}
        if VERSION in attrs:
            self._versions[key] = int(attrs[VERSION])
        value = _int(attrs[VALUE].encode()) if VALUE in attrs else None
        return Reply(value, _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        seen = self._versions.get(key)
        kwargs: dict[str, Any] = {}
        if conditional and self.condition == "absent":
            kwargs["Expected"] = {"Name": NEVER, "Exists": False}
        elif conditional and seen is None:
            kwargs["Expected"] = {"Name": VERSION, "Exists": False}
        elif conditional:
            kwargs["Expected"] = {"Name": VERSION, "Value": str(seen), "Exists": True}
        got = await self._call(
            "put_attributes",
            DomainName=self.domain,
            ItemName=key,
            Attributes=[
                {"Name": VALUE, "Value": str(value), "Replace": True},
                {"Name": VERSION, "Value": str((seen or 0) + 1), "Replace": True},
            ],
            **kwargs,
        )
        self._versions[key] = (seen or 0) + 1
        return Reply(None, _retries_of(got))


class SimTarget:
    """The simulated store in this process; its over-capacity refusal counts as unavailable."""

    name = "sim"
    consistent_reads = True
    conditional_writes = True

    def __init__(self, config: SimConfig | None = None, store: SimStore[int] | None = None) -> None:
        # a given store lets several targets be clients of one simulated store
        self.store: SimStore[int] = store if store is not None else SimStore(config)
        self.time_scale = self.store.config.time_scale
        self._versions: dict[str, int] = {}

    async def setup(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def get(self, key: str, consistent: bool = False) -> Reply:
        try:
            value, version = await self.store.get(key, consistent)
        except Exception as exc:
            raise _failed(exc, "sim") from exc
        self._versions[key] = version
        return Reply(value)

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        try:
            version = await self.store.put(
                key, value, self._versions.get(key, 0) if conditional else None
            )
        except ConditionalCheckFailed as exc:
            self._versions[key] = exc.current
            raise _failed(exc, "sim") from exc
        except Exception as exc:
            raise _failed(exc, "sim") from exc
        self._versions[key] = version
        return Reply()


def _int(data: bytes) -> int | None:
    """A stored value; anything that is not one of ours reads as nothing."""
    try:
        return int(data)
    except ValueError:
        return None


def _s3_config() -> dict[str, Any]:
    if os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"):
        # a local endpoint cannot route virtual-hosted bucket names on a plain host:port
        return {"s3": {"addressing_style": "path"}}
    return {}


def make_target(
    task: LoadTask,
    *,
    condition: Condition = "absent",
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
) -> Target:
    """The target a task names, configured from it (not yet set up)."""
    if task.target == "sim":
        try:
            config = SimConfig(**{"seed": task.seed, **task.sim})
        except TypeError as exc:
            raise UsageError(f"bad simulated store config {task.sim!r}: {exc}") from None
        return SimTarget(config)
    options: dict[str, Any] = {
        "retries": task.retries,
        "connections": task.readers + task.writers,
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
    }
    if task.target == "dynamodb":
        return DynamoDBTarget(task.resources, condition=condition, **options)
    if task.target == "simpledb":
        return SimpleDBTarget(task.resources, condition=condition, **options)
    if task.target == "s3":
        return S3Target(task.resources, **options)
    if task.target == "sqs":
        return SQSTarget(task.resources, **options)
    raise UsageError(f"unknown target {task.target!r}: use one of {', '.join(TARGETS)}")


# the name in a task's resources of what each AWS target needs
RESOURCE = {"dynamodb": "table", "s3": "bucket", "sqs": "queue", "simpledb": "domain"}


@contextlib.asynccontextmanager
async def _admin(service: str, aws: AwsSettings) -> Any:
    import aioboto3
    from aiobotocore.config import AioConfig

    session = aioboto3.Session(profile_name=aws.profile, region_name=aws.region)
    extra = _s3_config() if service == "s3" else {}
    config = AioConfig(retries={"mode": aws.retries, "max_attempts": aws.max_attempts}, **extra)
    async with session.client(
        service,
        region_name=session.region_name or "us-east-1",
        config=config,
        endpoint_url=_endpoint(service),
    ) as client:
        yield client, session.region_name or "us-east-1"


async def prepare(
    target: str, resources: Mapping[str, str] | None = None, aws: AwsSettings | None = None
) -> dict[str, str]:
    """Create what a load test on ``target`` needs and return the task's ``resources``.

    Names not given are made unique (``cmr-load-<random>``). DynamoDB tables are on-demand
    (PAY_PER_REQUEST); provision capacity yourself to jam a table deliberately. The region, if
    set in ``aws``, is passed on so map tasks on other machines use the same one.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    out = dict(resources or {})
    if target == "sim":
        return out
    aws = aws or AwsSettings()
    if aws.region:
        out.setdefault("region", aws.region)
    kind = RESOURCE[target]
    name = out.setdefault(kind, f"cmr-load-{uuid.uuid4().hex[:12]}")
    service = "sdb" if target == "simpledb" else target
    try:
        async with _admin(service, aws) as (client, region):
            if target == "dynamodb":
                with contextlib.suppress(client.exceptions.ResourceInUseException):
                    await client.create_table(
                        TableName=name,
                        KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                        BillingMode="PAY_PER_REQUEST",
                    )
                await client.get_waiter("table_exists").wait(
                    TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
                )
            elif target == "s3":
                args: dict[str, Any] = {"Bucket": name}
                if region != "us-east-1":
                    args["CreateBucketConfiguration"] = {"LocationConstraint": region}
                try:
                    await client.create_bucket(**args)
                except ClientError as exc:
                    if exc.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                        raise
            elif target == "sqs":
                await client.create_queue(QueueName=name)
            else:
                await client.create_domain(DomainName=name)
    except (BotoCoreError, ClientError) as exc:
        raise _admin_failed(f"cannot prepare {target} {kind} {name!r}", service, exc) from exc
    return out


async def cleanup(
    target: str, resources: Mapping[str, str], aws: AwsSettings | None = None
) -> None:
    """Delete what ``prepare`` made; whatever is already gone is fine (safe to run twice)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if target == "sim" or target not in RESOURCE or not resources.get(RESOURCE[target]):
        return
    name = resources[RESOURCE[target]]
    service = "sdb" if target == "simpledb" else target
    aws = aws or AwsSettings()
    try:
        async with _admin(service, aws) as (client, _):
            if target == "dynamodb":
                with contextlib.suppress(client.exceptions.ResourceNotFoundException):
                    await client.delete_table(TableName=name)
            elif target == "s3":
                await _empty_bucket(client, name)
                with contextlib.suppress(client.exceptions.NoSuchBucket):
                    await client.delete_bucket(Bucket=name)
            elif target == "sqs":
                with contextlib.suppress(client.exceptions.QueueDoesNotExist):
                    url = (await client.get_queue_url(QueueName=name))["QueueUrl"]
                    await client.delete_queue(QueueUrl=url)
            else:
                await client.delete_domain(DomainName=name)
    except (BotoCoreError, ClientError) as exc:
        raise _admin_failed(f"cannot clean up {target} {name!r}", service, exc) from exc


async def _empty_bucket(client: Any, bucket: str) -> None:
    from botocore.exceptions import ClientError

    try:
        async for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                await client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "NoSuchBucket":
            raise
