"""The protocols on SQS, S3 and DynamoDB through aioboto3.

LocalStack and DynamoDB Local are this backend with other endpoints: botocore reads
``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_<SERVICE>`` itself, so no code path here knows
about them. Every botocore failure is translated into :mod:`cmr.errors` by :func:`_translate`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import io
import math
import os
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aioboto3
from aiobotocore.config import AioConfig
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)

from cmr.backends.base import (
    AllOf,
    AnyOf,
    Backend,
    BlobInfo,
    Check,
    Condition,
    Delete,
    Eq,
    Item,
    Lt,
    Missing,
    Present,
    Put,
    Received,
    TxWrite,
    Update,
)
from cmr.backends.embedded import MAX_MESSAGE_BYTES, SQS_BODY_LIMIT
from cmr.errors import (
    BackendError,
    BlobMissing,
    ConditionFailed,
    QueueGone,
    Rejected,
    Throttled,
    Unreachable,
    UsageError,
)
from cmr.settings import AwsSettings

# SQS's longest: a job that waits days for a fleet must not lose its tasks (and if it does,
# a worker re-sends them from the plan: see cmr.janitor).
RETENTION_S = 14 * 24 * 3600
COPY_PART_BYTES = 512 * 1024 * 1024  # multipart copy part size, past CopyObject's 5 GiB
COPY_MAX_BYTES = 5 * 1024**3
SEND_CONCURRENCY = 8  # SendMessageBatch calls in flight per send()
SEND_RETRIES = 3  # rounds of resending entries SQS reported as failed
PART_BYTES = 8 * 1024 * 1024  # multipart upload part size (S3's minimum is 5 MiB)
PARTS_IN_FLIGHT = 4  # bounds upload memory to PART_BYTES * PARTS_IN_FLIGHT

_THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "SlowDown",
    "ServiceUnavailable",
    "AWS.SimpleQueueService.RequestThrottled",
}
_QUEUE_GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_DENIED = {
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidSecurity",
    "MissingAuthenticationToken",
    "AuthFailure",
}
_BLOB_MISSING = {"NoSuchKey", "404", "NotFound"}
# The request itself is wrong: the same request will fail the same way.
_REJECTED = {
    "ValidationException",
    "SerializationException",
    "ItemCollectionSizeLimitExceededException",
    "EntityTooLarge",
    "InvalidArgument",
    "KeyTooLongError",
    "InvalidObjectState",
}
_PRECONDITION = {"PreconditionFailed", "412"}
_STALE_RECEIPT = {
    "ReceiptHandleIsInvalid",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
    "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
}
_CREDENTIALS_HINT = (
    "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    '(for the local stack: eval "$(scripts/stack.sh env)")'
)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _query_code(exc: ClientError) -> str:
    """SQS's JSON protocol carries the older query-protocol code beside the new one."""
    return str(exc.response.get("Error", {}).get("QueryErrorCode", ""))


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _translated(service: str, exc: Exception, subject: str = "") -> BackendError:
    """Our error for a botocore failure; ``subject`` names the queue, URL or key involved."""
    about = f" ({subject})" if subject else ""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return Unreachable(f"no usable AWS credentials for {service}: {_CREDENTIALS_HINT}")
    if isinstance(exc, EndpointConnectionError):
        url = str(exc.kwargs.get("endpoint_url", "?"))
        hint = "; start it with `scripts/stack.sh start`" if _is_loopback(url) else ""
        return Unreachable(f"cannot reach {service} at {url}{hint}")
    if isinstance(exc, ProfileNotFound):
        return Unreachable(f"{exc}: fix AWS_PROFILE or the cmr profile setting")
    if not isinstance(exc, ClientError):
        return BackendError(f"{service}: {exc}{about}")
    code = _error_code(exc)
    op = exc.operation_name
    message = exc.response.get("Error", {}).get("Message") or code
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _THROTTLING or status == 503:
        return Throttled(f"{service}.{op} throttled{about}: {message}")
    if code in _DENIED:
        return Unreachable(
            f"{service}.{op} access denied{about}: {message}; check the credentials and "
            "the IAM policy"
        )
    if service == "sqs" and (code in _QUEUE_GONE or _query_code(exc) in _QUEUE_GONE):
        return QueueGone(f"queue {subject or '?'} does not exist")
    if code == "ConditionalCheckFailedException":
        return ConditionFailed(f"condition failed on {subject or '?'}")
    if code == "TransactionCanceledException":
        reasons = [str(r.get("Code", "")) for r in exc.response.get("CancellationReasons", [])]
        if "ConditionalCheckFailed" in reasons:
            return ConditionFailed(f"transaction cancelled: a condition failed ({subject})")
        if "ValidationError" in reasons or "ItemCollectionSizeLimitExceeded" in reasons:
            return Rejected(f"{service}.{op} rejected{about}: {', '.join(reasons)}")
        return Throttled(f"{service}.{op} conflicted{about}: {', '.join(reasons)}")
    if code == "TransactionInProgressException":
        return Throttled(f"{service}.{op}: the same transaction is in progress{about}")
    if service == "s3" and code in _PRECONDITION:
        return ConditionFailed(f"precondition failed on {subject or '?'}")
    if code in _REJECTED:
        return Rejected(f"{service}.{op} rejected{about}: {code}: {message}")
    if service == "s3" and code in _BLOB_MISSING:
        return BlobMissing(f"no blob at {subject or '?'}")
    if code == "NoSuchBucket":
        return BackendError(f"s3.{op}: bucket does not exist{about}: {message}")
    if code == "ResourceNotFoundException":
        return BackendError(f"{service}.{op}: table does not exist{about}: {message}")
    return BackendError(f"{service}.{op} failed{about}: {code}: {message}")


@contextmanager
def _translate(service: str, subject: str = "") -> Iterator[None]:
    """Re-raise botocore's exceptions as ours, like httpx's ``map_httpcore_exceptions``."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise _translated(service, exc, subject) from exc


def _counting(calls: Counter[str]) -> Any:
    """An event handler counting every HTTP request a client sends, retries included."""

    def count(event_name: str, **_kwargs: Any) -> None:
        _, service, op = event_name.split(".", 2)
        calls[f"{service}.{op}"] += 1

    return count


async def _all(calls: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run the calls concurrently; the first failure is raised as itself, not as a group."""
    try:
        async with asyncio.TaskGroup() as tg:
            for call in calls:
                tg.create_task(call)
    except ExceptionGroup as group:
        first = group.exceptions[0]
        raise first from first.__cause__


def _stale_receipt(failure: dict[str, Any]) -> bool:
    """A per-entry failure that only means the message was deleted, re-delivered or its lease
    expired: the protocol says to ignore those."""
    code = str(failure.get("Code", ""))
    if code in _STALE_RECEIPT:
        return True
    # "Value ... for parameter ReceiptHandle is invalid. Reason: Message does not exist ..."
    return code.startswith("InvalidParameterValue") and "ReceiptHandle" in str(
        failure.get("Message", "")
    )


def _encode_body(body: bytes) -> str:
    # SQS bodies are text, and must not be empty: "=" (never produced by base64) stands for b"".
    return base64.b64encode(body).decode("ascii") if body else "="


def _decode_body(text: str) -> bytes:
    if text == "=":
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        # Not ours: hand the engine the raw text so its decoder rejects it with a log line.
        return text.encode("utf-8", "surrogateescape")


def _batches(bodies: Sequence[str]) -> list[list[str]]:
    """Encoded bodies cut into SendMessageBatch payloads (10 entries, 256 KiB at most)."""
    out: list[list[str]] = []
    size = 0
    for b in bodies:
        if not out or len(out[-1]) == 10 or size + len(b) > SQS_BODY_LIMIT:
            out.append([])
            size = 0
        out[-1].append(b)
        size += len(b)
    return out


class AwsQueues:
    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(self, client: Any) -> None:
        self._sqs = client
        self._urls: dict[str, str] = {}
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-send.sqs", _counting(self.calls))

    async def _url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            with _translate("sqs", name):
                url = str((await self._sqs.get_queue_url(QueueName=name))["QueueUrl"])
            self._urls[name] = url
        return url

    async def _call(self, name: str, op: str, **kwargs: Any) -> dict[str, Any]:
        url = await self._url(name)
        try:
            with _translate("sqs", name):
                result: dict[str, Any] = await getattr(self._sqs, op)(QueueUrl=url, **kwargs)
        except QueueGone:
            self._urls.pop(name, None)  # the name may be reused by a new queue later
            raise
        return result

    async def create(self, name: str, *, visibility_s: int) -> None:
        attrs = {"VisibilityTimeout": str(visibility_s), "MessageRetentionPeriod": str(RETENTION_S)}
        try:
            with _translate("sqs", name):
                got = await self._sqs.create_queue(QueueName=name, Attributes=attrs)
        except BackendError as exc:
            # Exists with other attributes: keep it as it is, like the embedded backend does.
            cause = exc.__cause__
            if not isinstance(cause, ClientError) or "QueueAlreadyExists" not in (
                _error_code(cause),
                _query_code(cause),
            ):
                raise
            self._urls.pop(name, None)
            await self._url(name)
            return
        self._urls[name] = str(got["QueueUrl"])

    async def delete(self, name: str) -> None:
        with suppress(QueueGone):
            await self._call(name, "delete_queue")
        self._urls.pop(name, None)

    async def list(self, prefix: str) -> list[str]:
        names: list[str] = []
        kwargs: dict[str, Any] = {"QueueNamePrefix": prefix, "MaxResults": 1000}
        while True:
            with _translate("sqs", f"prefix {prefix}"):
                page = await self._sqs.list_queues(**kwargs)
            names += [u.rsplit("/", 1)[-1] for u in page.get("QueueUrls", [])]
            if not page.get("NextToken"):
                return sorted(names)
            kwargs["NextToken"] = page["NextToken"]

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        for body in bodies:
            if len(body) > self.max_message_bytes:
                raise UsageError(
                    f"message of {len(body)} bytes exceeds the queue limit of "
                    f"{self.max_message_bytes}"
                )
        if not bodies:
            return
        await self._url(name)  # resolve once, not in every concurrent batch
        gate = asyncio.Semaphore(SEND_CONCURRENCY)

        async def send_batch(batch: list[str]) -> None:
            pending = dict(enumerate(batch))
            async with gate:
                for _ in range(SEND_RETRIES + 1):
                    entries = [{"Id": str(i), "MessageBody": b} for i, b in pending.items()]
                    got = await self._call(name, "send_message_batch", Entries=entries)
                    failed = got.get("Failed", [])
                    if not failed:
                        return
                    if any(f.get("SenderFault") for f in failed):
                        break  # resending an entry SQS calls malformed cannot help
                    pending = {int(f["Id"]): pending[int(f["Id"])] for f in failed}
                    await asyncio.sleep(0.1)
            first = failed[0]
            raise BackendError(
                f"sqs.SendMessageBatch failed ({name}): {len(failed)} messages not sent: "
                f"{first.get('Code')}: {first.get('Message')}"
            )

        await _all(send_batch(b) for b in _batches([_encode_body(b) for b in bodies]))

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:  # `list` is a method here
        kwargs: dict[str, Any] = {
            "MaxNumberOfMessages": max(1, min(10, max_messages)),
            # SQS takes whole seconds: round up, so that a short wait never becomes a short
            # poll (an immediate, often empty, billed answer); only 0 asks for one.
            "WaitTimeSeconds": max(0, min(20, math.ceil(wait_s))),
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if visibility_s is not None:
            kwargs["VisibilityTimeout"] = visibility_s
        got = await self._call(name, "receive_message", **kwargs)
        return [
            Received(
                _decode_body(m["Body"]),
                m["ReceiptHandle"],
                m["MessageId"],
                int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
            )
            for m in got.get("Messages", [])
        ]

    async def _per_receipt(self, name: str, op: str, receipts: Sequence[str], **extra: Any) -> None:
        async def batch(chunk: Sequence[str]) -> None:
            entries = [{"Id": str(i), "ReceiptHandle": r, **extra} for i, r in enumerate(chunk)]
            got = await self._call(name, op, Entries=entries)
            failed = [f for f in got.get("Failed", []) if not _stale_receipt(f)]
            if failed:
                raise BackendError(
                    f"sqs.{op} failed ({name}): {failed[0].get('Code')}: {failed[0].get('Message')}"
                )

        if not receipts:
            return
        await self._url(name)
        await _all(batch(receipts[i : i + 10]) for i in range(0, len(receipts), 10))

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        await self._per_receipt(name, "delete_message_batch", receipts)

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        await self._per_receipt(
            name, "change_message_visibility_batch", receipts, VisibilityTimeout=seconds
        )

    async def counts(self, name: str) -> tuple[int, int]:
        got = await self._call(
            name,
            "get_queue_attributes",
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        attrs = got.get("Attributes", {})
        return (
            int(attrs.get("ApproximateNumberOfMessages", 0)),
            int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
        )


def _split(url: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://`` URL."""
    if not url.startswith("s3://"):
        raise UsageError(f"{url!r}: the aws backend stores blobs in S3: use s3://bucket/key URLs")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise UsageError(f"{url!r}: no bucket in this s3:// URL")
    return bucket, key


class AwsBlobs:
    def __init__(self, client: Any) -> None:
        self._s3 = client
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-send.s3", _counting(self.calls))

    async def put(self, url: str, data: bytes) -> None:
        bucket, key = _split(url)
        with _translate("s3", url):
            # aiohttp warns that a large bytes body blocks the loop; a BytesIO is streamed.
            await self._s3.put_object(Bucket=bucket, Key=key, Body=io.BytesIO(data))

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        bucket, key = _split(url)
        cond = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        with _translate("s3", url):
            got = await self._s3.put_object(Bucket=bucket, Key=key, Body=io.BytesIO(data), **cond)
        return str(got["ETag"])

    async def get(self, url: str) -> bytes:
        return (await self.get_with_etag(url))[0]

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        bucket, key = _split(url)
        with _translate("s3", url):
            got = await self._s3.get_object(Bucket=bucket, Key=key)
            async with got["Body"] as stream:
                data: bytes = await stream.read()
        return data, str(got["ETag"])

    async def copy(self, src: str, dst: str) -> None:
        sb, sk = _split(src)
        db, dk = _split(dst)
        size = await self.size(src)
        if size <= COPY_MAX_BYTES:
            with _translate("s3", src):
                await self._s3.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
            return
        # Past 5 GiB CopyObject refuses: copy in parts, still inside S3.
        with _translate("s3", dst):
            upload_id = (await self._s3.create_multipart_upload(Bucket=db, Key=dk))["UploadId"]
        etags: dict[int, str] = {}
        gate = asyncio.Semaphore(PARTS_IN_FLIGHT)

        async def part(number: int) -> None:
            start = (number - 1) * COPY_PART_BYTES
            end = min(size, start + COPY_PART_BYTES) - 1
            async with gate:
                with _translate("s3", src):
                    got = await self._s3.upload_part_copy(
                        Bucket=db,
                        Key=dk,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": sb, "Key": sk},
                        CopySourceRange=f"bytes={start}-{end}",
                    )
            etags[number] = got["CopyPartResult"]["ETag"]

        try:
            parts = (size + COPY_PART_BYTES - 1) // COPY_PART_BYTES
            await _all(part(n) for n in range(1, parts + 1))
            with _translate("s3", dst):
                await self._s3.complete_multipart_upload(
                    Bucket=db,
                    Key=dk,
                    UploadId=upload_id,
                    MultipartUpload={
                        "Parts": [{"ETag": etags[n], "PartNumber": n} for n in sorted(etags)]
                    },
                )
        except BaseException:
            with suppress(ClientError, BotoCoreError):
                await self._s3.abort_multipart_upload(Bucket=db, Key=dk, UploadId=upload_id)
            raise

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        bucket, key = _split(url)
        start = max(0, start)
        if start >= end:
            await self.size(url)  # still BlobMissing when there is no blob
            return b""
        try:
            with _translate("s3", url):
                got = await self._s3.get_object(
                    Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
                )
                async with got["Body"] as stream:
                    data: bytes = await stream.read()
        except BackendError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and _error_code(cause) in ("InvalidRange", "416"):
                return b""  # start at or past the end of the blob
            raise
        return data

    async def size(self, url: str) -> int:
        bucket, key = _split(url)
        with _translate("s3", url):
            got = await self._s3.head_object(Bucket=bucket, Key=key)
        return int(got["ContentLength"])

    async def list(self, prefix: str) -> list[BlobInfo]:
        bucket, key = _split(prefix)
        found: list[BlobInfo] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        while True:
            with _translate("s3", prefix):
                page = await self._s3.list_objects_v2(**kwargs)
            found += [
                BlobInfo(f"s3://{bucket}/{o['Key']}", int(o["Size"]))
                for o in page.get("Contents", [])
            ]
            if not page.get("IsTruncated"):
                return sorted(found, key=lambda b: b.url)
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    async def delete_prefix(self, prefix: str) -> int:
        found = await self.list(prefix)
        await self.delete([b.url for b in found])
        return len(found)

    async def delete(self, urls: Sequence[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for url in urls:
            bucket, key = _split(url)
            by_bucket.setdefault(bucket, []).append(key)

        async def delete(bucket: str, chunk: list[str]) -> None:
            with _translate("s3", f"s3://{bucket}/{chunk[0]}"):
                got = await self._s3.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                )
            if got.get("Errors"):
                e = got["Errors"][0]
                raise BackendError(
                    f"s3.DeleteObjects failed (s3://{bucket}): {len(got['Errors'])} not "
                    f"deleted, first {e.get('Key')}: {e.get('Code')}: {e.get('Message')}"
                )

        await _all(
            delete(bucket, keys[i : i + 1000])
            for bucket, keys in by_bucket.items()
            for i in range(0, len(keys), 1000)
        )

    async def upload_file(self, path: str, url: str) -> None:
        # Our own multipart upload: aioboto3's managed one sends parts as raw bytes, which
        # aiohttp warns may block the event loop.
        bucket, key = _split(url)
        size = (await asyncio.to_thread(os.stat, path)).st_size
        if size <= PART_BYTES:
            await self.put(url, await asyncio.to_thread(Path(path).read_bytes))
            return
        with _translate("s3", url):
            upload_id = (await self._s3.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]
        gate = asyncio.Semaphore(PARTS_IN_FLIGHT)
        etags: dict[int, str] = {}

        def read(offset: int) -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(PART_BYTES)

        async def part(number: int) -> None:
            async with gate:
                chunk = await asyncio.to_thread(read, (number - 1) * PART_BYTES)
                with _translate("s3", url):
                    got = await self._s3.upload_part(
                        Bucket=bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=io.BytesIO(chunk),
                    )
                etags[number] = got["ETag"]

        try:
            await _all(part(n) for n in range(1, (size + PART_BYTES - 1) // PART_BYTES + 1))
            with _translate("s3", url):
                await self._s3.complete_multipart_upload(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={
                        "Parts": [{"ETag": etags[n], "PartNumber": n} for n in sorted(etags)]
                    },
                )
        except BaseException:
            # Parts of an unfinished upload are stored (and billed) until it is aborted.
            with suppress(ClientError, BotoCoreError):
                await self._s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise

    async def download_file(self, url: str, path: str) -> None:
        bucket, key = _split(url)
        dst = Path(path)
        await asyncio.to_thread(dst.parent.mkdir, parents=True, exist_ok=True)
        # The transfer writes as it goes: a failed download must not leave a partial file.
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.part")
        try:
            with _translate("s3", url):
                await self._s3.download_file(bucket, key, str(tmp))
        except Exception as exc:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)
            # aioboto3 wraps part failures in a bare Exception whose cause is the ClientError.
            if not isinstance(exc, BackendError) and isinstance(
                exc.__cause__, ClientError | BotoCoreError
            ):
                raise _translated("s3", exc.__cause__, url) from exc.__cause__
            raise
        await asyncio.to_thread(tmp.replace, dst)


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _to_dynamo(value: Any) -> Any:
    """Our value types in the forms TypeSerializer accepts (it refuses float and tuple)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        # repr is the shortest string that reads back as the same float.
        return Decimal(repr(value))
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list | tuple):
        return [_to_dynamo(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Binary):
        return bytes(value.value)
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    return value


def _serialize(value: Any) -> Any:
    try:
        return _serializer.serialize(_to_dynamo(value))
    except (TypeError, ArithmeticError) as exc:
        raise UsageError(f"cannot store {value!r} in DynamoDB: {exc}") from exc


def _serialize_item(item: Item) -> dict[str, Any]:
    return {k: _serialize(v) for k, v in item.items()}


def _deserialize_item(raw: dict[str, Any]) -> Item:
    return {k: _from_dynamo(_deserializer.deserialize(v)) for k, v in raw.items()}


class _Expr:
    """Collects #n/:v placeholders while condition and update expressions are built."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attr: str) -> str:
        for placeholder, known in self.names.items():
            if known == attr:
                return placeholder
        placeholder = f"#n{len(self.names)}"
        self.names[placeholder] = attr
        return placeholder

    def value(self, value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = _serialize(value)
        return placeholder

    def condition(self, cond: Condition) -> str:
        match cond:
            case Missing(attr):
                return f"attribute_not_exists({self.name(attr)})"
            case Present(attr):
                return f"attribute_exists({self.name(attr)})"
            case Eq(attr, value):
                return f"{self.name(attr)} = {self.value(value)}"
            case Lt(attr, value):
                return f"{self.name(attr)} < {self.value(value)}"
            case AllOf(parts) | AnyOf(parts) if not parts:
                # DynamoDB has no literal true/false: an empty AllOf holds, an empty AnyOf not.
                pk = self.name("pk")
                joint = "OR" if isinstance(cond, AllOf) else "AND"
                return f"(attribute_exists({pk}) {joint} attribute_not_exists({pk}))"
            case AllOf(parts):
                return "(" + " AND ".join(self.condition(p) for p in parts) + ")"
            case AnyOf(parts):
                return "(" + " OR ".join(self.condition(p) for p in parts) + ")"
        raise TypeError(f"not a condition: {cond!r}")

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = self.names
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        return out


class AwsTable:
    def __init__(self, client: Any, table: str) -> None:
        self._db = client
        self._table = table
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-send.dynamodb", _counting(self.calls))

    def _key(self, pk: str, sk: str) -> dict[str, Any]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Item": _serialize_item({**item, "pk": pk, "sk": sk}),
        }
        if condition is not None:
            expr = _Expr()
            kwargs["ConditionExpression"] = expr.condition(condition)
            kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            await self._db.put_item(**kwargs)

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        with _translate("dynamodb", f"{pk}/{sk}"):
            got = await self._db.get_item(
                TableName=self._table, Key=self._key(pk, sk), ConsistentRead=consistent
            )
        raw = got.get("Item")
        return None if raw is None else _deserialize_item(raw)

    async def query(self, pk: str, *, prefix: str = "", consistent: bool = True) -> list[Item]:
        expr = _Expr()
        key_cond = f"{expr.name('pk')} = {expr.value(pk)}"
        if prefix:
            key_cond += f" AND begins_with({expr.name('sk')}, {expr.value(prefix)})"
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": key_cond,
            "ConsistentRead": consistent,
            **expr.kwargs(),
        }
        items: list[Item] = []
        while True:
            with _translate("dynamodb", f"{pk}/{prefix}*"):
                page = await self._db.query(**kwargs)
            items += [_deserialize_item(raw) for raw in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def update(
        self,
        pk: str,
        sk: str,
        *,
        set_: Item | None = None,
        add: dict[str, int] | None = None,
        condition: Condition | None = None,
    ) -> Item:
        expr = _Expr()
        # The key attributes cannot be updated; they are already what the caller names.
        sets = [
            f"{expr.name(k)} = {expr.value(v)}"
            for k, v in (set_ or {}).items()
            if k not in ("pk", "sk")
        ]
        adds = [
            f"{expr.name(k)} {expr.value(n)}"
            for k, n in (add or {}).items()
            if k not in ("pk", "sk")
        ]
        clauses = []
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": self._key(pk, sk),
            "ReturnValues": "ALL_NEW",
        }
        if clauses:
            kwargs["UpdateExpression"] = " ".join(clauses)
        if condition is not None:
            kwargs["ConditionExpression"] = expr.condition(condition)
        kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            got = await self._db.update_item(**kwargs)
        return _deserialize_item(got.get("Attributes") or self._key(pk, sk))

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        kwargs: dict[str, Any] = {"TableName": self._table, "Key": self._key(pk, sk)}
        if condition is not None:
            expr = _Expr()
            kwargs["ConditionExpression"] = expr.condition(condition)
            kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            await self._db.delete_item(**kwargs)

    def _tx_item(self, w: TxWrite) -> dict[str, Any]:
        expr = _Expr()
        body: dict[str, Any] = {"TableName": self._table}
        match w:
            case Put(pk, sk, item):
                kind = "Put"
                body["Item"] = _serialize_item({**item, "pk": pk, "sk": sk})
            case Update(pk, sk, set_, add):
                kind = "Update"
                body["Key"] = self._key(pk, sk)
                sets = [
                    f"{expr.name(k)} = {expr.value(v)}"
                    for k, v in (set_ or {}).items()
                    if k not in ("pk", "sk")
                ]
                adds = [f"{expr.name(k)} {expr.value(n)}" for k, n in (add or {}).items()]
                clauses = (["SET " + ", ".join(sets)] if sets else []) + (
                    ["ADD " + ", ".join(adds)] if adds else []
                )
                # An update must update something: touching the key's own value is a no-op.
                body["UpdateExpression"] = " ".join(clauses) or (
                    f"SET {expr.name('sk')} = {expr.name('sk')}"
                )
            case Delete(pk, sk):
                kind = "Delete"
                body["Key"] = self._key(pk, sk)
            case Check(pk, sk):
                kind = "ConditionCheck"
                body["Key"] = self._key(pk, sk)
        if w.condition is not None:
            body["ConditionExpression"] = expr.condition(w.condition)
        body.update(expr.kwargs())
        return {kind: body}

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        where = ", ".join(f"{w.pk}/{w.sk}" for w in writes[:3])
        with _translate("dynamodb", where):
            await self._db.transact_write_items(
                TransactItems=[self._tx_item(w) for w in writes], ClientRequestToken=token
            )


async def _ensure_bucket(s3: Any, bucket: str, region: str, create: bool) -> None:
    try:
        with _translate("s3", f"s3://{bucket}"):
            await s3.head_bucket(Bucket=bucket)
    except BlobMissing:
        pass  # HeadBucket answers a bare 404 for a missing bucket
    except BackendError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ClientError) or _error_code(cause) != "NoSuchBucket":
            raise
    else:
        return
    if not create:
        raise UsageError(f"bucket {bucket} does not exist: create it or enable bucket creation")
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        # us-east-1 is the one region that rejects an explicit LocationConstraint.
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        with _translate("s3", f"s3://{bucket}"):
            await s3.create_bucket(**kwargs)
    except BackendError as exc:
        code = _error_code(exc.__cause__) if isinstance(exc.__cause__, ClientError) else ""
        if code == "BucketAlreadyExists":
            raise UsageError(
                f"bucket {bucket} belongs to another account: choose another bucket name"
            ) from exc
        if code != "BucketAlreadyOwnedByYou":
            raise


async def _ensure_table(db: Any, table: str, create: bool) -> None:
    try:
        with _translate("dynamodb", table):
            got = await db.describe_table(TableName=table)
        if got["Table"].get("TableStatus") == "ACTIVE":
            return
    except BackendError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ClientError) or _error_code(cause) != "ResourceNotFoundException":
            raise
        if not create:
            raise UsageError(
                f"DynamoDB table {table} does not exist: create it or enable table creation"
            ) from exc
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
            cause = again.__cause__
            if not isinstance(cause, ClientError) or _error_code(cause) != "ResourceInUseException":
                raise
    with _translate("dynamodb", table):
        await db.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
        )


async def _probe(session: Any, region: str, settings: AwsSettings, path_style: bool) -> None:
    """One cheap call per service, without retries, so that a wrong setup (no credentials,
    nothing listening) fails in seconds at open time, not after minutes of backoff mid-job.
    Each call names only our own queue prefix, bucket or table: a least-privilege role
    (deploy/fleet.yaml) allows them, where ListBuckets or ListTables would need "*"."""
    config = {"retries": {"total_max_attempts": 1}, "connect_timeout": 5, "read_timeout": 20}
    # "Not found" still proves the service answered and let us in.
    absent = {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "404",
        "NoSuchBucket",
        "NotFound",
        "ResourceNotFoundException",
    }

    async def one(service: str) -> None:
        extra = {"s3": {"addressing_style": "path"}} if service == "s3" and path_style else {}
        with _translate(service):
            async with session.client(
                service, region_name=region, config=AioConfig(**config, **extra)
            ) as c:
                try:
                    if service == "sqs":
                        await c.get_queue_url(QueueName=f"{settings.queue_prefix}probe")
                    elif service == "s3":
                        await c.head_bucket(Bucket=settings.bucket)
                    else:
                        await c.describe_table(TableName=settings.table)
                except ClientError as exc:
                    if _error_code(exc) not in absent:
                        raise

    await asyncio.gather(*(one(s) for s in ("sqs", "s3", "dynamodb")))


@asynccontextmanager
async def open_aws(settings: AwsSettings) -> AsyncIterator[Backend]:
    """The aws backend, with one client per service for the life of the context."""
    try:
        session = aioboto3.Session(profile_name=settings.profile, region_name=settings.region)
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
                    session.client(service, region_name=region, config=AioConfig(**base, **extra))
                )
        await _probe(session, region, settings, path_style)
        await _ensure_bucket(clients["s3"], settings.bucket, region, settings.create)
        await _ensure_table(clients["dynamodb"], settings.table, settings.create)
        yield Backend(
            name="aws",
            queues=AwsQueues(clients["sqs"]),
            blobs=AwsBlobs(clients["s3"]),
            table=AwsTable(clients["dynamodb"], settings.table),
            scratch=f"s3://{settings.bucket}/cmr",
        )
