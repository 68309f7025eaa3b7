"""What a load test on an AWS or Azure target needs, found, created and removed: a load
test deletes only what it created (the Azure side: :mod:`cmr.loadgen.targets.azure_resources`).

Every run has an id (``resources["run"]``). What the run creates carries it as a tag,
``cmr-loadgen-run=<run>`` (DynamoDB's CreateTable Tags, SQS queue tags, S3 bucket tagging;
SimpleDB has no tags), and the run holds its own record of it (:class:`Prepared`). Teardown
deletes a created resource only if it is still that one: its tag still names the run (S3,
SQS), or its CreationDateTime is the one seen at creation (DynamoDB, whose local stand-in
ignores tags). A resource that existed before is used as-is and never emptied or deleted:

- the load's keys all lie under a prefix of the run's own (``resources["prefix"]``,
  ``cmr-load/<run>/``), so it never overwrites anything of the user's, and teardown deletes
  exactly the keys the run's tasks wrote (``LoadTask.keys``) and nothing else;
- on SQS every message the run sends carries the run id as a message attribute; a receive
  during the load releases any other message at once (visibility 0) and never deletes it,
  and teardown deletes the run's leftover messages and releases the rest. The receives still
  count towards other messages' receive counts, which the statement warns about.

``find`` says whether a resource exists (and refuses a DynamoDB table the load cannot write);
``prepare`` creates what is missing; ``cleanup`` removes what the run made. All three are
safe to run twice.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cmr.errors import BackendError, UsageError
from cmr.loadgen.spec import TARGETS
from cmr.loadgen.targets.aws import _endpoint, _s3_config
from cmr.loadgen.targets.base import KEY
from cmr.settings import AwsSettings

MARKER = "cmr-loadgen-run"  # the tag (and SQS message attribute) naming the run
DRAIN_HIDE_S = 30  # teardown hides others' messages this long while it looks for the run's
DRAIN_BATCHES = 1000  # at most this many receives of 10 when draining the run's messages

# the name in a task's resources of what each target needs
RESOURCE = {
    "dynamodb": "table",
    "s3": "bucket",
    "sqs": "queue",
    "simpledb": "domain",
    "azure-table": "table",
    "azure-blob": "container",
}
AZURE = ("azure-table", "azure-blob")  # cmr.loadgen.targets.azure_resources handles these
# Azure's naming rules, checked before any request: a table's name is letters and digits,
# a container's lowercase letters, digits and single hyphens
_AZURE_NAMES = {
    "azure-table": (re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}"), "3-63 letters and digits"),
    "azure-blob": (
        re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]"),
        "3-63 lowercase letters, digits and single hyphens",
    ),
}


def new_run() -> str:
    return uuid.uuid4().hex[:12]


def default_name(target: str, run: str) -> str:
    """The name of the resource a run creates when none is given."""
    # Azure table names allow no hyphen
    return f"cmrload{run}" if target == "azure-table" else f"cmr-load-{run}"


def check_name(target: str, name: str) -> None:
    """Refuse a name the target's service would refuse, before anything is sent."""
    rule = _AZURE_NAMES.get(target)
    if rule is not None and not rule[0].fullmatch(name):
        kind = RESOURCE[target]
        raise UsageError(f"{kind} name {name!r} is not one Azure accepts: use {rule[1]}")


def _admin_failed(what: str, service: str, exc: Exception) -> BackendError:
    """A failed prepare or clean-up as cmr's error for it, saying what was being done."""
    from cmr.backends.aws.errors import translated

    err = translated(service, exc)
    return type(err)(f"{what}: {err}", service=err.service, operation=err.operation, code=err.code)


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


@dataclass(frozen=True)
class Found:
    """A resource that exists, with what the user should know before it is loaded."""

    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prepared:
    """The run's record of its target: the tasks' resources, and what it created."""

    target: str
    resources: dict[str, str]  # the name, region, run id and key prefix, for the tasks
    created: str | None  # the identity of the resource this run created; None: it existed

    @property
    def run(self) -> str:
        return self.resources.get("run", "")

    @property
    def name(self) -> str:
        return self.resources.get(RESOURCE.get(self.target, ""), "")


@contextlib.asynccontextmanager
async def _admin(service: str, aws: AwsSettings) -> AsyncIterator[tuple[Any, str]]:
    from cmr.backends.aws import sessions

    session = sessions.session(aws.profile, aws.region)
    extra = _s3_config() if service == "s3" else {}
    config = sessions.config(
        retries={"mode": aws.retries, "max_attempts": aws.max_attempts}, **extra
    )
    async with session.client(
        service,
        region_name=session.region_name or "us-east-1",
        config=config,
        endpoint_url=_endpoint(service),
    ) as client:
        yield client, session.region_name or "us-east-1"


def _chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    return (items[i : i + n] for i in range(0, len(items), n))


# DynamoDB ------------------------------------------------------------------------------------


async def _ddb_find(client: Any, name: str) -> Found | None:
    try:
        table = (await client.describe_table(TableName=name))["Table"]
    except client.exceptions.ResourceNotFoundException:
        return None
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    schema = [(k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]]
    if schema != [(KEY, "HASH")] or types.get(KEY) != "S":
        shown = ", ".join(f"{n} ({t.lower()}, {types.get(n, '?')})" for n, t in schema)
        raise UsageError(
            f"table {name} is keyed by {shown}; the load writes items keyed by a string "
            f"{KEY!r} alone: name another table, or leave --target-table out for a new one"
        )
    notes = []
    throughput = table.get("ProvisionedThroughput") or {}
    if (table.get("BillingModeSummary") or {}).get("BillingMode") != "PAY_PER_REQUEST" and (
        throughput.get("ReadCapacityUnits") or throughput.get("WriteCapacityUnits")
    ):
        notes.append(
            f"provisioned at {throughput.get('ReadCapacityUnits')} reads and "
            f"{throughput.get('WriteCapacityUnits')} writes per second: a jam can throttle "
            "whatever else uses it"
        )
    return Found(tuple(notes))


async def _ddb_create(client: Any, name: str, run: str) -> str | None:
    try:
        made = await client.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            Tags=[{"Key": MARKER, "Value": run}],
        )
    except client.exceptions.ResourceInUseException:
        return None  # someone else's, made since we looked: used as-is
    await client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )
    return str(made["TableDescription"]["CreationDateTime"])


async def _ddb_is_ours(client: Any, name: str, created: str) -> bool | None:
    try:
        table = (await client.describe_table(TableName=name))["Table"]
    except client.exceptions.ResourceNotFoundException:
        return None
    return str(table["CreationDateTime"]) == created


async def _ddb_forget(client: Any, name: str, keys: list[str]) -> None:
    for chunk in _chunks(keys, 25):
        requests: dict[str, Any] = {
            name: [{"DeleteRequest": {"Key": {KEY: {"S": k}}}} for k in chunk]
        }
        for _ in range(10):  # unprocessed items come back under throttling; botocore backs off
            got = await client.batch_write_item(RequestItems=requests)
            requests = got.get("UnprocessedItems") or {}
            if not requests:
                break


# S3 ------------------------------------------------------------------------------------------


async def _s3_find(client: Any, name: str) -> Found | None:
    from botocore.exceptions import ClientError

    try:
        await client.head_bucket(Bucket=name)
    except ClientError as exc:
        if _code(exc) in ("404", "NoSuchBucket"):
            return None
        if _code(exc) in ("403", "AccessDenied"):
            raise UsageError(
                f"bucket {name} exists and these credentials may not use it: name another "
                "bucket, or leave --target-bucket out for a new one"
            ) from None
        raise
    return Found()


async def _s3_create(client: Any, name: str, run: str, region: str) -> str | None:
    from botocore.exceptions import ClientError

    args: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        args["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        await client.create_bucket(**args)
    except ClientError as exc:
        if _code(exc) == "BucketAlreadyOwnedByYou":
            return None
        if _code(exc) == "BucketAlreadyExists":
            raise UsageError(
                f"bucket {name} belongs to another account (bucket names are global): "
                "name another with --target-bucket"
            ) from None
        raise
    await client.put_bucket_tagging(
        Bucket=name, Tagging={"TagSet": [{"Key": MARKER, "Value": run}]}
    )
    return run


async def _s3_is_ours(client: Any, name: str, run: str) -> bool | None:
    from botocore.exceptions import ClientError

    try:
        tags = (await client.get_bucket_tagging(Bucket=name))["TagSet"]
    except ClientError as exc:
        if _code(exc) == "NoSuchBucket":
            return None
        if _code(exc) == "NoSuchTagSet":
            return False
        raise
    return {t["Key"]: t["Value"] for t in tags}.get(MARKER) == run


async def _s3_delete(client: Any, name: str) -> None:
    """Empty the bucket (this run made it: everything in it is the run's) and delete it."""
    from botocore.exceptions import ClientError

    try:
        async for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [o["Key"] for o in page.get("Contents", [])]
            if keys:
                await _s3_forget(client, name, keys)
        await client.delete_bucket(Bucket=name)
    except ClientError as exc:
        if _code(exc) != "NoSuchBucket":
            raise


async def _s3_forget(client: Any, name: str, keys: list[str]) -> None:
    for chunk in _chunks(keys, 1000):
        objects = [{"Key": k} for k in chunk]
        await client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})


# SQS -----------------------------------------------------------------------------------------


async def _sqs_url(client: Any, name: str) -> str | None:
    try:
        return str((await client.get_queue_url(QueueName=name))["QueueUrl"])
    except client.exceptions.QueueDoesNotExist:
        return None


async def _sqs_find(client: Any, name: str) -> Found | None:
    url = await _sqs_url(client, name)
    if url is None:
        return None
    got = await client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "RedrivePolicy"]
    )
    attrs = got.get("Attributes", {})
    notes = []
    held = int(attrs.get("ApproximateNumberOfMessages", 0) or 0)
    if held:
        notes.append(
            f"holds about {held} messages of others: the load's receives release them at once "
            "and never delete them, but each receive counts towards their receive count"
        )
    if attrs.get("RedrivePolicy"):
        notes.append(
            "has a redrive policy: messages of others received often enough by the load move "
            "to its dead-letter queue"
        )
    return Found(tuple(notes))


async def _sqs_is_ours(client: Any, name: str, run: str) -> bool | None:
    url = await _sqs_url(client, name)
    if url is None:
        return None
    tags = (await client.list_queue_tags(QueueUrl=url)).get("Tags") or {}
    return bool(tags.get(MARKER) == run)


async def _sqs_create(client: Any, name: str, run: str) -> str | None:
    # CreateQueue of an existing queue returns it: only our tag on it says we made it
    await client.create_queue(QueueName=name, tags={MARKER: run})
    return run if await _sqs_is_ours(client, name, run) else None


async def _sqs_delete(client: Any, name: str) -> None:
    url = await _sqs_url(client, name)
    if url is not None:
        with contextlib.suppress(client.exceptions.QueueDoesNotExist):
            await client.delete_queue(QueueUrl=url)


async def _sqs_forget(client: Any, name: str, run: str) -> None:
    """Delete the run's messages still in a queue it did not create; release the others."""
    url = await _sqs_url(client, name)
    if url is None:
        return
    others: list[str] = []
    empty = 0
    try:
        for _ in range(DRAIN_BATCHES):
            got = await client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,  # long polling asks every server: an empty answer means it
                VisibilityTimeout=DRAIN_HIDE_S,  # others' stay out of this sweep, then return
                MessageAttributeNames=[MARKER],
            )
            messages = got.get("Messages") or []
            empty = 0 if messages else empty + 1
            if empty >= 2:
                break
            ours = [m for m in messages if run_of(m) == run]
            others += [m["ReceiptHandle"] for m in messages if run_of(m) != run]
            if ours:
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(ours)
                ]
                await client.delete_message_batch(QueueUrl=url, Entries=entries)
    finally:
        for chunk in _chunks(others, 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(chunk)
            ]
            await client.change_message_visibility_batch(QueueUrl=url, Entries=entries)


def run_of(message: Mapping[str, Any]) -> str | None:
    """The run id an SQS message carries (None: not a load generator's)."""
    attribute = (message.get("MessageAttributes") or {}).get(MARKER) or {}
    value = attribute.get("StringValue")
    return str(value) if value is not None else None


# SimpleDB --------------------------------------------------------------------------------------


async def _sdb_find(client: Any, name: str) -> Found | None:
    # ListDomains, not DomainMetadata: moto's SimpleDB, the only local one, lacks the latter
    async for page in client.get_paginator("list_domains").paginate():
        if name in (page.get("DomainNames") or []):
            return Found()
    return None


async def _sdb_create(client: Any, name: str, run: str) -> str | None:
    # No tags on SimpleDB, and CreateDomain of an existing domain succeeds: only the run's
    # record says it made the domain (prepare looked just before).
    await client.create_domain(DomainName=name)
    return run


async def _sdb_forget(client: Any, name: str, keys: list[str]) -> None:
    # BatchDeleteAttributes is not in moto: this path is exercised on SimpleDB itself only
    for chunk in _chunks(keys, 25):
        await client.batch_delete_attributes(DomainName=name, Items=[{"Name": k} for k in chunk])


# the three steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Service:
    """One service's ways of finding, creating, recognising and removing a resource."""

    name: str  # botocore's
    find: Callable[[Any, str], Awaitable[Found | None]]
    create: Callable[[Any, str, str, str], Awaitable[str | None]]  # client, name, run, region
    is_ours: Callable[[Any, str, Prepared], Awaitable[bool | None]]  # None: gone
    delete: Callable[[Any, str], Awaitable[None]]
    forget: Callable[[Any, str, str, list[str]], Awaitable[None]]  # client, name, run, keys


async def _sdb_is_ours(client: Any, name: str, prepared: Prepared) -> bool | None:
    return True if await _sdb_find(client, name) is not None else None


async def _ddb_delete(client: Any, name: str) -> None:
    with contextlib.suppress(client.exceptions.ResourceNotFoundException):
        await client.delete_table(TableName=name)


async def _sdb_delete(client: Any, name: str) -> None:
    await client.delete_domain(DomainName=name)


SERVICES = {
    "dynamodb": _Service(
        "dynamodb",
        _ddb_find,
        lambda c, name, run, region: _ddb_create(c, name, run),
        lambda c, name, p: _ddb_is_ours(c, name, p.created or ""),
        _ddb_delete,
        lambda c, name, run, keys: _ddb_forget(c, name, keys),
    ),
    "s3": _Service(
        "s3",
        _s3_find,
        _s3_create,
        lambda c, name, p: _s3_is_ours(c, name, p.run),
        _s3_delete,
        lambda c, name, run, keys: _s3_forget(c, name, keys),
    ),
    "sqs": _Service(
        "sqs",
        _sqs_find,
        lambda c, name, run, region: _sqs_create(c, name, run),
        lambda c, name, p: _sqs_is_ours(c, name, p.run),
        _sqs_delete,
        lambda c, name, run, keys: _sqs_forget(c, name, run),
    ),
    "simpledb": _Service(
        "sdb",
        _sdb_find,
        lambda c, name, run, region: _sdb_create(c, name, run),
        _sdb_is_ours,
        _sdb_delete,
        lambda c, name, run, keys: _sdb_forget(c, name, keys),
    ),
}


def _service(target: str) -> _Service:
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    return SERVICES[target]


async def find(target: str, name: str, aws: AwsSettings | None = None) -> Found | None:
    """Whether ``target``'s resource ``name`` exists (None: it does not), sending only
    read-only requests; a DynamoDB table the load cannot write is refused here."""
    from botocore.exceptions import BotoCoreError, ClientError

    if target == "sim":
        return None
    if target in AZURE:
        return await _azure_find(target, name)
    service = _service(target)
    try:
        async with _admin(service.name, aws or AwsSettings()) as (client, _):
            return await service.find(client, name)
    except (BotoCoreError, ClientError) as exc:
        what = f"cannot check {target} {RESOURCE[target]} {name!r}"
        raise _admin_failed(what, service.name, exc) from exc


async def prepare(
    target: str, resources: Mapping[str, str] | None = None, aws: AwsSettings | None = None
) -> Prepared:
    """Settle the task's ``resources`` and create the target's resource if it is missing.

    A run id and a key prefix of its own are added unless given; a name not given is made
    unique (``cmr-load-<run>``). A resource that exists is used as-is (a DynamoDB table must
    be keyed by a string ``k``). DynamoDB tables are created on-demand (PAY_PER_REQUEST):
    provision capacity yourself to jam a table deliberately. The region, if set in ``aws``,
    is passed on so map tasks on other machines use the same one.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    out = dict(resources or {})
    run = out.setdefault("run", new_run())
    if target == "sim":
        return Prepared(target, out, None)
    out.setdefault("prefix", f"cmr-load/{run}/")
    if target in AZURE:
        return await _azure_prepare(target, out)
    service = _service(target)
    aws = aws or AwsSettings()
    if aws.region:
        out.setdefault("region", aws.region)
    kind = RESOURCE[target]
    name = out.setdefault(kind, default_name(target, run))
    try:
        async with _admin(service.name, aws) as (client, region):
            created = None
            if await service.find(client, name) is None:
                created = await service.create(client, name, run, region)
                if created is None:  # made by someone else since we looked: checked as theirs
                    await service.find(client, name)
    except (BotoCoreError, ClientError) as exc:
        what = f"cannot prepare {target} {kind} {name!r}"
        raise _admin_failed(what, service.name, exc) from exc
    return Prepared(target, out, created)


async def cleanup(
    prepared: Prepared, written: Iterable[str] = (), aws: AwsSettings | None = None
) -> list[str]:
    """Remove what the run made: the resource if this run created it and it is still that
    one, else only the keys it wrote (``written``) or, on SQS, the messages it sent. Returns
    what it left alone and why (empty when all went as planned)."""
    from botocore.exceptions import BotoCoreError, ClientError

    target, name = prepared.target, prepared.name
    if target == "sim" or target not in RESOURCE or not name:
        return []
    if target in AZURE:
        return await _azure_cleanup(prepared, written)
    service, kind = _service(target), RESOURCE[target]
    try:
        async with _admin(service.name, aws or AwsSettings()) as (client, _):
            if prepared.created is None:
                await service.forget(client, name, prepared.run, sorted(set(written)))
                return []
            ours = await service.is_ours(client, name, prepared)
            if ours is None:
                return []  # gone already
            if not ours:
                return [f"left {kind} {name} alone: it is no longer the one this run created"]
            await service.delete(client, name)
    except (BotoCoreError, ClientError) as exc:
        what = f"cannot clean up {target} {kind} {name!r}"
        raise _admin_failed(what, service.name, exc) from exc
    return []


# Azure --------------------------------------------------------------------------------------


async def _azure_find(target: str, name: str) -> Found | None:
    from azure.core.exceptions import AzureError

    from cmr.loadgen.targets import azure_resources as az

    check_name(target, name)
    try:
        async with az.admin(target) as client:
            return Found() if await az.exists(target, client, name) else None
    except AzureError as exc:
        raise az.failure(f"cannot check {target} {RESOURCE[target]} {name!r}", target, exc) from exc


async def _azure_prepare(target: str, out: dict[str, str]) -> Prepared:
    from azure.core.exceptions import AzureError

    from cmr.loadgen.targets import azure_resources as az

    kind = RESOURCE[target]
    name = out.setdefault(kind, default_name(target, out["run"]))
    check_name(target, name)
    try:
        async with az.admin(target) as client:
            created = None
            if not await az.exists(target, client, name):
                created = await az.create(target, client, name, out["run"])
    except AzureError as exc:
        raise az.failure(f"cannot prepare {target} {kind} {name!r}", target, exc) from exc
    return Prepared(target, out, created)


async def _azure_cleanup(prepared: Prepared, written: Iterable[str]) -> list[str]:
    from azure.core.exceptions import AzureError

    from cmr.loadgen.targets import azure_resources as az

    target, name, kind = prepared.target, prepared.name, RESOURCE[prepared.target]
    try:
        async with az.admin(target) as client:
            if prepared.created is None:
                await az.forget(target, client, name, sorted(set(written)))
                return []
            ours = await az.is_ours(target, client, name, prepared.run)
            if ours is None:
                return []  # gone already
            if not ours:
                return [f"left {kind} {name} alone: it is no longer the one this run created"]
            await az.delete(target, client, name)
    except AzureError as exc:
        raise az.failure(f"cannot clean up {target} {kind} {name!r}", target, exc) from exc
    return []
