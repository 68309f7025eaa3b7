"""Billing units: what one request to a service is billed as, by the rules each cloud
publishes (docs/cost.md names the pages).

* **SQS**: every 64 KiB chunk of a request's payload is one billed request: a 200 KB
  message is 4, a SendMessageBatch is billed on its whole payload (all its messages), a
  ReceiveMessage on the payload it returned; every request is at least one.
* **S3**: class A (PUT, COPY, POST, LIST, and each part and call of a multipart upload),
  class B (GET, HEAD and the rest), DELETE free.
* **DynamoDB on demand**: a write is its item's size rounded up to 1 KB in write request
  units (2x in a transaction; a failed conditional write is still charged); a read is
  4 KB of data read per unit when strongly consistent, half when eventual, 2x in a
  transaction; a Query is billed on the total size it read, rounded up to 4 KB. Sizes
  follow DynamoDB's item-size rules (:func:`dynamo_size`).
* **Azure Storage**: one operation per request, priced by the class Azure puts it in
  (blob write, list, read, other; queue class 1 and 2; table transactions).

Control-plane calls a cloud does not charge for (CreateTable, DescribeTable, DeleteObject,
DeleteBlob) are counted as requests with no price.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

SQS_CHUNK = 64 * 1024  # bytes of payload billed as one SQS request
WRITE_UNIT = 1024  # bytes of an item one DynamoDB write request unit covers
READ_UNIT = 4096  # bytes one DynamoDB read request unit covers (strongly consistent)


def sqs_units(payload: int) -> int:
    """Billed SQS requests of one request carrying ``payload`` bytes of messages."""
    return max(1, -(-payload // SQS_CHUNK))


SQS_BATCH_BYTES = 262_144  # a SendMessageBatch's payload at most (SQS's limit)


def _b64(n: int) -> int:
    """Bytes of ``n`` bytes of body as SQS gets them: cmr's bodies travel base64 (text)."""
    return 4 * -(-n // 3) if n else 1


def sqs_send_units(sizes: list[int]) -> int:
    """Billed SQS requests of sending bodies of these raw sizes as the aws backend sends
    them: base64, in SendMessageBatch payloads of 10 entries and 256 KiB at most."""
    batches: list[int] = []
    count = 0
    for size in map(_b64, sizes):
        if not batches or count == 10 or batches[-1] + size > SQS_BATCH_BYTES:
            batches.append(0)
            count = 0
        batches[-1] += size
        count += 1
    return sum(sqs_units(b) for b in batches)


def write_units(size: int, *, transactional: bool = False) -> int:
    """DynamoDB write request units of writing an item of ``size`` bytes."""
    units = max(1, -(-size // WRITE_UNIT))
    return units * 2 if transactional else units


def read_units(size: int, *, consistent: bool = True, transactional: bool = False) -> float:
    """DynamoDB read request units of reading ``size`` bytes (one item, or a Query's page:
    its total). Reading nothing costs the minimum, as a read of a missing item does."""
    units: float = max(1, -(-size // READ_UNIT))
    if transactional:
        return units * 2
    return units if consistent else units / 2


def _number_size(value: Any) -> int:
    """A DynamoDB number's size: one byte per two significant digits, plus one."""
    try:
        digits = format(Decimal(str(value)).normalize(), "f")
    except InvalidOperation:
        return 1
    digits = digits.lstrip("-").replace(".", "").strip("0") or "0"
    return math.ceil(len(digits) / 2) + 1


def dynamo_size(value: Any) -> int:
    """Bytes DynamoDB counts for a value, typed as on the wire ({"S": "..."}) or a plain
    Python value (the embedded table's): strings in UTF-8, binary as is, numbers by their
    digits, 1 byte for a boolean or null, 3 bytes plus one per element for lists and maps
    (docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html)."""
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag in _TYPED:
            return int(_TYPED[tag](inner))
    return _plain(value)


def item_size(item: dict[str, Any]) -> int:
    """An item's size: each attribute's name plus its value."""
    return sum(len(str(k).encode("utf-8")) + dynamo_size(v) for k, v in item.items())


def _plain(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, int | float | Decimal):
        return _number_size(value)
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode("utf-8")) + 1 + _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return 3 + sum(1 + _plain(v) for v in value)
    return len(str(value).encode("utf-8"))


def _binary(v: Any) -> int:
    return len(v) if isinstance(v, bytes | bytearray | memoryview) else len(str(v))


_TYPED: dict[str, Any] = {
    "S": lambda v: len(str(v).encode("utf-8", "surrogatepass")),
    "B": _binary,
    "N": _number_size,
    "BOOL": lambda v: 1,
    "NULL": lambda v: 1,
    "SS": lambda v: sum(len(s.encode("utf-8")) for s in v),
    "BS": lambda v: sum(_binary(b) for b in v),
    "NS": lambda v: sum(_number_size(n) for n in v),
    "L": lambda v: 3 + sum(1 + dynamo_size(e) for e in v),
    "M": lambda v: 3 + sum(len(k.encode("utf-8")) + 1 + dynamo_size(e) for k, e in v.items()),
}


# Price keys: one unit of an operation costs the price table's entry of that name
# (cmr/prices.toml). None: the cloud does not charge for it.
_S3_CLASS_A = {
    "PutObject",
    "CopyObject",
    "PostObject",
    "ListObjects",
    "ListObjectsV2",
    "ListBuckets",
    "ListObjectVersions",
    "ListMultipartUploads",
    "ListParts",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "CreateBucket",
}
_S3_FREE = {"DeleteObject", "DeleteObjects", "AbortMultipartUpload", "DeleteBucket"}
_DYNAMO_READS = {"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"}
_DYNAMO_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
# Azure's classes (learn.microsoft.com/azure/storage/blobs/map-rest-apis-transaction-
# categories, general-purpose v2; the Queue and Table pricing pages). Deletes are free.
_BLOB = {
    "PutBlob": "write",
    "PutBlock": "write",
    "PutBlockList": "write",
    "CopyBlob": "write",
    "CopyBlobFromURL": "write",
    "BlobBatch": "write",
    "ListBlobs": "list",
    "ListContainers": "list",
    "CreateContainer": "list",
    "GetBlob": "read",
    "GetBlockList": "other",
    "GetBlobProperties": "other",
    "GetContainerProperties": "other",
    "DeleteBlob": "",
    "DeleteContainer": "",
}
_QUEUE_CLASS_2 = {"GetMessages", "PeekMessages", "GetQueueMetadata", "GetQueueProperties"}


def price_key(op: str) -> str | None:
    """The price table's key for one unit of ``op`` ("sqs.SendMessageBatch"...)."""
    service, _, name = op.partition(".")
    if service == "sqs":
        return "sqs.requests"
    if service == "s3":
        if name in _S3_FREE:
            return None
        return "s3.class_a" if name in _S3_CLASS_A else "s3.class_b"
    if service == "dynamodb":
        if name in _DYNAMO_READS:
            return "dynamodb.read_units"
        return "dynamodb.write_units" if name in _DYNAMO_WRITES else None
    if service == "blob":
        kind = _BLOB.get(name, "other")
        return f"azure.blob.{kind}" if kind else None
    if service == "queue":
        return "azure.queue.class2" if name in _QUEUE_CLASS_2 else "azure.queue.class1"
    if service == "table":
        return "azure.table.transactions"
    return None


SERVICES = {
    "sqs": "SQS",
    "s3": "S3",
    "dynamodb": "DynamoDB",
    "blob": "Azure Blob",
    "queue": "Azure Queue",
    "table": "Azure Table",
}


def units_of_call(call: Any, result: Any) -> float:
    """Billing units of a protocol call at the middleware seam (the embedded backend, which
    sends no HTTP): what its AWS requests would be billed as. ``result``: what the call
    returned (None if it raised)."""
    service, method = call.service, call.method
    if service == "queues":
        if method == "send":
            return float(sqs_send_units([len(b) for b in call.args[1]]))
        if method == "receive":
            return sqs_units(sum(_b64(len(m.body)) for m in result or ()))
        return float(call.requests)
    if service == "blobs":
        return float(call.requests)
    # The table: DynamoDB's units from the item sizes.
    consistent = call.kwargs.get("consistent", True)
    if method == "get":
        return read_units(item_size(result) if result else 0, consistent=consistent)
    if method == "query":
        return read_units(sum(item_size(i) for i in result or ()), consistent=consistent)
    if method == "put":
        pk, sk, item = call.args
        return write_units(item_size({**item, "pk": pk, "sk": sk}))
    if method == "update":
        w = call.args[0]
        fields = {**(w.set_ or {}), **(w.add or {}), "pk": w.pk, "sk": w.sk}
        return write_units(max(item_size(result) if result else 0, item_size(fields)))
    if method == "delete":
        pk, sk = call.args
        return write_units(item_size({"pk": pk, "sk": sk}))
    if method == "transact":
        return sum(write_units(_tx_size(w), transactional=True) for w in call.args[0])
    return float(call.requests)


def _tx_size(w: Any) -> int:
    """The size a transaction's write is billed on: the item put, the fields updated, or the
    key of a delete or condition check (the item it hits is not known to the client)."""
    keys = {"pk": w.pk, "sk": w.sk}
    item = getattr(w, "item", None)
    if item is not None:
        return item_size({**item, **keys})
    fields = {**(getattr(w, "set_", None) or {}), **(getattr(w, "add", None) or {})}
    return item_size({**fields, **keys})
