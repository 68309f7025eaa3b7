"""The queue, blob store and table protocols every backend implements.

Semantics follow the AWS services, because the engine's correctness arguments are made
against them:

* Queues deliver at least once. A received message stays invisible for its visibility
  timeout, then reappears unless deleted; parallel receives may return the same message
  twice. Receipts are per delivery: deleting with an old receipt may not delete.
* Blobs are strongly consistent after a put (as S3 is since 2020). ``put_if`` is S3's
  conditional write (``If-Match`` / ``If-None-Match: *``); ``copy`` is a server-side copy.
* Table reads are strongly consistent when ``consistent=True``; conditional writes are
  atomic per item, and ``transact`` applies writes to several items all or none.
  Eventual reads may return an older version.

Implementations translate their service's failures into :mod:`cmr.errors` at the edge.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

Item: TypeAlias = dict[str, Any]
"""A table item. Values: str, int, float, bool, bytes, None, and lists/dicts of those."""


@dataclass(frozen=True)
class Received:
    body: bytes
    receipt: str
    message_id: str
    receive_count: int  # deliveries so far, this one included (SQS ApproximateReceiveCount)


@dataclass(frozen=True)
class BlobInfo:
    url: str
    size: int


# Conditions for table writes: a tiny algebra both backends can evaluate or translate.
@dataclass(frozen=True)
class Missing:
    """The attribute is absent (``Missing("pk")``: the item does not exist)."""

    attr: str


@dataclass(frozen=True)
class Present:
    attr: str


@dataclass(frozen=True)
class Eq:
    attr: str
    value: Any


@dataclass(frozen=True)
class Lt:
    """The attribute exists and is less than value."""

    attr: str
    value: Any


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Condition, ...]


Condition: TypeAlias = Missing | Present | Eq | Lt | AllOf | AnyOf


def item_absent() -> Condition:
    return Missing("pk")


# Writes of one transaction (``Table.transact``): all are applied, or none.
@dataclass(frozen=True)
class Put:
    pk: str
    sk: str
    item: Item
    condition: Condition | None = None


@dataclass(frozen=True)
class Update:
    pk: str
    sk: str
    set_: Item | None = None
    add: dict[str, int] | None = None
    condition: Condition | None = None


@dataclass(frozen=True)
class Delete:
    pk: str
    sk: str
    condition: Condition | None = None


@dataclass(frozen=True)
class Check:
    """No write: the transaction applies only if ``condition`` holds on this item."""

    pk: str
    sk: str
    condition: Condition


TxWrite: TypeAlias = Put | Update | Delete | Check
MAX_TX_WRITES = 100  # DynamoDB's TransactWriteItems limit


class Queues(Protocol):
    """An SQS-like queue service. Queues are named; names are unique per account/region."""

    max_message_bytes: int  # largest body ``send`` accepts (raw bytes, before any encoding)
    calls: Counter[str]  # requests made, by operation ("sqs.ReceiveMessage", ...)

    async def create(self, name: str, *, visibility_s: int) -> None:
        """Create the queue if missing (idempotent), with a default visibility timeout."""

    async def delete(self, name: str) -> None:
        """Delete the queue and its messages; a missing queue is not an error."""

    async def list(self, prefix: str) -> builtins.list[str]:
        """Names of existing queues that start with prefix."""

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        """Enqueue every body (batched as the service allows). Raises QueueGone."""

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        """Up to max_messages (1..10) messages, waiting up to wait_s for the first (SQS rounds
        it to whole seconds)."""

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        """Delete by receipt; unknown or stale receipts are ignored."""

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        """Extend (or, with 0, release) the lease of received messages; stale receipts ignored."""

    async def counts(self, name: str) -> tuple[int, int]:
        """Approximate (visible, in flight) message counts."""


class Blobs(Protocol):
    """An S3-like blob store addressed by URL (``s3://bucket/key`` or ``file:///path``)."""

    calls: Counter[str]

    async def put(self, url: str, data: bytes) -> None: ...

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        """Write only if the blob's current etag is ``etag`` (None: only if there is no blob);
        returns the new etag. Raises ConditionFailed. Atomic: of two writers that saw the
        same etag, exactly one succeeds (S3's If-Match / If-None-Match)."""

    async def get(self, url: str) -> bytes:
        """The whole blob. Raises BlobMissing."""

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        """The whole blob and its etag (an opaque version tag for ``put_if``). Raises
        BlobMissing."""

    async def copy(self, src: str, dst: str) -> None:
        """Copy a blob inside the store, without the bytes passing through us (S3
        CopyObject). Raises BlobMissing when src is absent."""

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes [start, end), clipped to the blob's size. Raises BlobMissing."""

    async def size(self, url: str) -> int:
        """Raises BlobMissing."""

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        """Every blob whose URL starts with prefix, recursively, sorted by URL."""

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every blob under prefix, and abort every unfinished upload there; returns
        how many blobs. Idempotent."""

    async def delete(self, urls: Sequence[str]) -> None:
        """Delete these blobs (absent ones are fine), many per request where the store can."""

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        """Store the file at ``path`` as ``url``. ``frozen``: the caller never writes the
        file again (a task's finished output), so a store on the same disk may share it
        rather than copy it."""

    async def upload_stream(
        self, url: str, chunks: AsyncIterable[bytes], *, size_hint: int = 0
    ) -> int:
        """Store what ``chunks`` yields, in order, as ``url``; the bytes stored. Nothing is
        stored when ``chunks`` raises (its error passes on). ``size_hint``: about how many
        bytes will come (0: unknown), for the store to pick its part size. Never retried
        as a whole (a stream cannot be replayed): its caller retries its task."""

    async def download_file(self, url: str, path: str) -> None: ...


class Table(Protocol):
    """A DynamoDB-like table of items keyed by (pk, sk), both strings."""

    calls: Counter[str]

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        """Replace the whole item. Raises ConditionFailed."""

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None: ...

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        """Items of partition pk whose sk starts with prefix, in sk order; with ``start``
        (itself under ``prefix``), only those from that sk on: a reader that knows the
        first items need not read them again (DynamoDB charges a query by what it reads)."""

    async def update(self, write: Update) -> Item:
        """Set attributes and add to counters (creating the item if absent); returns the new
        item. Raises ConditionFailed. The same ``Update`` a transaction takes."""

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        """Delete the item (absent is fine unless a condition says otherwise)."""

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        """Apply every write or none: ConditionFailed (nothing applied) if any condition is
        false. At most MAX_TX_WRITES writes, each item once. A call repeated with the same
        ``token`` (a retry after a lost answer) is applied only once, as DynamoDB's
        ClientRequestToken guarantees for ten minutes."""


def check_start(prefix: str, start: str) -> None:
    """A query's ``start`` lies under its ``prefix`` (or is empty)."""
    if start and not start.startswith(prefix):
        raise ValueError(f"a query's start {start!r} is not under its prefix {prefix!r}")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, for the few places where the engine must act differently
    (rather than asking which backend it is). Limits that are the services' own, such as
    ``Queues.max_message_bytes``, stay on the services."""

    local_files: bool  # workers read and write the client's local files directly (file://)
    in_process: bool  # its queues live in this process: workers must run here, and a job
    # does not outlive the process that submitted it
    free_requests: bool  # requests cost nothing and take no network trip: poll often


# The two kinds of backend cmr has. A backend built by hand from another's services (tests
# wrapping one service) gets its kind's capabilities from its name.
EMBEDDED = Capabilities(local_files=True, in_process=True, free_requests=True)
REMOTE = Capabilities(local_files=False, in_process=False, free_requests=False)
KINDS = {"embedded": EMBEDDED, "aws": REMOTE, "azure": REMOTE}
_BY_NAME = Capabilities(local_files=False, in_process=False, free_requests=False)  # not given


@dataclass
class Backend:
    """The three services a job runs on, plus where its scratch data lives."""

    name: str  # "embedded", "aws" or "azure"
    queues: Queues
    blobs: Blobs
    table: Table
    scratch: str  # URL prefix for staged input, attempt outputs and spilled values
    capabilities: Capabilities = field(default=_BY_NAME, kw_only=True)
    # This machine's files as a blob store (file:// URLs), whichever backend runs the job:
    # where the client inspects a local output directory and fetches a job's results into
    # one. Not one of the job's services: its calls are not the backend's (none counted,
    # none faulted), as no worker makes them.
    local_blobs: Blobs = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.capabilities is _BY_NAME:
            self.capabilities = KINDS.get(self.name, REMOTE)

    @property
    def local_files(self) -> bool:
        """Whether workers read and write the client's local files directly (embedded: one
        process). Otherwise local input is staged to the blob store and local output fetched."""
        return self.capabilities.local_files

    def calls(self) -> Counter[str]:
        """Every request made so far through this backend, by operation."""
        return self.queues.calls + self.blobs.calls + self.table.calls
