"""Opening the aws backend: the configured endpoints reached (down is said at once, slow
is waited for, within a bound), one client per service, a probe of each, and the bucket
and table made if they are missing (and allowed to be).

LocalStack and moto's DynamoDB server are this backend with other endpoints: botocore reads
``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_<SERVICE>`` itself, so no code path here knows
about them (:mod:`cmr.backends.aws.reach` reads the same names, to look before botocore
loads).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    ReadTimeoutError,
)
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cmr.backends.aws.errors import QUEUE_GONE, error_code, slow_message
from cmr.backends.aws.errors import translate as _translate
from cmr.backends.aws.errors import translated as _translated
from cmr.backends.aws.owner import DENIED_CODES, expect_owner, not_owned
from cmr.backends.aws.reach import PROBE_SECONDS, preflight
from cmr.backends.base import REMOTE, Backend
from cmr.backends.embedded.blobs import EmbeddedBlobs
from cmr.errors import BackendError, BlobMissing, StoreMissing, Unreachable, UsageError
from cmr.settings import AwsSettings

# A probe call's timeouts, each attempt: a stall longer than these is tried again, with
# backoff, until PROBE_SECONDS have passed since the opening began.
_PROBE_CONNECT = 2
_PROBE_READ = 5
# What a slow endpoint raises; refused (EndpointConnectionError) is down, and not retried.
_SLOW = (ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)


async def _ensure_bucket(s3: Any, bucket: str, region: str, create: bool, exists: bool) -> None:
    """``exists``: what the probe's HeadBucket found (it answers for the owner check too)."""
    if exists:
        return
    if not create:
        raise StoreMissing(
            "bucket", bucket, f"bucket {bucket} does not exist: create it or enable bucket creation"
        )
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        # us-east-1 is the one region that rejects an explicit LocationConstraint.
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        with _translate("s3", f"s3://{bucket}"):
            await s3.create_bucket(**kwargs)
    except BlobMissing:
        # "Not found" to creating a bucket: what answers is not S3 (a proxy, a wrong port).
        raise UsageError(
            f"s3 at {s3.meta.endpoint_url} answered 'not found' to creating bucket {bucket}: "
            "it is not an S3 endpoint; check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3)"
        ) from None
    except BackendError as exc:
        if exc.code == "BucketAlreadyExists":
            raise UsageError(
                f"bucket {bucket} belongs to another account: choose another bucket name"
            ) from exc
        if exc.code != "BucketAlreadyOwnedByYou":
            raise
    # A new bucket may answer NoSuchBucket for a moment on S3, and a missing bucket is not
    # retried (BucketOrTableMissing): wait until it is there, as for a new table.
    with _translate("s3", f"s3://{bucket}"):
        await s3.get_waiter("bucket_exists").wait(
            Bucket=bucket, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )


async def _ensure_table(db: Any, table: str, create: bool, status: str | None = None) -> None:
    """``status``: the TableStatus the probe's DescribeTable found, ``""`` for no such
    table (None: not asked yet)."""
    if status is None:
        try:
            with _translate("dynamodb", table):
                got = await db.describe_table(TableName=table)
            status = str(got["Table"].get("TableStatus", ""))
        except BackendError as exc:
            if exc.code != "ResourceNotFoundException":
                raise
            status = ""
    if status == "ACTIVE":
        return
    if not status:
        if not create:
            raise StoreMissing(
                "table",
                table,
                f"DynamoDB table {table} does not exist: create it or enable table creation",
            )
        try:
            with _translate("dynamodb", table):
                await db.create_table(
                    TableName=table,
                    AttributeDefinitions=[
                        {"AttributeName": "pk", "AttributeType": "S"},
                        {"AttributeName": "sk", "AttributeType": "S"},
                    ],
                    KeySchema=[
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                    BillingMode="PAY_PER_REQUEST",
                )
        except BackendError as again:
            # Another process is creating it at the same moment: wait for theirs.
            if again.code != "ResourceInUseException":
                raise
    with _translate("dynamodb", table):
        await db.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )


class _Slow(Exception):
    def __init__(self, service: str, url: str, what: str) -> None:
        super().__init__(service)
        self.service, self.url, self.what = service, url, what


async def _probe(
    session: Any, region: str, settings: AwsSettings, path_style: bool, deadline: float
) -> dict[str, Any]:
    """One cheap call per service, so that a wrong setup (no credentials, nothing
    listening) fails at open time, not after minutes of backoff mid-job; a slow answer is
    tried again until ``deadline``, then reported as slow. Each call names only our own
    queue prefix, bucket or table: a least-privilege role (deploy/fleet.yaml) allows them,
    where ListBuckets or ListTables would need "*".

    What the calls found, for the set-up not to ask again (two requests of every opening):
    ``{"s3": the bucket exists, "dynamodb": the table's status, "" if there is none}``;
    "s3" is always there, "dynamodb" unless the answer had no status."""
    from cmr.backends.aws import sessions

    found: dict[str, Any] = {}

    # botocore does not retry: tenacity does, bounded by the deadline rather than a count.
    config = {
        "retries": {"total_max_attempts": 1},
        "connect_timeout": _PROBE_CONNECT,
        "read_timeout": _PROBE_READ,
    }
    # "Not found" still proves the service answered and let us in; each service's own.
    absent = {
        "sqs": QUEUE_GONE,
        "s3": {"404", "NoSuchBucket", "NotFound"},
        "dynamodb": {"ResourceNotFoundException"},
    }

    async def call(service: str, c: Any) -> None:
        try:
            if service == "sqs":
                await c.get_queue_url(QueueName=f"{settings.queue_prefix}probe")
            elif service == "s3":
                await c.head_bucket(Bucket=settings.bucket)
                found["s3"] = True
            else:
                got = await c.describe_table(TableName=settings.table)
                status = got.get("Table", {}).get("TableStatus")
                if status:  # else: asked again by the set-up, as before
                    found["dynamodb"] = str(status)
        except ClientError as exc:
            if service == "s3" and settings.owner and error_code(exc) in DENIED_CODES:
                raise UsageError(not_owned(settings.bucket, settings.owner)) from exc
            if error_code(exc) not in absent[service]:
                raise
            if service == "s3":
                found["s3"] = False
            elif service == "dynamodb":
                found["dynamodb"] = ""

    async def one(service: str) -> None:
        extra = {"s3": {"addressing_style": "path"}} if service == "s3" and path_style else {}
        with _translate(service):
            async with session.client(
                service, region_name=region, config=sessions.config(**config, **extra)
            ) as c:
                if service == "s3":
                    expect_owner(c, settings.owner)
                url = c.meta.endpoint_url
                what = "it accepted no connection"
                # At least one read's time: a stalled preflight or a loaded CPU that used the
                # deadline up must not fail an endpoint that answers.
                left = max(deadline - time.monotonic(), float(_PROBE_READ))
                try:
                    async with asyncio.timeout(left):
                        async for attempt in AsyncRetrying(
                            retry=retry_if_exception_type(_SLOW),
                            wait=wait_exponential(multiplier=0.25, max=2.0),
                            stop=stop_after_delay(left),
                            reraise=True,
                        ):
                            with attempt:
                                try:
                                    await call(service, c)
                                except (ReadTimeoutError, ConnectionClosedError):
                                    what = "it did not answer"
                                    raise
                except (TimeoutError, *_SLOW):
                    raise _Slow(service, url, what) from None

    got = await asyncio.gather(*(one(s) for s in ("sqs", "s3", "dynamodb")), return_exceptions=True)
    errors = [e for e in got if isinstance(e, BaseException)]
    for error in errors:
        if not isinstance(error, _Slow):
            raise error
    if errors:
        slow = [e for e in errors if isinstance(e, _Slow)]
        names = ", ".join(e.service for e in slow)
        urls = sorted({e.url.rstrip("/") for e in slow})
        raise Unreachable(slow_message(names, " and ".join(urls), slow[0].what, PROBE_SECONDS))
    return found


@asynccontextmanager
async def open_aws(settings: AwsSettings) -> AsyncIterator[Backend]:
    """The aws backend, with one client per service for the life of the context."""
    deadline = time.monotonic() + PROBE_SECONDS
    # Sockets only: an endpoint with nothing listening is told before aioboto3 loads.
    await preflight(deadline)
    from cmr.backends.aws import sessions
    from cmr.backends.aws.dynamodb import AwsTable
    from cmr.backends.aws.s3 import AwsBlobs
    from cmr.backends.aws.sqs import AwsQueues

    try:
        session = sessions.session(settings.profile, settings.region)
    except BotoCoreError as exc:
        raise _translated("aws", exc) from exc
    region = session.region_name or "us-east-1"
    base = {
        "retries": {"mode": settings.retries, "max_attempts": settings.max_attempts},
        "max_pool_connections": 64,
    }
    path_style = bool(os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"))
    async with AsyncExitStack() as stack:
        clients: dict[str, Any] = {}
        for service in ("sqs", "s3", "dynamodb"):
            extra: dict[str, Any] = {}
            if service == "s3" and path_style:
                # LocalStack cannot route virtual-hosted bucket names on a plain host:port.
                extra["s3"] = {"addressing_style": "path"}
            with _translate(service):
                clients[service] = await stack.enter_async_context(
                    session.client(
                        service, region_name=region, config=sessions.config(**base, **extra)
                    )
                )
        expect_owner(clients["s3"], settings.owner)
        found = await _probe(session, region, settings, path_style, deadline)
        await _ensure_bucket(clients["s3"], settings.bucket, region, settings.create, found["s3"])
        await _ensure_table(
            clients["dynamodb"], settings.table, settings.create, found.get("dynamodb")
        )
        yield Backend(
            name="aws",
            queues=AwsQueues(clients["sqs"]),
            blobs=AwsBlobs(clients["s3"]),
            table=AwsTable(clients["dynamodb"], settings.table),
            scratch=f"s3://{settings.bucket}/cmr",
            capabilities=REMOTE,
            local_blobs=EmbeddedBlobs(),  # local outputs: inspected, and fetched into
        )
