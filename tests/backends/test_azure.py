"""The azure backend's own edges: Azure's errors read into cmr's, requests named as Azure
bills them, URLs of one account, and what Azurite does not do as Azure does (named, a
strict expected failure each). The conformance suites (test_blobs, test_queues) hold its
semantics; these need no stack but the last."""

from __future__ import annotations

import socket
import uuid
from collections import Counter
from pathlib import Path

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    DecodeError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
)
from azure.storage.blob.aio import BlobServiceClient

from cmr.backends.azure import AzureBlobs, AzureQueues, classify, translate, translated
from cmr.backends.azure.clients import _operation
from cmr.backends.retry import transient
from cmr.errors import (
    BackendError,
    BlobMissing,
    BucketOrTableMissing,
    ConditionFailed,
    QueueGone,
    Rejected,
    Throttled,
    Unreachable,
    UsageError,
)
from tests.stack import AZURITE_ACCOUNT, AZURITE_CONNECTION_STRING


def failed(
    cls: type[HttpResponseError], status: int, code: str, reason: str = "why"
) -> HttpResponseError:
    """An azure-core failure as the storage SDKs raise it: status, reason, error_code."""
    exc = cls(message=f"{code}: {reason}")
    exc.status_code = status
    exc.reason = reason
    exc.error_code = code  # type: ignore[attr-defined]  # set by the storage SDKs
    return exc


@pytest.mark.parametrize(
    ("service", "exc", "ours"),
    [
        ("blob", failed(ResourceNotFoundError, 404, "BlobNotFound"), BlobMissing),
        ("blob", failed(ResourceNotFoundError, 404, "ContainerNotFound"), BucketOrTableMissing),
        ("blob", failed(ResourceModifiedError, 412, "ConditionNotMet"), ConditionFailed),
        ("blob", failed(ResourceExistsError, 409, "BlobAlreadyExists"), ConditionFailed),
        ("blob", failed(HttpResponseError, 503, "ServerBusy"), Throttled),
        ("blob", failed(HttpResponseError, 500, "OperationTimedOut"), Throttled),
        ("blob", failed(HttpResponseError, 500, "InternalError"), BackendError),
        ("blob", failed(HttpResponseError, 413, "RequestBodyTooLarge"), Rejected),
        ("blob", failed(HttpResponseError, 400, "InvalidBlockList"), Rejected),
        ("blob", failed(ClientAuthenticationError, 403, "AuthenticationFailed"), Unreachable),
        ("blob", failed(HttpResponseError, 403, "AuthorizationPermissionMismatch"), Unreachable),
        ("queue", failed(ResourceNotFoundError, 404, "QueueNotFound"), QueueGone),
        ("queue", failed(HttpResponseError, 409, "QueueBeingDeleted"), QueueGone),
        ("queue", failed(HttpResponseError, 400, "PopReceiptMismatch"), BackendError),
        ("queue", failed(ResourceNotFoundError, 404, "MessageNotFound"), BackendError),
        ("queue", failed(ResourceExistsError, 409, "QueueAlreadyExists"), BackendError),
        ("queue", ServiceResponseError("the answer was cut short"), BackendError),
        ("queue", ServiceRequestTimeoutError("no connection in time"), BackendError),
        ("queue", ServiceRequestError("connection reset"), BackendError),
        ("queue", DecodeError("not XML"), BackendError),
    ],
)
def test_every_azure_failure_is_ours(
    service: str, exc: BaseException, ours: type[BackendError]
) -> None:
    assert classify(service, exc) is ours
    with pytest.raises(ours) as raised, translate(service, "subject", "Op"):
        raise exc
    assert type(raised.value) is ours
    assert raised.value.__cause__ is exc
    assert raised.value.service == service and raised.value.operation == "Op"
    assert raised.value.code == str(getattr(exc, "error_code", "") or "")


def test_what_is_retried() -> None:
    """Busy, broken on its side, or a connection lost: retried. Answers are not."""
    assert transient(translated("blob", failed(HttpResponseError, 503, "ServerBusy")))
    assert transient(translated("blob", failed(HttpResponseError, 500, "InternalError")))
    assert transient(translated("blob", ServiceResponseError("cut short")))
    assert not transient(translated("blob", failed(HttpResponseError, 412, "ConditionNotMet")))
    assert not transient(translated("queue", failed(HttpResponseError, 404, "QueueNotFound")))


def test_nobody_listening_is_unreachable_and_says_where_to_look() -> None:
    refused = ServiceRequestError("Cannot connect to host", error=ConnectionRefusedError(111, "x"))
    unresolved = ServiceRequestError("Cannot connect", error=socket.gaierror(-2, "no name"))
    for exc in (refused, unresolved):
        assert classify("blob", exc) is Unreachable
        with pytest.raises(Unreachable, match="AZURE_STORAGE_CONNECTION_STRING"), translate("blob"):
            raise exc


def test_the_storage_code_is_kept_as_azure_names_it() -> None:
    """The storage SDKs give error_code as a StorageErrorCode (a str enum): the code on our
    error is its value, what the x-ms-error-code header said."""
    from azure.storage.blob import StorageErrorCode

    exc = failed(HttpResponseError, 416, "x")
    exc.error_code = StorageErrorCode.INVALID_RANGE  # type: ignore[attr-defined]
    with pytest.raises(BackendError) as raised, translate("blob"):
        raise exc
    assert raised.value.code == "InvalidRange"


@pytest.mark.parametrize(
    ("service", "method", "path", "headers", "op"),
    [
        ("blob", "PUT", "/acct/c/k?", {}, "PutBlob"),
        ("blob", "PUT", "/acct/c/k", {"x-ms-copy-source": "http://x"}, "CopyBlob"),
        ("blob", "PUT", "/acct/c/k?comp=block&blockid=YQ%3D%3D", {}, "PutBlock"),
        ("blob", "PUT", "/acct/c/k?comp=blocklist", {}, "PutBlockList"),
        ("blob", "GET", "/acct/c/k", {}, "GetBlob"),
        ("blob", "HEAD", "/acct/c/k", {}, "GetBlobProperties"),
        ("blob", "DELETE", "/acct/c/k", {}, "DeleteBlob"),
        ("blob", "GET", "/acct/c?restype=container&comp=list&prefix=p", {}, "ListBlobs"),
        ("blob", "PUT", "/acct/c?restype=container", {}, "CreateContainer"),
        ("queue", "POST", "/acct/q/messages?messagettl=9", {}, "PutMessage"),
        ("queue", "GET", "/acct/q/messages?numofmessages=32", {}, "GetMessages"),
        ("queue", "GET", "/acct/q/messages?peekonly=true", {}, "PeekMessages"),
        ("queue", "DELETE", "/acct/q/messages/id?popreceipt=p", {}, "DeleteMessage"),
        ("queue", "PUT", "/acct/q/messages/id?popreceipt=p", {}, "UpdateMessage"),
        ("queue", "PUT", "/acct/q", {}, "CreateQueue"),
        ("queue", "DELETE", "/acct/q", {}, "DeleteQueue"),
        ("queue", "GET", "/acct/q?comp=metadata", {}, "GetQueueMetadata"),
        ("queue", "GET", "/acct/?comp=list&prefix=p", {}, "ListQueues"),
        ("table", "POST", "/acct/Tables", {}, "CreateTable"),
        ("table", "GET", "/acct/Tables()?$filter=x", {}, "QueryTables"),
        ("table", "POST", "/acct/t1", {}, "InsertEntity"),
        ("table", "GET", "/acct/t1(PartitionKey='a',RowKey='b')", {}, "QueryEntity"),
        ("table", "GET", "/acct/t1()?$filter=PartitionKey%20eq%20'a'", {}, "QueryEntities"),
        (
            "table",
            "PUT",
            "/acct/t1(PartitionKey='a',RowKey='b')",
            {"If-Match": "e"},
            "UpdateEntity",
        ),
        ("table", "PUT", "/acct/t1(PartitionKey='a',RowKey='b')", {}, "InsertOrReplaceEntity"),
        (
            "table",
            "PATCH",
            "/acct/t1(PartitionKey='a',RowKey='b')",
            {"If-Match": "e"},
            "MergeEntity",
        ),
        (
            "table",
            "DELETE",
            "/acct/t1(PartitionKey='a',RowKey='b')",
            {"If-Match": "*"},
            "DeleteEntity",
        ),
        ("table", "POST", "/acct/$batch", {}, "EntityGroupTransaction"),
    ],
)
def test_requests_are_named_as_azure_names_its_operations(
    service: str, method: str, path: str, headers: dict[str, str], op: str
) -> None:
    assert _operation(service, method, f"http://127.0.0.1:10000{path}", headers) == op


async def test_urls_name_the_account_container_and_key() -> None:
    async with AzureBlobs(AZURITE_CONNECTION_STRING) as blobs:
        assert blobs.url("c", "a/b") == f"azure://{AZURITE_ACCOUNT}/c/a/b"
        for wrong in ("s3://bucket/key", "file:///tmp/x", "azure://", "azure://acct"):
            with pytest.raises(UsageError):
                await blobs.get(wrong)
        # another account than the connection string's: refused, never read from ours
        with pytest.raises(UsageError, match="is not the one"):
            await blobs.get("azure://otheraccount/c/key")
        assert blobs.calls == Counter()  # nothing was sent


async def test_no_setting_no_client() -> None:
    with pytest.raises(Unreachable, match="AZURE_STORAGE_CONNECTION_STRING"):
        AzureBlobs()
    with pytest.raises(Unreachable, match="AZURE_STORAGE_CONNECTION_STRING"):
        AzureQueues()


async def test_oversized_message_refused_before_sending() -> None:
    """Azure's 64 KiB is of the encoded text: 48 KiB of raw body, checked before a send."""
    async with AzureQueues(AZURITE_CONNECTION_STRING) as queues:
        assert queues.max_message_bytes == 49_152
        with pytest.raises(UsageError):
            await queues.send("never-made", [b"x" * 49_153])
        assert queues.calls == Counter()


@pytest.mark.emulator_gap(
    backend="azure",
    reason="Blob Batch from the async SDK: its multipart boundary is '===============N==' "
    "(unquoted, '=' inside), which Azurite reads as empty: it answers one part, 400 "
    "InvalidInput, for the whole batch (the sync SDK's 'batch_<uuid>' boundary is answered "
    "part by part). Not checked against Azure; AzureBlobs.delete sends a Delete Blob a blob",
    raises=AssertionError,
)
@pytest.mark.usefixtures("azure_stack")
async def test_async_blob_batch_delete() -> None:
    async with BlobServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as service:
        container = service.get_container_client(f"cmrt-{uuid.uuid4().hex[:12]}")
        await container.create_container()
        try:
            await container.get_blob_client("a").upload_blob(b"x")
            await container.get_blob_client("b/c").upload_blob(b"y")
            got = await container.delete_blobs("a", "none", "b/c", raise_on_any_failure=False)
            assert [r.status_code async for r in got] == [202, 404, 202]
        finally:
            await container.delete_container()


@pytest.mark.usefixtures("azure_stack")
async def test_a_queues_visibility_is_its_own_for_every_client() -> None:
    """Azure queues keep no visibility timeout: the one given at creation lives in the
    queue's metadata, so a worker that did not create the queue applies it too."""
    name = f"cmrt-{uuid.uuid4().hex[:12]}"
    async with AzureQueues(AZURITE_CONNECTION_STRING) as maker:
        await maker.create(name, visibility_s=1)
        try:
            await maker.send(name, [b"leased for a second"])
            async with AzureQueues(AZURITE_CONNECTION_STRING) as worker:
                [first] = await worker.receive(name, wait_s=1)
                assert await worker.receive(name) == []
                [again] = await worker.receive(name, wait_s=3)
                assert (again.message_id, again.receive_count) == (first.message_id, 2)
                assert worker.calls["queue.GetQueueMetadata"] == 1  # read once, then known
        finally:
            await maker.delete(name)


async def test_open_azure_refuses_a_store_of_another_account(azure_stack: str) -> None:
    """The store URL names an account; the connection string opens another: refused, never
    run in the wrong account."""
    from cmr.backends.azure.opening import open_azure
    from cmr.settings import AwsSettings

    with pytest.raises(UsageError, match=f"account 'other1'.*opens '{AZURITE_ACCOUNT}'"):
        async with open_azure(AwsSettings(account="other1")):
            pass


async def test_an_endpoint_nobody_listens_on_is_said_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection string whose table endpoint is closed: the opening's probe names that
    endpoint (the SDK alone would retry for ~17 s and then say less)."""
    from cmr.backends.azure.opening import open_azure
    from cmr.settings import AwsSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    closed = AZURITE_CONNECTION_STRING.replace(
        "TableEndpoint=http://127.0.0.1:10002", f"TableEndpoint=http://127.0.0.1:{port}"
    )
    assert str(port) in closed
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", closed)
    with pytest.raises(Unreachable, match=f"table storage at http://127.0.0.1:{port}/"):
        async with open_azure(AwsSettings()):
            pass


def test_status_of_a_store_no_job_has_used_says_so(azure_stack: str, tmp_path: Path) -> None:
    from tests.engine.test_status_cli import cmr

    store = f"azure://{AZURITE_ACCOUNT}/nothing-{uuid.uuid4().hex[:8]}/nothing1"
    done = cmr("status", "--store", store, XDG_STATE_HOME=str(tmp_path))
    assert done.returncode == 1
    assert "container nothing-" in done.stderr
    assert "does not exist: no job has run in this store" in done.stderr
    assert "Traceback" not in done.stderr
