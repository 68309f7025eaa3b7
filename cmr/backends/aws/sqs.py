"""The queue protocol on SQS: bodies base64-encoded, sends and deletes in batches of ten."""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import math
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from cmr.backends.aws.calls import _all, counting
from cmr.backends.aws.errors import translate as _translate
from cmr.backends.base import Received
from cmr.backends.embedded import MAX_MESSAGE_BYTES, SQS_BODY_LIMIT
from cmr.errors import BackendError, QueueGone, UsageError

# SQS's longest: a job that waits days for a fleet must not lose its tasks (and if it does,
# a worker re-sends them from the plan: see cmr.janitor).
RETENTION_S = 14 * 24 * 3600
SEND_CONCURRENCY = 8  # SendMessageBatch calls in flight per send()
SEND_RETRIES = 3  # rounds of resending entries SQS reported as failed

# CreateQueue's "exists with other attributes": the JSON protocol's code, then the query one.
_QUEUE_EXISTS = {"QueueNameExists", "QueueAlreadyExists"}
_STALE_RECEIPT = {
    "ReceiptHandleIsInvalid",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
    "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
}


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
        counting(client, "sqs", self.calls)

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
            if exc.code not in _QUEUE_EXISTS:
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
