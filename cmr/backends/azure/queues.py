"""The queue protocol on Azure Queue storage (through azure.storage.queue.aio).

Where Azure's queues are not SQS's, and what is done about it:

* **Visibility default.** An Azure queue has none: each Get Messages names its visibility
  timeout. ``create`` keeps the queue's in its metadata (``cmrvisibility``), read once per
  client and applied to every receive that names none (30 s, SQS's default, for a queue
  made by someone else).
* **Long polling.** Azure has none: ``receive`` asks again, every 0.1 s doubling to 1 s,
  until a message comes or ``wait_s`` has passed (each ask is a billed request).
* **Batches.** No batch send or delete: one Put Message (or Delete Message) a body,
  SEND_CONCURRENCY at a time. Get Messages returns up to 32.
* **Receipts.** A receipt is ``"<message id> <pop receipt>"``. A pop receipt changes on
  every Update Message, so after ``change_visibility`` the receipt the caller holds is no
  longer Azure's: this client remembers, by the receipt it handed out, the pop receipt
  the last update returned, and ``delete_messages`` and later renewals use that one. The
  calls on one receipt are serialised, so a renewal racing a delete cannot leave the
  delete with a receipt the renewal just replaced. Only this client knows the mapping: a
  receipt renewed here and deleted by another process is stale there (deleted nothing;
  redelivered after its lease, as at-least-once allows). Stale receipts (PopReceiptMismatch,
  MessageNotFound) are ignored, as the protocol says; an old delivery's receipt never
  deletes on Azure.
* **Counts.** Azure gives one approximate count (visible and invisible together, never
  lower than the truth) where SQS gives the visible / in-flight pair. ``counts`` returns
  ``(visible, total - visible)`` with ``visible`` from peeking up to 32 messages (Peek
  Messages sees only visible ones): exact up to 32 visible, the whole count as visible past
  that (the split unknown); their sum, what the janitor reads, is always Azure's count.
  An empty queue costs one request, a non-empty one two (the peek reads up to 2 MiB).
* **Bodies.** Azure's limit is 64 KiB of message text; bytes travel base64-encoded, the
  wire format of the SDK's BinaryBase64EncodePolicy, so 48 KiB (MAX_MESSAGE_BYTES) of raw
  body, checked on the encoded text. We encode and decode ourselves rather than through
  the SDK's policies: its decode policy raises on a message that is not base64, on every
  receive of its batch, where the engine wants the raw text to reject with a log line.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from types import TracebackType

from azure.storage.queue.aio import QueueClient, QueueServiceClient

from cmr.aio import run_all
from cmr.backends.azure.clients import RETRY, Counting, connection_string
from cmr.backends.azure.errors import translate
from cmr.backends.base import Received
from cmr.errors import BackendError, QueueGone, UsageError

ENCODED_LIMIT = 64 * 1024  # Azure's largest message, as the text sent
MAX_MESSAGE_BYTES = ENCODED_LIMIT // 4 * 3  # 49,152 raw bytes: 65,536 base64 characters
RETENTION_S = 14 * 24 * 3600  # as on SQS (Azure's default is 7 days)
MAX_VISIBILITY_S = 7 * 24 * 3600  # Azure's longest
RECEIVE_MAX = 32  # Azure's most messages per Get Messages
SEND_CONCURRENCY = 16  # Put Message (and Delete / Update Message) requests in flight per call
POLL_FIRST_S = 0.1  # long polling emulated: the first pause, doubling up to POLL_MAX_S
POLL_MAX_S = 1.0
DEFAULT_VISIBILITY_S = 30  # SQS's, for a queue whose metadata names none
VISIBILITY_KEY = "cmrvisibility"
LEASES_KEPT = 100_000  # renewed receipts remembered at most (the oldest idle ones go first)
STALE = {"PopReceiptMismatch", "MessageNotFound"}


def _encode(body: bytes) -> str:
    return base64.b64encode(body).decode("ascii")


def _decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        # Not ours: hand the engine the raw text so its decoder rejects it with a log line.
        return text.encode("utf-8", "surrogateescape")


@dataclass
class _Lease:
    """What this client knows of one receipt it handed out: Azure's current pop receipt."""

    pop: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    over: bool = False  # deleted, or found stale: nothing more to remember


class AzureQueues:
    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(self, conn: str | None = None) -> None:
        """A client of the account in ``conn`` (default: AZURE_STORAGE_CONNECTION_STRING)."""
        self.calls: Counter[str] = Counter()
        self._service = QueueServiceClient.from_connection_string(
            connection_string(conn), raw_request_hook=Counting("queue", self.calls), **RETRY
        )
        self._clients: dict[str, QueueClient] = {}
        self._visibility: dict[str, int] = {}
        self._leases: OrderedDict[str, _Lease] = OrderedDict()

    async def close(self) -> None:
        await self._service.close()

    async def __aenter__(self) -> AzureQueues:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _queue(self, name: str) -> QueueClient:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self._service.get_queue_client(name)
        return client

    def _forget(self, name: str) -> None:
        """The queue is gone: the name may be reused by a new queue with its own timeout."""
        self._visibility.pop(name, None)

    @asynccontextmanager
    async def _translated(self, name: str, operation: str) -> AsyncIterator[None]:
        try:
            with translate("queue", name, operation):
                yield
        except QueueGone:
            self._forget(name)
            raise

    async def create(self, name: str, *, visibility_s: int) -> None:
        queue = self._queue(name)
        try:
            async with self._translated(name, "CreateQueue"):
                await queue.create_queue(metadata={VISIBILITY_KEY: str(visibility_s)})
        except BackendError as exc:
            # Exists (with this metadata or other): keep it as it is, as SQS's backend does.
            if exc.code != "QueueAlreadyExists":
                raise
            self._forget(name)
            await self._default_visibility(name)
            return
        self._visibility[name] = visibility_s

    async def _default_visibility(self, name: str) -> int:
        seconds = self._visibility.get(name)
        if seconds is None:
            async with self._translated(name, "GetQueueMetadata"):
                props = await self._queue(name).get_queue_properties()
            raw = (props.metadata or {}).get(VISIBILITY_KEY, "")
            seconds = int(raw) if raw.isdigit() else DEFAULT_VISIBILITY_S
            self._visibility[name] = seconds
        return seconds

    async def delete(self, name: str) -> None:
        with suppress(QueueGone):
            async with self._translated(name, "DeleteQueue"):
                await self._queue(name).delete_queue()
        self._forget(name)

    async def list(self, prefix: str) -> builtins.list[str]:
        with translate("queue", f"prefix {prefix}", "ListQueues"):
            names = [q.name async for q in self._service.list_queues(name_starts_with=prefix)]
        return sorted(n for n in names if n.startswith(prefix))

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        texts = [_encode(b) for b in bodies]
        for body, text in zip(bodies, texts, strict=True):
            if len(text) > ENCODED_LIMIT:
                raise UsageError(
                    f"message of {len(body)} bytes exceeds the queue limit of "
                    f"{self.max_message_bytes} (Azure's 64 KiB, base64-encoded)"
                )
        queue = self._queue(name)
        gate = asyncio.Semaphore(SEND_CONCURRENCY)

        async def one(text: str) -> None:
            async with gate, self._translated(name, "PutMessage"):
                await queue.send_message(text, time_to_live=RETENTION_S)

        await run_all(one(t) for t in texts)

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        seconds = visibility_s if visibility_s is not None else await self._default_visibility(name)
        seconds = max(1, min(MAX_VISIBILITY_S, seconds))  # Get Messages takes 1 s to 7 days
        count = max(1, min(RECEIVE_MAX, max_messages))
        queue = self._queue(name)
        deadline = time.monotonic() + wait_s
        pause = POLL_FIRST_S
        while True:
            async with self._translated(name, "GetMessages"):
                got = [
                    m
                    async for m in queue.receive_messages(
                        messages_per_page=count, max_messages=count, visibility_timeout=seconds
                    )
                ]
            left = deadline - time.monotonic()
            if got or left <= 0:
                break
            await asyncio.sleep(min(pause, left))
            pause = min(POLL_MAX_S, pause * 2)
        return [
            Received(
                _decode(m.content or ""), f"{m.id} {m.pop_receipt}", m.id, m.dequeue_count or 1
            )
            for m in got
        ]

    @asynccontextmanager
    async def _lease(self, receipt: str) -> AsyncIterator[_Lease]:
        """The receipt's lease, its calls one at a time; remembered while its pop receipt
        differs from the one in the receipt (a renewal changed it) and it is not over."""
        lease = self._leases.get(receipt)
        if lease is None:
            lease = self._leases[receipt] = _Lease(receipt.partition(" ")[2])
        lease.users += 1
        try:
            async with lease.lock:
                yield lease
        finally:
            lease.users -= 1
            original = lease.pop == receipt.partition(" ")[2]
            if lease.users == 0 and (lease.over or original):
                self._leases.pop(receipt, None)
            else:
                self._leases.move_to_end(receipt)
            while len(self._leases) > LEASES_KEPT:
                oldest = next(iter(self._leases))
                if self._leases[oldest].users:
                    break
                del self._leases[oldest]

    async def _per_receipt(
        self, name: str, operation: str, receipts: Sequence[str], seconds: int
    ) -> None:
        queue = self._queue(name)
        gate = asyncio.Semaphore(SEND_CONCURRENCY)

        async def one(receipt: str) -> None:
            message_id, _, pop = receipt.partition(" ")
            if not message_id or not pop:
                return  # not a receipt of ours: as stale as any
            async with gate, self._lease(receipt) as lease:
                try:
                    async with self._translated(name, operation):
                        if operation == "DeleteMessage":
                            await queue.delete_message(message_id, lease.pop)
                            lease.over = True
                        else:
                            got = await queue.update_message(
                                message_id, lease.pop, visibility_timeout=seconds
                            )
                            lease.pop = str(got.pop_receipt)
                except BackendError as exc:
                    if exc.code not in STALE:
                        raise
                    lease.over = True  # deleted, or delivered again since: ignored

        await run_all(one(r) for r in receipts)

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        await self._per_receipt(name, "DeleteMessage", receipts, 0)

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        seconds = max(0, min(MAX_VISIBILITY_S, seconds))
        await self._per_receipt(name, "UpdateMessage", receipts, seconds)

    async def counts(self, name: str) -> tuple[int, int]:
        queue = self._queue(name)
        async with self._translated(name, "GetQueueMetadata"):
            total = int((await queue.get_queue_properties()).approximate_message_count or 0)
        if total == 0:
            return 0, 0
        async with self._translated(name, "PeekMessages"):
            visible = len(await queue.peek_messages(max_messages=RECEIVE_MAX))
        if visible >= RECEIVE_MAX:
            return total, 0  # past 32 visible the split is unknown: all counted visible
        return visible, max(0, total - visible)
