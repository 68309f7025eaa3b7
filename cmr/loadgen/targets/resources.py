"""Creating and deleting what a load test on an AWS target needs (``prepare``/``cleanup``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import Any

from cmr.errors import BackendError, UsageError
from cmr.loadgen.spec import TARGETS
from cmr.loadgen.targets.aws import _endpoint, _s3_config
from cmr.loadgen.targets.base import KEY
from cmr.settings import AwsSettings


def _admin_failed(what: str, service: str, exc: Exception) -> BackendError:
    """A failed prepare or clean-up as cmr's error for it, saying what was being done."""
    from cmr.backends.aws.errors import translated

    err = translated(service, exc)
    return type(err)(f"{what}: {err}", service=err.service, operation=err.operation, code=err.code)


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
