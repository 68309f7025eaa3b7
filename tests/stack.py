"""The local stack as tests see it: AWS (LocalStack for S3 and SQS, moto for DynamoDB and
SimpleDB) and Azure (Azurite for Blob, Queue and Table storage)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from cmr.backends.base import Backend
    from cmr.settings import AwsSettings

LOCALSTACK_URL = "http://127.0.0.1:4566"
DYNAMODB_URL = "http://127.0.0.1:8000"
# What answers DYNAMODB_URL (and SimpleDB) in scripts/stack.sh: named in every emulator gap.
DYNAMODB_SERVER = "moto 5.2.5"

# Azurite's ports in scripts/stack.sh: Blob, Queue and Table storage.
AZURITE_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}
# What answers them: named in every gap of Azurite's against Azure.
AZURE_SERVER = "Azurite 3.35.0"
# Azurite's development account: its name and key are public, the same in every Azurite
# (Azure's documentation of the emulator gives them); they open nothing but a local emulator.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# What `scripts/stack.sh env` exports as AZURE_STORAGE_CONNECTION_STRING (a test holds them
# equal): Azure's standard setting, so Azurite is Azure with other endpoints.
AZURITE_CONNECTION_STRING = ";".join(
    [
        "DefaultEndpointsProtocol=http",
        f"AccountName={AZURITE_ACCOUNT}",
        f"AccountKey={AZURITE_KEY}",
        *(
            f"{service.capitalize()}Endpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
            for service, port in AZURITE_PORTS.items()
        ),
    ]
)


def stack_env() -> dict[str, str]:
    """The standard AWS settings that point every client at the local stack."""
    return {
        "AWS_ENDPOINT_URL": LOCALSTACK_URL,
        "AWS_ENDPOINT_URL_DYNAMODB": DYNAMODB_URL,
        "AWS_ENDPOINT_URL_SIMPLEDB": DYNAMODB_URL,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _answers(url: str, timeout: float = 1.0) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on (as the kernel just handed it out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_up() -> bool:
    """Whether both LocalStack and the DynamoDB server accept connections."""
    return _answers(LOCALSTACK_URL) and _answers(DYNAMODB_URL)


def azurite_up() -> bool:
    """Whether Azurite's three services accept connections."""
    return all(_answers(f"http://127.0.0.1:{port}") for port in AZURITE_PORTS.values())


def remove_test_resources(bucket: str, table: str, queue_prefix: str) -> None:
    """Delete what a test session made on the local stack; whatever is already gone is fine."""
    import boto3
    from botocore.exceptions import ClientError

    env = stack_env()
    session = boto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    sqs = session.client("sqs", endpoint_url=LOCALSTACK_URL)
    for url in sqs.list_queues(QueueNamePrefix=queue_prefix).get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)
    s3 = session.client("s3", endpoint_url=LOCALSTACK_URL)
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        s3.delete_bucket(Bucket=bucket)
    except ClientError:
        pass
    dynamodb = session.client("dynamodb", endpoint_url=DYNAMODB_URL)
    with suppress(ClientError):
        dynamodb.delete_table(TableName=table)


def remove_azure_test_resources(container: str, queue_prefix: str, table: str = "") -> None:
    """Delete what a test session made on Azurite (its container, its queues, its table);
    whatever is already gone is fine."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.data.tables import TableServiceClient
    from azure.storage.blob import BlobServiceClient
    from azure.storage.queue import QueueServiceClient

    if table:
        with TableServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as tables:
            tables.delete_table(table)  # absent: no error

    with QueueServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as queues:
        for q in queues.list_queues(name_starts_with=queue_prefix):
            with suppress(ResourceNotFoundError):
                queues.delete_queue(q.name)
    blobs = BlobServiceClient.from_connection_string(AZURITE_CONNECTION_STRING)
    with blobs, suppress(ResourceNotFoundError):
        blobs.delete_container(container)


@asynccontextmanager
async def _leaving_nothing(
    backend: str, settings: AwsSettings, remove: Callable[[], None]
) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    """The backend in these settings. Once the test is done nothing of its jobs may be left
    (whatever was killed, paused or duplicated, every job ended and cleaned up after
    itself); then ``remove`` takes all of it away, whatever happened."""
    from cmr.api import open_backend
    from cmr.testing import backend_leftovers

    try:
        async with open_backend(backend, settings) as be:
            yield be, settings
            assert await backend_leftovers(be, settings.queue_prefix) == []
    finally:
        remove()


@asynccontextmanager
async def stack_backend(name: str, queue_tag: str) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    """An aws backend on the local stack with a bucket and table of its own
    (``cmr-<name>-<tag>``) and queues named ``<queue_tag>-<tag>-``, left as it was found
    (:func:`_leaving_nothing`)."""
    from cmr.settings import AwsSettings

    tag = uuid.uuid4().hex[:8]
    s = AwsSettings(
        bucket=f"cmr-{name}-{tag}", table=f"cmr-{name}-{tag}", queue_prefix=f"{queue_tag}-{tag}-"
    )
    async with _leaving_nothing(
        "aws", s, lambda: remove_test_resources(s.bucket, s.table, s.queue_prefix)
    ) as made:
        yield made


@asynccontextmanager
async def azure_stack_backend(queue_tag: str) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    """An azure backend on Azurite with a container and table of its own and queues named
    ``<queue_tag><tag>-``, left as it was found (:func:`_leaving_nothing`)."""
    from cmr.settings import AwsSettings

    tag = uuid.uuid4().hex[:8]
    s = AwsSettings(bucket=f"cmr-{tag}", table=f"cmr{tag}", queue_prefix=f"{queue_tag}{tag}-")
    async with _leaving_nothing(
        "azure", s, lambda: remove_azure_test_resources(s.bucket, s.queue_prefix, s.table)
    ) as made:
        yield made
