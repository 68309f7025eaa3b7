"""What the blob and queue clients share: Azure's standard setting, the SDK's bounded retry
policy, and request counting by Azure's operation names.

Clients are made from ``AZURE_STORAGE_CONNECTION_STRING`` alone, as Azure's own tools make
them: Azurite is Azure with other endpoints in that string, never a code path of its own.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any
from urllib.parse import parse_qsl, urlparse

from azure.core.pipeline import PipelineRequest

from cmr import usage
from cmr.errors import Unreachable

SETTING = "AZURE_STORAGE_CONNECTION_STRING"

# The storage SDKs' ExponentialRetry, bounded: 4 retries after about 1, 3, 5 and 9 s (each
# +-1 s of jitter), on connection errors, timeouts, 408, 429 (never sent by storage) and
# 5xx, then the engine's Retry middleware. The SDK's default waits 15 s before its first
# retry, longer than a worker's lease renewals can spare.
RETRY: dict[str, Any] = {
    "retry_total": 4,
    "initial_backoff": 1,
    "increment_base": 2,
    "random_jitter_range": 1,
    "connection_timeout": 20,  # s to connect (the SDK's default)
    "read_timeout": 60,  # s between bytes of an answer (the SDK's default)
}


def connection_string(given: str | None = None) -> str:
    """The connection string given, else Azure's standard setting."""
    value = given if given is not None else os.environ.get(SETTING, "")
    if not value:
        raise Unreachable(
            f"no Azure storage account: set {SETTING} "
            '(for the local stack\'s Azurite: eval "$(scripts/stack.sh env)")'
        )
    return value


def _operation(service: str, method: str, url: str, headers: Any) -> str:
    """Azure's REST operation name of a request (Put Blob, Get Messages ...), read from its
    method, path and ``comp``/``restype`` parameters: the SDK names none."""
    parts = urlparse(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    comp, restype = query.get("comp", ""), query.get("restype", "")
    if service == "blob":
        if restype == "container":
            op = {"list": "ListBlobs", "batch": "BlobBatch"}.get(comp, "")
            return op or {"PUT": "CreateContainer", "DELETE": "DeleteContainer"}.get(
                method, "GetContainerProperties"
            )
        if comp == "list":
            return "ListContainers"
        if comp == "block":
            return "PutBlock"
        if comp == "blocklist":
            return "PutBlockList" if method == "PUT" else "GetBlockList"
        if method == "PUT":
            if "x-ms-copy-source" in headers:
                sync = headers.get("x-ms-requires-sync", "").lower() == "true"
                return "CopyBlobFromURL" if sync else "CopyBlob"
            return "PutBlob"
        return {"GET": "GetBlob", "HEAD": "GetBlobProperties", "DELETE": "DeleteBlob"}.get(
            method, method
        )
    if service == "table":
        return _table_operation(method, urlparse(url).path, headers)
    # queue: /queue, /queue/messages, /queue/messages/id (after Azurite's /account)
    path = parts.path.rstrip("/")
    if comp == "list":
        return "ListQueues"
    if comp == "metadata":
        return "SetQueueMetadata" if method == "PUT" else "GetQueueMetadata"
    if path.endswith("/messages"):
        if method == "GET":
            return "PeekMessages" if query.get("peekonly") == "true" else "GetMessages"
        return {"POST": "PutMessage", "DELETE": "ClearMessages"}.get(method, method)
    if "/messages/" in path:
        return {"DELETE": "DeleteMessage", "PUT": "UpdateMessage"}.get(method, method)
    return {"PUT": "CreateQueue", "DELETE": "DeleteQueue"}.get(method, method)


def _table_operation(method: str, path: str, headers: Any) -> str:
    """Table storage's operation of a request: /Tables for the tables, /$batch for an
    entity-group transaction, /name(PartitionKey=..,RowKey=..) for one entity."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if last.startswith("Tables"):
        return {"POST": "CreateTable", "DELETE": "DeleteTable"}.get(method, "QueryTables")
    if last == "$batch":
        return "EntityGroupTransaction"
    conditional = "If-Match" in headers or "if-match" in headers
    if "(PartitionKey=" in last or "(PartitionKey%3D" in last:
        if method == "GET":
            return "QueryEntity"
        if method == "DELETE":
            return "DeleteEntity"
        if method == "PUT":
            return "UpdateEntity" if conditional else "InsertOrReplaceEntity"
        return "MergeEntity" if conditional else "InsertOrMergeEntity"
    return "InsertEntity" if method == "POST" else "QueryEntities"


class Counting:
    """Counts every request a client sends, by operation (``blob.PutBlob``,
    ``queue.GetMessages`` ...): the storage SDKs' ``raw_request_hook``, which their
    pipeline calls after its retry policy, so retries count too. Each is also charged to the
    job it serves (cmr.usage): Azure bills storage requests one operation each, by class
    (cmr.billing.price_key); a message is at most 64 KiB, one operation."""

    def __init__(self, service: str, calls: Counter[str]) -> None:
        self._service = service
        self._calls = calls

    def __call__(self, request: PipelineRequest[Any]) -> None:
        http = request.http_request
        op = _operation(self._service, http.method, http.url, http.headers)
        name = f"{self._service}.{op}"
        self._calls[name] += 1
        usage.charge(name)
