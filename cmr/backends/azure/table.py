"""The table protocol on Azure Table storage (through azure.data.tables.aio).

Where Azure's tables are not DynamoDB, and what is done about it:

* **Keys.** PartitionKey and RowKey refuse ``/ \\ # ?`` and control characters, and cmr's
  keys hold them (``jobs#active``, output URLs). Keys are stored as the hex of their UTF-8
  bytes: every key is storable, and hex keeps DynamoDB's byte order, so a prefix query is a
  RowKey range. A key is at most 512 bytes (Azure's 1 KiB of hex); longer is Rejected.
* **Values.** Azure's properties have no null, list or map, and one property holds at most
  64 KiB. An item is stored whole as msgpack (int, float, bool, bytes, None, lists and
  maps keep their types; integers past 64 bits as an extension) in binary properties of
  CHUNK bytes, ``d0 d1 ...``. The item limit is DynamoDB's 400 KB, as the engine sizes
  its records by it; Azure's entity limit (1 MiB) holds an item and a pending image of it.
  A read that is not such an item (an entity written by someone else) is Rejected.
* **Conditions.** Azure's only write condition is the entity's ETag (If-Match) or its
  absence (insert). Every conditional write reads the entity, evaluates the condition as
  DynamoDB would (:func:`cmr.backends.items.holds`), and writes If-Match the ETag read: a
  change between the two fails the write, and it is tried again on what changed. So every
  write costs a read as well (DynamoDB: one request).
* **Transactions across partitions.** Azure's entity-group transaction spans one
  partition; cmr's span several (a job's record, its row in the active index, its output
  claim). ``transact`` is a client-side transaction, the protocol of Percolator and of
  AWS's DynamoDB transactions library before TransactWriteItems existed:

  1. A transaction record is inserted in partition ``~tx`` (no item's: item keys are hex),
     keyed by the transaction's token, state ``pending``, naming its items.
  2. Each item is locked, in key order, by an If-Match write that adds the token (``lk``)
     and the image the transaction leaves (``x0 x1 ...``, or ``xa`` = delete / keep) beside
     the item's current value, which stays untouched. The item's condition is evaluated on
     that current value. A condition that fails aborts the transaction (ConditionFailed).
  3. The record moves from ``pending`` to ``committed`` by If-Match: the one linearization
     point. Nothing else ever moves a record to committed.
  4. Each item takes its image and loses its lock (If-Match the lock's ETag).

  A reader that finds a lock reads the record: committed, it sees the image (and writes
  it in, for the holder may have died); otherwise the current value, since the
  transaction has not taken effect. A writer, or a transaction, that finds a lock of a
  pending transaction waits for it; locks are taken in key order and single writes hold
  none, so waits never form a cycle. A pending transaction that a waiter has watched for
  STALE_S on its own clock is aborted (``pending`` to ``aborted`` by If-Match, the only
  other move) and its locks rolled back: its holder died or stopped, and one that wakes
  finds its commit refused (Throttled: a conflict, retried from the start). No two
  machines' clocks are compared.
* **Tokens.** DynamoDB applies a retried TransactWriteItems with the same
  ClientRequestToken once. Here the record is keyed by the token: a retry finds it, and a
  committed one is finished rather than applied again. Records are kept TOKEN_KEEP_S (the
  service's clock, its Timestamp) and then swept, with any transaction left half-done.
* **Consistency.** Azure Table reads are always strong: ``consistent=False`` reads strongly.

The price: a single write is two requests (read, write), a transaction of k items 3k + 2
(insert the record, read and lock each item, commit, write each image); DynamoDB
takes one. ``calls`` counts them by Azure's operation names (``table.QueryEntity``...).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import msgpack
from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

from cmr import logs
from cmr.backends.azure.clients import RETRY, Counting, connection_string
from cmr.backends.azure.errors import error_code, translated
from cmr.backends.base import (
    MAX_TX_WRITES,
    Check,
    Condition,
    Delete,
    Item,
    Put,
    TxWrite,
    Update,
    check_start,
)
from cmr.backends.items import MAX_ITEM_BYTES, copied, holds, item_bytes, updated
from cmr.errors import BackendError, ConditionFailed, Rejected, Throttled

log = logs.get_logger("cmr.backends.azure.table")

CHUNK = 60_000  # bytes per binary property (Azure's limit: 64 KiB)
MAX_KEY_BYTES = 512  # a key's UTF-8 bytes: its hex fills Azure's 1 KiB
TX_PARTITION = "~tx"  # the transaction records' partition: not hex, so no item's
STALE_S = 15.0  # a pending transaction watched this long (our clock) is aborted
TOKEN_KEEP_S = 600  # records kept (DynamoDB keeps a token ten minutes), then swept
SWEEP_EVERY_S = 60.0  # a client sweeps old records at most this often
WRITE_PATIENCE_S = 120.0  # a write losing its If-Match race this long is Throttled
_BIG_INT = 1  # msgpack extension code: an integer past 64 bits, as its decimal text
_DATA = "d"  # the item's properties: d0, d1, ...
_AFTER = "x"  # the image a pending transaction leaves: x0, x1, ...
_LOCK = "lk"
_ACTION = "xa"  # what the lock's transaction does: put (the x image), delete, keep


def _key(text: str, what: str) -> str:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_KEY_BYTES:
        raise Rejected(
            f"table: a {what} of {len(raw)} bytes is longer than the {MAX_KEY_BYTES} an Azure "
            f"table key holds ({text[:60]!r}...)"
        )
    return raw.hex()


def _unkey(hexed: str) -> str:
    return bytes.fromhex(hexed).decode("utf-8", "surrogatepass")


def _packed(value: Any) -> Any:
    if isinstance(value, int):
        return msgpack.ExtType(_BIG_INT, str(value).encode())
    raise TypeError(f"a table value cannot be {type(value).__name__}")


def _ext(code: int, data: bytes) -> int:
    if code != _BIG_INT or not data.lstrip(b"-").isdigit():
        raise ValueError(f"unknown extension {code}")
    return int(data)


def _encode(item: Item) -> bytes:
    return bytes(msgpack.packb(item, default=_packed, use_bin_type=True))


def _decode(data: bytes, where: str) -> Item:
    try:
        item = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_ext)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise Rejected(
            f"table: {where} is not a cmr item ({exc}); was it written by hand?"
        ) from exc
    if not isinstance(item, dict):
        raise Rejected(f"table: {where} is not a cmr item (a {type(item).__name__})")
    return item


def _chunks(data: bytes, name: str) -> dict[str, Any]:
    parts = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    return {f"{name}{i}": p for i, p in enumerate(parts)}


def _joined(entity: dict[str, Any], name: str) -> bytes | None:
    """The bytes of properties name0, name1, ... in order; None when there is no name0."""
    parts: list[bytes] = []
    while (part := entity.get(f"{name}{len(parts)}")) is not None:
        parts.append(bytes(part))
    return b"".join(parts) if parts else None


@dataclass
class _Row:
    """An entity as read: its ETag (None: no entity), the item it holds now (None: absent),
    and the lock on it, if any, with the image the lock's transaction leaves."""

    pk: str
    sk: str
    etag: str | None = None
    item: Item | None = None
    data: dict[str, Any] = field(default_factory=dict)  # the item's raw d* properties
    lock: str | None = None
    after: Item | None = None  # with lock: the image left (None: the item is deleted)


@dataclass
class _Tx:
    token: str
    state: str
    etag: str
    keys: list[tuple[str, str]]
    stamp: datetime.datetime | None = None


class AzureTable:
    """The table protocol on one Azure table (``name``) of the account in ``conn``."""

    def __init__(self, name: str, conn: str | None = None, *, stale_s: float = STALE_S) -> None:
        """``stale_s``: how long this client waits on another's pending transaction before
        it aborts it (its holder is presumed dead or stopped)."""
        self.name = name
        self.stale_s = stale_s
        self.calls: Counter[str] = Counter()
        self._service = TableServiceClient.from_connection_string(
            connection_string(conn), raw_request_hook=Counting("table", self.calls), **RETRY
        )
        self._client: TableClient = self._service.get_table_client(name)
        # (token, record ETag) -> when we first saw that record pending
        self._seen_pending: dict[tuple[str, str], float] = {}
        self._swept = time.monotonic()  # a new client waits a while before its first sweep

    async def close(self) -> None:
        await self._client.close()
        await self._service.close()

    async def __aenter__(self) -> AzureTable:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def create(self) -> None:
        """Create the table if it is missing (idempotent)."""
        with contextlib.suppress(ResourceExistsError):
            async with self._translated(self.name, "CreateTable"):
                await self._service.create_table(self.name)

    async def exists(self) -> bool:
        async with self._translated(self.name, "QueryTables"):
            async for _ in self._service.query_tables(
                "TableName eq @name", parameters={"name": self.name}
            ):
                return True
        return False

    @contextlib.asynccontextmanager
    async def _translated(self, subject: str, operation: str) -> AsyncIterator[None]:
        """Azure's failures as ours; the three the protocol answers itself pass as they are
        (an entity not found, already there, or changed since it was read)."""
        try:
            yield
        except (ResourceExistsError, ResourceModifiedError):
            raise
        except ResourceNotFoundError as exc:
            if error_code(exc) in ("TableNotFound", "TableBeingDeleted"):
                raise translated("table", exc, f"table {self.name}", operation) from exc
            raise
        except AzureError as exc:
            raise translated("table", exc, subject, operation) from exc

    # -- entities ---------------------------------------------------------------------

    def _row(self, pk: str, sk: str, entity: Any) -> _Row:
        where = f"{self.name} {pk}/{sk}"
        row = _Row(pk, sk, etag=str(entity.metadata["etag"]))
        row.data = {k: v for k, v in entity.items() if k.startswith(_DATA) and k[1:].isdigit()}
        data = _joined(entity, _DATA)
        row.item = None if data is None else _decode(data, where)
        lock = entity.get(_LOCK)
        if lock is not None:
            row.lock = str(lock)
            action = entity.get(_ACTION)
            if action == "keep":
                row.after = row.item
            elif action == "put":
                after = _joined(entity, _AFTER)
                row.after = None if after is None else _decode(after, where + " (pending)")
        return row

    async def _read(self, pk: str, sk: str) -> _Row:
        try:
            async with self._translated(f"{pk}/{sk}", "QueryEntity"):
                entity = await self._client.get_entity(_key(pk, "partition key"), _key(sk, "key"))
        except ResourceNotFoundError:
            return _Row(pk, sk)
        return self._row(pk, sk, entity)

    async def _replace(self, row: _Row, props: dict[str, Any]) -> str:
        """Write the entity as ``props`` if it is still as ``row`` was read (insert if it
        was absent); its new ETag. ResourceModifiedError / ResourceExistsError /
        ResourceNotFoundError when it changed meanwhile."""
        entity = {"PartitionKey": _key(row.pk, ""), "RowKey": _key(row.sk, ""), **props}
        async with self._translated(f"{row.pk}/{row.sk}", "UpdateEntity"):
            if row.etag is None:
                answer = await self._client.create_entity(entity)
            else:
                answer = await self._client.update_entity(
                    entity,
                    mode=UpdateMode.REPLACE,
                    etag=row.etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        return str(answer["etag"])

    async def _remove(self, row: _Row) -> None:
        """Delete the entity if it is still as ``row`` was read."""
        if row.etag is None:
            return
        async with self._translated(f"{row.pk}/{row.sk}", "DeleteEntity"):
            await self._client.delete_entity(
                _key(row.pk, ""),
                _key(row.sk, ""),
                etag=row.etag,
                match_condition=MatchConditions.IfNotModified,
            )

    async def _settle(self, row: _Row, item: Item | None) -> None:
        """Leave the entity holding ``item`` (None: no entity), unlocked, if it is still as
        ``row`` was read. Raises as :meth:`_replace` does when it changed."""
        if item is None:
            await self._remove(row)
        else:
            await self._replace(row, _chunks(_encode(item), _DATA))

    # -- transaction records ----------------------------------------------------------

    def _tx_of(self, token: str, entity: Any) -> _Tx:
        keys = _decode(_joined(entity, "k") or b"\x80", f"transaction {token}")
        return _Tx(
            token,
            str(entity.get("state", "")),
            str(entity.metadata["etag"]),
            [(str(pk), str(sk)) for pk, sk in keys.get("keys", [])],
            entity.metadata.get("timestamp"),
        )

    async def _tx(self, token: str) -> _Tx | None:
        try:
            async with self._translated(f"transaction {token}", "QueryEntity"):
                entity = await self._client.get_entity(TX_PARTITION, _key(token, "token"))
        except ResourceNotFoundError:
            return None
        return self._tx_of(token, entity)

    async def _move(self, tx: _Tx, state: str) -> bool:
        """Move the record from its state to ``state`` if nobody moved it since it was read."""
        entity = {"PartitionKey": TX_PARTITION, "RowKey": _key(tx.token, ""), "state": state}
        try:
            async with self._translated(f"transaction {tx.token}", "MergeEntity"):
                answer = await self._client.update_entity(
                    entity,
                    mode=UpdateMode.MERGE,
                    etag=tx.etag,
                    match_condition=MatchConditions.IfNotModified,
                )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        tx.state, tx.etag = state, str(answer["etag"])
        return True

    async def _fate(self, row: _Row) -> str:
        """What becomes of a locked row: ``committed`` (its image stands), ``pending``, or
        ``aborted`` (its current value stands; a transaction whose record is gone too)."""
        assert row.lock is not None
        tx = await self._tx(row.lock)
        return "aborted" if tx is None else tx.state

    async def _finish(self, row: _Row, fate: str) -> None:
        """Write a committed transaction's image into a row, or roll an aborted one's lock
        back; a row that changed meanwhile was finished by someone else."""
        item = row.after if fate == "committed" else row.item
        with contextlib.suppress(ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
            await self._settle(row, item)

    async def _abort_stale(self, tx: _Tx) -> bool:
        """Abort ``tx`` (pending, as just read) if we have watched this very record pending
        for stale_s on our clock; True if we did or someone else moved it meanwhile. Watched
        by its ETag, not its token: a transaction its caller restarts under the same token
        (after an abort) is a new record, and gets a new watch."""
        now = time.monotonic()
        first = self._seen_pending.setdefault((tx.token, tx.etag), now)
        if len(self._seen_pending) > 10_000:
            self._seen_pending.pop(next(iter(self._seen_pending)))
        if now - first < self.stale_s:
            return False
        if await self._move(tx, "aborted"):
            log.warning(
                "aborted a transaction left pending",
                table=self.name,
                token=tx.token,
                watched_s=round(now - first, 1),
            )
        return True

    async def _free(self, pk: str, sk: str, mine: str = "") -> _Row:
        """The row, unlocked (or locked by ``mine``): other transactions' locks are finished
        when decided, waited for while pending, and aborted when pending too long."""
        pause = 0.005
        while True:
            row = await self._read(pk, sk)
            if row.lock is None or row.lock == mine:
                return row
            tx = await self._tx(row.lock)
            if tx is not None and tx.state == "pending":
                if not await self._abort_stale(tx):
                    await asyncio.sleep(pause * random.uniform(0.5, 1.5))
                    pause = min(0.2, pause * 2)
                continue  # aborted now, or moved meanwhile: read it all again
            await self._finish(row, "aborted" if tx is None else tx.state)

    async def _seen(self, row: _Row) -> Item | None:
        """The item a reader sees in a row: a committed lock's image (written in for whoever
        left it), else the current value."""
        if row.lock is None:
            return row.item
        fate = await self._fate(row)
        if fate == "pending":
            return row.item
        await self._finish(row, fate)
        return row.after if fate == "committed" else row.item

    # -- the protocol -----------------------------------------------------------------

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        row = await self._read(pk, sk)
        return await self._seen(row)

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> builtins.list[Item]:
        check_start(prefix, start)
        low = _key(start or prefix, "key")
        high = _key(prefix, "key") + "g"  # past every hex key that starts with prefix's
        rows: list[_Row] = []
        async with self._translated(f"{pk}/{prefix}*", "QueryEntities"):
            async for entity in self._client.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={"pk": _key(pk, "partition key"), "low": low, "high": high},
            ):
                rows.append(self._row(pk, _unkey(str(entity["RowKey"])), entity))
        found: list[Item] = []
        for row in rows:
            item = await self._seen(row)
            if item is not None:
                found.append(item)
        return found

    async def _write(
        self,
        pk: str,
        sk: str,
        condition: Condition | None,
        make: Callable[[Item | None], Item | None],
    ) -> Item | None:
        """One conditional write: read, judge, write If-Match what was read, again on a
        lost race. ``make`` gives the new item from the current (None: delete)."""
        deadline = time.monotonic() + WRITE_PATIENCE_S
        pause = 0.005
        while True:
            row = await self._free(pk, sk)
            if not holds(condition, row.item):
                raise ConditionFailed(f"condition failed on {pk}/{sk}")
            new = make(row.item)
            if new is not None:
                _check_size(pk, sk, new)
            try:
                if new is None:
                    await self._remove(row)
                else:
                    await self._replace(row, _chunks(_encode(new), _DATA))
            except (ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
                if time.monotonic() > deadline:
                    raise Throttled(
                        f"table: {pk}/{sk} kept changing under a write for "
                        f"{WRITE_PATIENCE_S:.0f} s (too many writers of one item)"
                    ) from None
                await asyncio.sleep(pause * random.uniform(0.5, 1.5))
                pause = min(0.2, pause * 2)
            else:
                return new

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        whole = copied({**item, "pk": pk, "sk": sk})
        await self._write(pk, sk, condition, lambda cur: whole)

    async def update(self, write: Update) -> Item:
        def make(cur: Item | None) -> Item:
            return updated(write.pk, write.sk, cur, write.set_, write.add)

        new = await self._write(write.pk, write.sk, write.condition, make)
        assert new is not None
        answer: Item = copied(new)
        return answer

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        await self._write(pk, sk, condition, lambda cur: None)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        keys = [(w.pk, w.sk) for w in writes]
        if len(writes) > MAX_TX_WRITES or len(set(keys)) != len(keys):
            raise Rejected(
                f"table: a transaction takes at most {MAX_TX_WRITES} writes, each item "
                f"once; got {len(writes)} writes on {len(set(keys))} items"
            )
        for w in writes:
            _key(w.pk, "partition key"), _key(w.sk, "key")
            if isinstance(w, Put):
                _check_size(w.pk, w.sk, {**w.item, "pk": w.pk, "sk": w.sk})
        tx = await self._begin(token, sorted(keys))
        if tx.state == "committed":
            await self._roll(tx)  # a retry of a transaction that took effect: finish it
            return
        locked: dict[tuple[str, str], tuple[_Row, str]] = {}
        try:
            for w in sorted(writes, key=lambda w: (w.pk, w.sk)):
                locked[(w.pk, w.sk)] = await self._lock(tx, w)
        except ConditionFailed:
            await self._give_up(tx, locked)
            raise
        # Any other failure leaves it undecided: the record stays pending, and a retry with
        # this token carries on, or whoever meets one of its locks aborts it after STALE_S.
        if not await self._move(tx, "committed"):
            now = await self._tx(token)
            if now is None or now.state != "committed":
                await self._give_up(tx, locked)
                raise Throttled(
                    f"table: transaction {token} was aborted by another writer that found it "
                    "pending too long; it is tried again"
                )
        for row, etag in locked.values():
            locked_row = _Row(row.pk, row.sk, etag, row.item, {}, tx.token, row.after)
            with contextlib.suppress(BackendError):  # whoever meets the lock finishes it
                await self._finish(locked_row, "committed")
        await self._maybe_sweep(tx)

    async def _begin(self, token: str, keys: list[tuple[str, str]]) -> _Tx:
        """Insert the transaction's record, pending; or find the one a retry left."""
        props = {"state": "pending", **_chunks(_encode({"keys": [list(k) for k in keys]}), "k")}
        entity = {"PartitionKey": TX_PARTITION, "RowKey": _key(token, "token"), **props}
        while True:
            try:
                async with self._translated(f"transaction {token}", "InsertEntity"):
                    answer = await self._client.create_entity(entity)
                return _Tx(token, "pending", str(answer["etag"]), keys)
            except ResourceExistsError:
                pass
            tx = await self._tx(token)
            if tx is None:
                continue  # swept between the two: insert again
            if tx.state != "aborted":
                return tx  # pending: ours, from a try whose answer was lost; or committed
            # Aborted (a condition failed, or it was stalled): this call starts it again.
            try:
                async with self._translated(f"transaction {token}", "UpdateEntity"):
                    answer = await self._client.update_entity(
                        entity,
                        mode=UpdateMode.REPLACE,
                        etag=tx.etag,
                        match_condition=MatchConditions.IfNotModified,
                    )
                return _Tx(token, "pending", str(answer["etag"]), keys)
            except (ResourceModifiedError, ResourceNotFoundError):
                continue

    async def _lock(self, tx: _Tx, w: TxWrite) -> tuple[_Row, str]:
        """Lock one item for the transaction: its condition judged on its current value, the
        image it leaves written beside that value. The row as locked, and its ETag."""
        while True:
            row = await self._free(w.pk, w.sk, mine=tx.token)
            if not holds(w.condition, row.item):
                raise ConditionFailed(f"transaction cancelled: condition failed on {w.pk}/{w.sk}")
            after: Item | None
            match w:
                case Put(pk, sk, item):
                    after, action = copied({**item, "pk": pk, "sk": sk}), "put"
                case Update(pk, sk, set_, add):
                    after, action = updated(pk, sk, row.item, set_, add), "put"
                case Delete():
                    after, action = None, "delete"
                case Check():
                    after, action = row.item, "keep"
            if after is not None:
                _check_size(w.pk, w.sk, after)
            props = {**row.data, _LOCK: tx.token, _ACTION: action}
            if action == "put":
                assert after is not None
                props.update(_chunks(_encode(after), _AFTER))
            try:
                etag = await self._replace(row, props)
            except (ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
                continue
            row.after, row.lock = after, tx.token
            return row, etag

    async def _give_up(self, tx: _Tx, locked: dict[tuple[str, str], tuple[_Row, str]]) -> None:
        """Abort the transaction and roll back the locks it took."""
        if tx.state == "pending":
            await self._move(tx, "aborted")
        for row, etag in locked.values():
            with contextlib.suppress(BackendError):
                await self._finish(_Row(row.pk, row.sk, etag, row.item, {}, tx.token), "aborted")

    async def _roll(self, tx: _Tx) -> None:
        """Finish a decided transaction on every item it names (those it still locks)."""
        for pk, sk in tx.keys:
            row = await self._read(pk, sk)
            if row.lock == tx.token:
                await self._finish(row, tx.state)

    async def _maybe_sweep(self, tx: _Tx) -> None:
        """Now and then: finish transactions left half-done, and forget records older than
        TOKEN_KEEP_S, both by the service's clock (the Timestamp of the record just
        written is its now)."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        with contextlib.suppress(BackendError):
            await self.sweep()

    async def sweep(self, keep_s: float = TOKEN_KEEP_S) -> int:
        """Finish and delete every transaction record older than ``keep_s`` on the
        service's clock; how many were deleted."""
        probe = f"sweep-{random.getrandbits(64):016x}"
        entity = {"PartitionKey": TX_PARTITION, "RowKey": _key(probe, ""), "state": "aborted"}
        async with self._translated("transaction records", "InsertOrReplaceEntity"):
            await self._client.upsert_entity(entity)
        probed = await self._tx(probe)
        assert probed is not None
        assert probed.stamp is not None
        before = probed.stamp - datetime.timedelta(seconds=keep_s)
        old: list[_Tx] = []
        async with self._translated("transaction records", "QueryEntities"):
            async for e in self._client.query_entities(
                "PartitionKey eq @pk and Timestamp lt @before",
                parameters={"pk": TX_PARTITION, "before": before},
            ):
                old.append(self._tx_of(_unkey(str(e["RowKey"])), e))
        old.append(probed)
        for tx in old:
            if tx.state == "pending":
                await self._move(tx, "aborted")
                if tx.state == "pending":
                    continue  # it moved meanwhile: the next sweep sees it
            await self._roll(tx)
            with contextlib.suppress(ResourceModifiedError, ResourceNotFoundError):
                async with self._translated(f"transaction {tx.token}", "DeleteEntity"):
                    await self._client.delete_entity(
                        TX_PARTITION,
                        _key(tx.token, ""),
                        etag=tx.etag,
                        match_condition=MatchConditions.IfNotModified,
                    )
        return len(old) - 1


def _check_size(pk: str, sk: str, item: Item) -> None:
    size = item_bytes(item)
    if size > MAX_ITEM_BYTES:
        raise Rejected(
            f"table: item {pk}/{sk} of about {size:,} bytes exceeds the "
            f"{MAX_ITEM_BYTES:,}-byte item size limit"
        )
