"""The table protocol on Azure Table storage (through azure.data.tables.aio).

Where Azure's tables are not DynamoDB, and what is done about it:

* **Keys.** PartitionKey and RowKey refuse ``/ \\ # ?`` and control characters, and cmr's
  keys hold them (``jobs#active``, output URLs). Keys are stored as the hex of their UTF-8
  bytes: every key is storable, and hex keeps DynamoDB's byte order, so a prefix query is a
  RowKey range. Azure's keys hold 512 characters: a key past 250 bytes is stored as the
  hex of its first 200 and a digest of it all, each entity keeps its own keys (``kk``),
  and a query's prefix or start may be at most 200 bytes (cmr's are short).
* **Values.** Azure's properties have no null, list or map, and one property holds at most
  64 KiB. An item is stored whole as msgpack (int, float, bool, bytes, None, lists and
  maps keep their types; integers past 64 bits as an extension; map keys must be strings)
  in binary properties of CHUNK bytes, ``d0 d1 ...``. The item limit is DynamoDB's 400 KB
  (the engine sizes its records by it), and MAX_ENCODED_BYTES as stored, so that a lock
  (an item and its pending image) fits one entity. A read that is not such an item (an
  entity written by someone else) is Rejected.
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
* **Tokens and tries.** DynamoDB applies a retried TransactWriteItems with the same
  ClientRequestToken once. Here the record is keyed by the token: a retry finds it, and a
  committed one is finished rather than applied again. A pending one is an earlier try of
  the call whose answer was lost (perhaps with requests still on their way): the retry
  aborts it and restarts the transaction as a new try. Every lock names its try, and a
  lock of another try than its record's is rolled back, never finished. Records are kept
  TOKEN_KEEP_S (the service's clock, its Timestamp) and then swept, with any transaction
  left half-done. A failure no retry can cure (a condition, an item refused) aborts the
  transaction at once and frees its locks.
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
import hashlib
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
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
# Azure's keys hold 1 KiB of UTF-16: 512 characters, 256 bytes as hex. A key of up to
# WHOLE_KEY_BYTES is its hex; a longer one the hex of its first HEAD_KEY_BYTES, "~" and a
# digest of it all (440 characters): byte order and prefixes hold for the head, which is
# where cmr's queries and ranges lie (their prefixes and starts are short, QUERY_KEY_BYTES).
WHOLE_KEY_BYTES = 250
HEAD_KEY_BYTES = 200
QUERY_KEY_BYTES = HEAD_KEY_BYTES
# An item as stored: a lock holds it twice (its value and its pending image) in one entity.
# Azure takes 1 MiB of an entity's binary properties; Azurite 3.35.0 counts an update's
# request body instead (base64: about 780 KB of binary), which this bound keeps a lock
# under. Past it an item is refused at its write, saying so (DynamoDB's limit is 400 KB).
MAX_ENCODED_BYTES = 370_000
TX_PARTITION = "~tx"  # the transaction records' partition: not hex, so no item's
STALE_S = 15.0  # a pending transaction watched this long (our clock) is aborted
TOKEN_KEEP_S = 600  # records kept (DynamoDB keeps a token ten minutes), then swept
SWEEP_EVERY_S = 60.0  # a client sweeps old records at most this often
WRITE_PATIENCE_S = 120.0  # a write losing its If-Match race this long is Throttled
_BIG_INT = 1  # msgpack extension code: an integer past 64 bits, as its decimal text
_DATA = "d"  # the item's properties: d0, d1, ...
_AFTER = "x"  # the image a pending transaction leaves: x0, x1, ...
_LOCK = "lk"  # the token of the transaction holding the item
_TRY = "lt"  # which try of that token's transaction (a retry restarts it under a new one)
_ACTION = "xa"  # what the lock's transaction does: put (the x image), delete, keep
_KEYS = "kk"  # the entity's own (pk, sk), as msgpack: a long key's RowKey is a digest
MAX_WAIT_S = 120.0  # a write waiting on others' transactions this long is Throttled
SWEEP_MAX = 200  # records one sweep finishes at most (the rest: the next sweep)
_UPDATES = {UpdateMode.REPLACE: "UpdateEntity", UpdateMode.MERGE: "MergeEntity"}  # Azure's names


def _key(text: str) -> str:
    """A key as Azure stores it (see WHOLE_KEY_BYTES)."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= WHOLE_KEY_BYTES:
        return raw.hex()
    return raw[:HEAD_KEY_BYTES].hex() + "~" + hashlib.sha256(raw).hexdigest()[:40]


def _query_key(text: str, what: str) -> str:
    """A query's prefix or start, as a RowKey bound: only a head's bytes compare in order."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > QUERY_KEY_BYTES:
        raise Rejected(
            f"table: a query's {what} of {len(raw)} bytes is longer than the "
            f"{QUERY_KEY_BYTES} an Azure table range keeps in order ({text[:60]!r}...)"
        )
    return raw.hex()


def _packed(value: Any) -> Any:
    if isinstance(value, int):
        return msgpack.ExtType(_BIG_INT, str(value).encode())
    raise TypeError(f"a table value cannot be {type(value).__name__}")


def _ext(code: int, data: bytes) -> int:
    if code != _BIG_INT or not data.lstrip(b"-").isdigit():
        raise ValueError(f"unknown extension {code}")
    return int(data)


def _check_keys(value: Any) -> None:
    """Every map key a string, as DynamoDB's are: msgpack would pack an int key, and the
    read (strict_map_key) would then refuse the item for ever."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise Rejected(f"table: a map key must be a string, not {type(k).__name__}")
            _check_keys(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _check_keys(v)


def _encode(item: Item) -> bytes:
    _check_keys(item)
    try:
        return bytes(msgpack.packb(item, default=_packed, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise Rejected(f"table: a value cannot be stored: {exc}") from exc


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
    nonce: str | None = None  # with lock: the try of the lock's transaction


@dataclass
class _Tx:
    token: str
    state: str
    etag: str
    keys: list[tuple[str, str]]
    stamp: datetime.datetime | None = None
    nonce: str = ""  # this try's: a lock of another try of the token is not this one's

    def holds(self, row: _Row) -> bool:
        """Whether ``row``'s lock is this try's."""
        return row.lock == self.token and row.nonce == self.nonce


class _Races:
    """The If-Match races one write loses: each backed off (jittered, 5 ms doubling to
    0.2 s), and past WRITE_PATIENCE_S the write ends, Throttled, rather than run on."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.deadline = time.monotonic() + WRITE_PATIENCE_S
        self.pause = 0.005

    async def lost(self) -> None:
        if time.monotonic() > self.deadline:
            raise Throttled(
                f"table: {self.what} kept changing under a write for "
                f"{WRITE_PATIENCE_S:.0f} s (too many writers of one item)"
            )
        await asyncio.sleep(self.pause * random.uniform(0.5, 1.5))
        self.pause = min(0.2, self.pause * 2)


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
            row.lock, row.nonce = str(lock), str(entity.get(_TRY, ""))
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
                entity = await self._client.get_entity(_key(pk), _key(sk))
        except ResourceNotFoundError:
            return _Row(pk, sk)
        return self._row(pk, sk, entity)

    async def _write_if(
        self,
        entity: dict[str, Any],
        etag: str | None,
        subject: str,
        mode: UpdateMode = UpdateMode.REPLACE,
    ) -> str:
        """Write ``entity`` if it is still at ``etag`` (None: insert, if there is none); its
        new ETag. ResourceModifiedError / ResourceExistsError / ResourceNotFoundError when
        it changed meanwhile: every write of this table is one of these."""
        operation = "InsertEntity" if etag is None else _UPDATES[mode]
        async with self._translated(subject, operation):
            if etag is None:
                answer = await self._client.create_entity(entity)
            else:
                answer = await self._client.update_entity(
                    entity, mode=mode, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        return str(answer["etag"])

    async def _delete_if(self, pk: str, rk: str, etag: str, subject: str) -> None:
        """Delete the entity (Azure's keys) if it is still at ``etag``; raises as
        :meth:`_write_if` does when it changed."""
        async with self._translated(subject, "DeleteEntity"):
            await self._client.delete_entity(
                pk, rk, etag=etag, match_condition=MatchConditions.IfNotModified
            )

    async def _replace(self, row: _Row, props: dict[str, Any]) -> str:
        """Write the entity as ``props`` if it is still as ``row`` was read (insert if it
        was absent); its new ETag."""
        keys = bytes(msgpack.packb([row.pk, row.sk]))
        entity = {"PartitionKey": _key(row.pk), "RowKey": _key(row.sk), _KEYS: keys, **props}
        return await self._write_if(entity, row.etag, f"{row.pk}/{row.sk}")

    async def _remove(self, row: _Row) -> None:
        """Delete the entity if it is still as ``row`` was read."""
        if row.etag is not None:
            await self._delete_if(_key(row.pk), _key(row.sk), row.etag, f"{row.pk}/{row.sk}")

    async def _settle(self, row: _Row, item: Item | None) -> None:
        """Leave the entity holding ``item`` (None: no entity), unlocked, if it is still as
        ``row`` was read. Raises as :meth:`_replace` does when it changed."""
        if item is None:
            await self._remove(row)
        else:
            await self._replace(row, _chunks(_encode(item), _DATA))

    # -- transaction records ----------------------------------------------------------

    def _tx_of(self, entity: Any) -> _Tx:
        token = str(entity.get("tk", ""))
        keys = _decode(_joined(entity, "k") or b"\x80", f"transaction {token}")
        return _Tx(
            token,
            str(entity.get("state", "")),
            str(entity.metadata["etag"]),
            [(str(pk), str(sk)) for pk, sk in keys.get("keys", [])],
            entity.metadata.get("timestamp"),
            str(entity.get("try", "")),
        )

    async def _tx(self, token: str) -> _Tx | None:
        try:
            async with self._translated(f"transaction {token}", "QueryEntity"):
                entity = await self._client.get_entity(TX_PARTITION, _key(token))
        except ResourceNotFoundError:
            return None
        return self._tx_of(entity)

    async def _move(self, tx: _Tx, state: str) -> bool:
        """Move the record from its state to ``state`` if nobody moved it since it was read."""
        entity = {"PartitionKey": TX_PARTITION, "RowKey": _key(tx.token), "state": state}
        subject = f"transaction {tx.token}"
        try:
            etag = await self._write_if(entity, tx.etag, subject, UpdateMode.MERGE)
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        tx.state, tx.etag = state, etag
        return True

    @staticmethod
    def _fate(row: _Row, tx: _Tx | None) -> str:
        """What becomes of a locked row, its lock's record as read: ``committed`` (its image
        stands), ``pending``, or ``aborted`` (its current value stands): a record moved to
        aborted, or a lock of another try than the record's (a try is restarted only once
        aborted), or no record (see :meth:`_seen` for a record swept away)."""
        if tx is None or not tx.holds(row):
            return "aborted"
        return tx.state

    async def _finish(self, row: _Row, fate: str) -> bool:
        """Write a committed transaction's image into a row, or roll an aborted one's lock
        back; False if the row changed meanwhile (finished by someone else, or locked again)."""
        item = row.after if fate == "committed" else row.item
        try:
            await self._settle(row, item)
        except (ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
            return False
        return True

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

    async def _free(self, pk: str, sk: str, mine: _Tx | None = None) -> _Row:
        """The row, unlocked (or locked by the try ``mine``): other transactions' locks are
        finished when decided, waited for while pending, and aborted when pending too long.
        Throttled after MAX_WAIT_S of others' transactions on the row."""
        deadline = time.monotonic() + MAX_WAIT_S
        pause = 0.005
        while True:
            row = await self._read(pk, sk)
            if row.lock is None or (mine is not None and mine.holds(row)):
                return row
            if time.monotonic() > deadline:
                raise Throttled(
                    f"table: {pk}/{sk} was held by other transactions for {MAX_WAIT_S:.0f} s"
                )
            tx = await self._tx(row.lock)
            if tx is not None and tx.holds(row) and tx.state == "pending":
                if not await self._abort_stale(tx):
                    await asyncio.sleep(pause * random.uniform(0.5, 1.5))
                    pause = min(0.2, pause * 2)
                continue  # aborted now, or moved meanwhile: read it all again
            await self._finish(row, self._fate(row, tx))  # changed meanwhile: read again

    async def _seen(self, row: _Row) -> Item | None:
        """The item a reader sees in a row: a committed lock's image (written in for whoever
        left it), else the current value. A lock whose record is gone is rolled back; if the
        row changed meanwhile (the sweep finished a committed transaction and forgot its
        record), it is read again rather than answered from what was read before."""
        while True:
            if row.lock is None:
                return row.item
            tx = await self._tx(row.lock)
            fate = self._fate(row, tx)
            if fate == "pending":
                return row.item
            if await self._finish(row, fate) or tx is not None:
                return row.after if fate == "committed" else row.item
            row = await self._read(row.pk, row.sk)

    # -- the protocol -----------------------------------------------------------------

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        row = await self._read(pk, sk)
        return await self._seen(row)

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> builtins.list[Item]:
        check_start(prefix, start)
        low = _query_key(start or prefix, "start")
        # Past every RowKey that starts with prefix's hex: hex digits, and a long key's "~".
        high = _query_key(prefix, "prefix") + "~~"
        rows: list[_Row] = []
        async with self._translated(f"{pk}/{prefix}*", "QueryEntities"):
            async for entity in self._client.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={"pk": _key(pk), "low": low, "high": high},
            ):
                keys = msgpack.unpackb(bytes(entity[_KEYS])) if _KEYS in entity else None
                if not (isinstance(keys, list) and len(keys) == 2 and keys[0] == pk):
                    raise Rejected(f"table: an entity in {pk} is not a cmr item's (its keys)")
                rows.append(self._row(pk, str(keys[1]), entity))
        rows.sort(key=lambda r: r.sk.encode("utf-8", "surrogatepass"))  # long keys' tails
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
        races = _Races(f"{pk}/{sk}")
        while True:
            row = await self._free(pk, sk)
            if not holds(condition, row.item):
                raise ConditionFailed(f"condition failed on {pk}/{sk}")
            new = make(row.item)
            try:
                if new is None:
                    await self._remove(row)
                else:
                    await self._replace(row, _chunks(_stored(pk, sk, new), _DATA))
            except (ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
                await races.lost()
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
            if isinstance(w, Put):
                _stored(w.pk, w.sk, {**w.item, "pk": w.pk, "sk": w.sk})  # refused before any lock
        tx = await self._begin(token, sorted(keys))
        if tx.state == "committed":
            await self._roll(tx)  # a retry of a transaction that took effect: finish it
            return
        locked: dict[tuple[str, str], tuple[_Row, str]] = {}
        try:
            for w in sorted(writes, key=lambda w: (w.pk, w.sk)):
                locked[(w.pk, w.sk)] = await self._lock(tx, w)
        except (ConditionFailed, Rejected):
            # Decided: no try of it could do otherwise. Abort it, and free what it locked.
            await self._give_up(tx, locked)
            raise
        # Any other failure leaves it undecided: the record stays pending, and a retry with
        # this token aborts and restarts it, or whoever meets one of its locks aborts it
        # after stale_s.
        if not await self._move(tx, "committed"):
            now = await self._tx(token)
            if now is None or now.nonce != tx.nonce or now.state != "committed":
                await self._give_up(tx, locked)
                raise Throttled(
                    f"table: transaction {token} was aborted by another writer that found it "
                    "pending too long; it is tried again"
                )
        for row, etag in locked.values():
            with contextlib.suppress(BackendError):  # whoever meets the lock finishes it
                await self._finish(replace(row, etag=etag), "committed")
        await self._maybe_sweep()

    async def _begin(self, token: str, keys: list[tuple[str, str]]) -> _Tx:
        """Insert the transaction's record, pending, as a try of its own; or find the one
        that took effect (committed). A pending record of this token is an earlier try of
        this call whose answer was lost, perhaps with requests of it still on their way:
        it is aborted and the transaction restarted as a new try, whose locks the old try's
        can never be taken for (each lock names its try)."""
        races = _Races(f"transaction {token}")
        while True:
            nonce = secrets.token_hex(8)
            props = {
                "tk": token,
                "try": nonce,
                "state": "pending",
                **_chunks(_encode({"keys": [list(k) for k in keys]}), "k"),
            }
            entity = {"PartitionKey": TX_PARTITION, "RowKey": _key(token), **props}
            subject = f"transaction {token}"
            try:
                etag = await self._write_if(entity, None, subject)
                return _Tx(token, "pending", etag, keys, nonce=nonce)
            except ResourceExistsError:
                pass
            tx = await self._tx(token)
            if tx is not None and tx.state == "committed":
                return tx
            if tx is None or (tx.state == "pending" and not await self._move(tx, "aborted")):
                await races.lost()  # swept, or moved meanwhile: look again
                continue
            try:
                etag = await self._write_if(entity, tx.etag, subject)
                return _Tx(token, "pending", etag, keys, nonce=nonce)
            except (ResourceModifiedError, ResourceNotFoundError):
                await races.lost()

    async def _lock(self, tx: _Tx, w: TxWrite) -> tuple[_Row, str]:
        """Lock one item for the transaction: its condition judged on its current value, the
        image it leaves written beside that value. The row as locked, and its ETag."""
        races = _Races(f"{w.pk}/{w.sk}")
        while True:
            row = await self._free(w.pk, w.sk, mine=tx)
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
            stored = None if after is None else _stored(w.pk, w.sk, after)
            props = {**row.data, _LOCK: tx.token, _TRY: tx.nonce, _ACTION: action}
            if action == "put":
                assert stored is not None
                props.update(_chunks(stored, _AFTER))
            try:
                etag = await self._replace(row, props)
            except (ResourceModifiedError, ResourceNotFoundError, ResourceExistsError):
                await races.lost()
                continue
            row.after, row.lock, row.nonce = after, tx.token, tx.nonce
            return row, etag

    async def _give_up(self, tx: _Tx, locked: dict[tuple[str, str], tuple[_Row, str]]) -> None:
        """Abort the transaction and roll back the locks it took."""
        if tx.state == "pending":
            await self._move(tx, "aborted")
        for row, etag in locked.values():
            with contextlib.suppress(BackendError):
                await self._finish(replace(row, etag=etag), "aborted")

    async def _roll(self, tx: _Tx) -> None:
        """Finish a decided try on every item it names that it still locks (a lock of
        another try of the token is that try's: left to whoever meets it)."""
        for pk, sk in tx.keys:
            row = await self._read(pk, sk)
            if tx.holds(row):
                await self._finish(row, tx.state)

    async def _maybe_sweep(self) -> None:
        """Now and then: finish transactions left half-done, and forget records older than
        TOKEN_KEEP_S, both by the service's clock (the Timestamp of a record just written
        is its now)."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        with contextlib.suppress(BackendError):
            await self.sweep()

    async def sweep(self, keep_s: float = TOKEN_KEEP_S) -> int:
        """Finish and delete the transaction records older than ``keep_s`` on the service's
        clock (SWEEP_MAX at most); how many were deleted."""
        probe = f"sweep {secrets.token_hex(8)}"  # a space: no engine token has one
        entity = {
            "PartitionKey": TX_PARTITION,
            "RowKey": _key(probe),
            "tk": probe,
            "state": "aborted",
        }
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
                old.append(self._tx_of(e))
                if len(old) >= SWEEP_MAX:
                    break
        deleted = 0
        for tx in [*old, probed]:
            if tx.state == "pending" and not await self._move(tx, "aborted"):
                continue  # it moved meanwhile: the next sweep sees it
            await self._roll(tx)
            try:
                await self._delete_if(
                    TX_PARTITION, _key(tx.token), tx.etag, f"transaction {tx.token}"
                )
            except (ResourceModifiedError, ResourceNotFoundError):
                continue  # restarted, or deleted by another sweep
            deleted += tx is not probed
        return deleted


def _stored(pk: str, sk: str, item: Item) -> bytes:
    """The item as stored, once it is checked against DynamoDB's item limit, by its sizing
    (as the engine sizes its records), and against what a lock holds twice within Azure's
    1 MiB entity."""
    size = item_bytes(item)
    if size > MAX_ITEM_BYTES:
        raise Rejected(
            f"table: item {pk}/{sk} of about {size:,} bytes exceeds the "
            f"{MAX_ITEM_BYTES:,}-byte item size limit"
        )
    data = _encode(item)
    if len(data) > MAX_ENCODED_BYTES:
        raise Rejected(
            f"table: item {pk}/{sk} takes {len(data):,} bytes stored, more than the "
            f"{MAX_ENCODED_BYTES:,} an Azure entity holds twice (a value and its pending image)"
        )
    return data
