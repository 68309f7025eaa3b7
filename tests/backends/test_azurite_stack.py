"""The local stack's Azurite serves Blob, Queue and Table storage as Azure's own async SDK
clients use them, with no setting but Azure's standard one (AZURE_STORAGE_CONNECTION_STRING,
as ``scripts/stack.sh env`` prints it): the semantics an Azure backend of cmr would build on
(issue 29). Conditional writes by ETag, ranged reads; a queue's visibility timeout, dequeue
count and pop receipts; a table's optimistic concurrency and its transactions within one
partition key, all or nothing.

Against the stack (the ``azure_stack`` fixture): skipped when Azurite is down, failed under
CI=true. The last test needs no stack: the script's connection string is the tests'."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableServiceClient
from azure.storage.blob.aio import BlobServiceClient
from azure.storage.queue.aio import QueueClient

from tests.stack import AZURITE_CONNECTION_STRING

ROOT = Path(__file__).resolve().parents[2]


def connection_string() -> str:
    """Azure's standard setting, and nothing else: Azurite is Azure with other endpoints."""
    return os.environ["AZURE_STORAGE_CONNECTION_STRING"]


def unique(prefix: str) -> str:
    """A name no other run uses (lowercase letters and digits: valid for a container, a
    queue and a table alike)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def blobs(azure_stack: str) -> AsyncIterator[BlobServiceClient]:
    async with BlobServiceClient.from_connection_string(connection_string()) as service:
        yield service


async def test_blob_conditional_put_and_ranged_read(blobs: BlobServiceClient) -> None:
    container = blobs.get_container_client(unique("cmrt"))
    await container.create_container()
    try:
        blob = container.get_blob_client("dir/part-00000")
        sent: list[str | None] = []

        def record(request: Any) -> None:
            sent.append(request.http_request.headers.get("If-None-Match"))

        data = b"0123456789abcdefghij"
        # If-None-Match: * -- created only where nothing is: the first put wins ...
        first = await blob.upload_blob(
            data, match_condition=MatchConditions.IfMissing, raw_request_hook=record
        )
        etag = first["etag"]
        # ... and a second one, with other bytes, is refused and changes nothing.
        with pytest.raises(ResourceExistsError):
            await blob.upload_blob(
                b"other bytes",
                match_condition=MatchConditions.IfMissing,
                raw_request_hook=record,
            )
        assert sent == ["*", "*"]
        assert (await blob.get_blob_properties()).etag == etag

        # If-Match: a write conditioned on the ETag read succeeds once; a stale one is refused.
        second = await blob.upload_blob(
            data[::-1], overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
        )
        assert second["etag"] != etag
        with pytest.raises(ResourceModifiedError):
            await blob.upload_blob(
                data, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
            )

        # A ranged read: bytes [3, 10) of what is there now.
        stream = await blob.download_blob(offset=3, length=7)
        assert await stream.readall() == data[::-1][3:10]
        assert (await (await blob.download_blob()).readall()) == data[::-1]
    finally:
        await container.delete_container()


@pytest.mark.usefixtures("azure_stack")
async def test_queue_visibility_dequeue_count_and_pop_receipts() -> None:
    queue = QueueClient.from_connection_string(connection_string(), unique("cmrt"))
    async with queue:
        await queue.create_queue()
        try:
            await queue.send_message("task 1")

            async def receive(visibility: int) -> list[Any]:
                return [
                    m
                    async for m in queue.receive_messages(
                        messages_per_page=1, visibility_timeout=visibility
                    )
                ]

            [first] = await receive(visibility=1)
            assert first.content == "task 1"
            assert first.dequeue_count == 1
            assert first.pop_receipt
            # Invisible while its visibility timeout runs: no other receiver gets it.
            assert await receive(visibility=30) == []

            # The timeout ran out: delivered again, counted, under a new pop receipt.
            await asyncio.sleep(1.5)
            [again] = await receive(visibility=30)
            assert again.id == first.id
            assert again.dequeue_count == 2
            assert again.pop_receipt != first.pop_receipt

            # The first receiver's receipt no longer deletes it; the current one does.
            with pytest.raises(HttpResponseError) as stale:
                await queue.delete_message(first.id, first.pop_receipt)
            assert stale.value.status_code == 400
            # the storage SDKs set error_code, from Azure's x-ms-error-code header
            assert getattr(stale.value, "error_code", None) == "PopReceiptMismatch"
            await queue.delete_message(again.id, again.pop_receipt)
            assert await queue.peek_messages(max_messages=32) == []
        finally:
            await queue.delete_queue()


@pytest.mark.usefixtures("azure_stack")
async def test_table_etag_concurrency_and_partition_transactions() -> None:
    async with TableServiceClient.from_connection_string(connection_string()) as service:
        table = await service.create_table(unique("cmrt"))
        try:
            created = await table.create_entity({"PartitionKey": "job", "RowKey": "a", "n": 1})
            etag = created["etag"]
            with pytest.raises(ResourceExistsError):
                await table.create_entity({"PartitionKey": "job", "RowKey": "a", "n": 9})

            # Optimistic concurrency: a replace under the ETag read succeeds once ...
            updated = await table.update_entity(
                {"PartitionKey": "job", "RowKey": "a", "n": 2},
                mode=UpdateMode.REPLACE,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
            assert updated["etag"] != etag
            # ... and one under the stale ETag is refused.
            with pytest.raises(ResourceModifiedError):
                await table.update_entity(
                    {"PartitionKey": "job", "RowKey": "a", "n": 3},
                    mode=UpdateMode.REPLACE,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                )
            read = await table.get_entity("job", "a")
            assert read["n"] == 2
            assert read.metadata["etag"] == updated["etag"]

            # A transaction of two entities in one partition key: both written.
            await table.submit_transaction(
                [
                    ("create", {"PartitionKey": "job", "RowKey": "b", "n": 10}),
                    ("upsert", {"PartitionKey": "job", "RowKey": "c", "n": 11}),
                ]
            )
            # All or nothing: a stale ETag in one operation leaves the other undone too.
            with pytest.raises(TableTransactionError):
                await table.submit_transaction(
                    [
                        ("create", {"PartitionKey": "job", "RowKey": "d", "n": 12}),
                        (
                            "update",
                            {"PartitionKey": "job", "RowKey": "a", "n": 4},
                            {"etag": etag, "match_condition": MatchConditions.IfNotModified},
                        ),
                    ]
                )
            with pytest.raises(ResourceNotFoundError):
                await table.get_entity("job", "d")
            rows = table.query_entities("PartitionKey eq 'job'")
            assert {e["RowKey"]: e["n"] async for e in rows} == {"a": 2, "b": 10, "c": 11}
        finally:
            await service.delete_table(table.table_name)


def test_the_stack_script_exports_the_tests_connection_string() -> None:
    """`scripts/stack.sh env` prints the connection string the tests use: Azurite's public
    development account, its three endpoints on 127.0.0.1 (no stack needed to check)."""
    env = subprocess.run(
        ["bash", str(ROOT / "scripts" / "stack.sh"), "env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = re.search(r"^export AZURE_STORAGE_CONNECTION_STRING='([^']*)'$", env, re.M)
    assert exported is not None, env
    assert exported.group(1) == AZURITE_CONNECTION_STRING
    assert "AWS_ENDPOINT_URL=" in env  # what it printed before is still there
