"""In-process queues, table and a local-directory blob store.

The default backend of ``cmr run``: no network, no services, yet the semantics the engine
relies on are modelled, not idealised: at-least-once delivery with visibility timeouts and
per-delivery receipts (a stale receipt deletes nothing, as SQS allows), message size limits,
atomic conditional writes, and blobs that are plain files.

All state lives on instances; one backend (``embedded_backend``) is shared by the client and
the in-process workers of a run. Requests are counted as AWS would bill them by the
:class:`~cmr.backends.middleware.Counting` middleware the factory puts around the services.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import fcntl
import hashlib
import heapq
import itertools
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from cmr.backends.base import (
    EMBEDDED,
    MAX_TX_WRITES,
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
from cmr.backends.middleware import Counting, wrap
from cmr.errors import BlobMissing, ConditionFailed, QueueGone, Rejected, UsageError

Clock = Callable[[], float]

# SQS's 256 KiB body limit, less the base64 the AWS backend needs for binary bodies: the
# engine packs batches to the same size on both backends.
SQS_BODY_LIMIT = 262_144
MAX_MESSAGE_BYTES = SQS_BODY_LIMIT * 3 // 4 - 1024

INLINE_READ_BYTES = 256 * 1024  # reads this small run on the event loop itself


@dataclass
class _Message:
    body: bytes
    message_id: str
    visible_at: float
    receipt: str = ""
    receive_count: int = 0


@dataclass
class _Queue:
    visibility_s: int
    messages: dict[str, _Message] = field(default_factory=dict)
    # (visible_at, seq, message_id); entries go stale when a message is re-leased or deleted
    ready: list[tuple[float, int, str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class EmbeddedQueues:
    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._queues: dict[str, _Queue] = {}
        self._ids = itertools.count()
        self.calls: Counter[str] = Counter()  # charged by the Counting middleware

    def _get(self, name: str) -> _Queue:
        try:
            return self._queues[name]
        except KeyError:
            raise QueueGone(f"queue {name} does not exist") from None

    def _push(self, q: _Queue, m: _Message) -> None:
        heapq.heappush(q.ready, (m.visible_at, next(self._ids), m.message_id))

    async def create(self, name: str, *, visibility_s: int) -> None:
        self._queues.setdefault(name, _Queue(visibility_s))

    async def delete(self, name: str) -> None:
        q = self._queues.pop(name, None)
        if q is not None:
            q.arrived.set()  # wake long-pollers so they see the queue is gone

    async def list(self, prefix: str) -> builtins.list[str]:
        return sorted(n for n in self._queues if n.startswith(prefix))

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        q = self._get(name)
        for body in bodies:
            if len(body) > self.max_message_bytes:
                raise UsageError(
                    f"message of {len(body)} bytes exceeds the queue limit of "
                    f"{self.max_message_bytes}"
                )
        now = self._clock()
        for body in bodies:
            m = _Message(bytes(body), f"m{next(self._ids)}", now)
            q.messages[m.message_id] = m
            self._push(q, m)
        q.arrived.set()

    def _take(self, q: _Queue, limit: int, visibility_s: int) -> builtins.list[Received]:
        now = self._clock()
        out: builtins.list[Received] = []
        while q.ready and len(out) < limit and q.ready[0][0] <= now:
            visible_at, _, mid = heapq.heappop(q.ready)
            m = q.messages.get(mid)
            if m is None or m.visible_at != visible_at:
                continue  # deleted or re-leased since this entry was pushed
            m.receive_count += 1
            m.receipt = f"{mid}:{m.receive_count}"
            m.visible_at = now + visibility_s
            self._push(q, m)
            out.append(Received(m.body, m.receipt, mid, m.receive_count))
        return out

    def _next_visible_in(self, q: _Queue) -> float | None:
        while q.ready:
            visible_at, _, mid = q.ready[0]
            m = q.messages.get(mid)
            if m is not None and m.visible_at == visible_at:
                return max(0.0, visible_at - self._clock())
            heapq.heappop(q.ready)
        return None

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        # A receive is a network call: it always lets other tasks run, or a loop of receives
        # answered from memory would starve the event loop.
        await asyncio.sleep(0)
        q = self._get(name)
        vis = q.visibility_s if visibility_s is None else visibility_s
        deadline = self._clock() + wait_s
        while True:
            got = self._take(q, max(1, min(10, max_messages)), vis)
            remaining = deadline - self._clock()
            if got or remaining <= 0:
                return got
            nxt = self._next_visible_in(q)
            q.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    q.arrived.wait(), remaining if nxt is None else min(remaining, nxt + 0.001)
                )
            q = self._get(name)

    def _leased(self, q: _Queue, receipt: str) -> _Message | None:
        mid = receipt.rsplit(":", 1)[0]
        m = q.messages.get(mid)
        # A stale receipt (the message was delivered again since) does nothing, as SQS permits.
        if m is None or m.receipt != receipt:
            return None
        return m

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        q = self._get(name)
        for r in receipts:
            m = self._leased(q, r)
            if m is not None:
                del q.messages[m.message_id]

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        q = self._get(name)
        now = self._clock()
        for r in receipts:
            m = self._leased(q, r)
            if m is not None and m.visible_at > now:  # an expired lease cannot be extended
                m.visible_at = now + seconds
                self._push(q, m)
        # Wake long-pollers either way: they sleep until the next message they know of
        # becomes visible, and this may have moved a message's time earlier.
        q.arrived.set()

    async def counts(self, name: str) -> tuple[int, int]:
        q = self._get(name)
        now = self._clock()
        visible = sum(1 for m in q.messages.values() if m.visible_at <= now)
        return visible, len(q.messages) - visible


def file_path(url: str) -> Path:
    """The local path of a ``file://`` URL (plain paths are accepted too)."""
    if url.startswith("file://"):
        # surrogateescape: a file name that is not UTF-8 round-trips to the same bytes.
        return Path(unquote(urlparse(url).path, errors="surrogateescape"))
    if "://" in url:
        raise UsageError(f"{url!r}: the embedded backend stores blobs in local files (file://)")
    return Path(url)


def prefix_path(url: str) -> str:
    """A URL prefix as a local path string, keeping a trailing slash."""
    path = str(file_path(url))
    return path + "/" if url.endswith("/") and not path.endswith("/") else path


def file_url(path: str | Path) -> str:
    return Path(path).absolute().as_uri()


def _into_dir(path: Path, write: Callable[[], object]) -> None:
    """Write a blob file, making its directory. S3 has no directories: a PUT under a prefix
    that a concurrent delete_prefix just removed still succeeds. Here that delete can remove
    the directory between the mkdir and the write, so make it again and retry."""
    for attempt in range(5):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            write()
        except FileNotFoundError:
            if attempt == 4 or path.parent.exists():
                raise
        else:
            return


class EmbeddedBlobs:
    """Blobs as files under any local directory, addressed by ``file://`` URLs."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()  # charged by the Counting middleware

    async def put(self, url: str, data: bytes) -> None:
        path = file_path(url)

        def write() -> None:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data)}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)  # readers never see a half-written blob, as with S3

        await asyncio.to_thread(_into_dir, path, write)

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        path = file_path(url)

        def write() -> str:
            path.parent.mkdir(parents=True, exist_ok=True)
            # The compare and the swap under one lock on the directory, so that writers in
            # other processes (two `cmr run` into one output) are serialised as S3 would.
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = _etag(path.read_bytes())
                except FileNotFoundError:
                    current = None
                if current != etag:
                    raise ConditionFailed(f"{url}: etag is {current}, not {etag}")
                tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data)}.tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
            finally:
                os.close(fd)  # closing the descriptor releases the lock
            return _etag(data)

        return await asyncio.to_thread(write)

    async def get(self, url: str) -> bytes:
        try:
            return await asyncio.to_thread(file_path(url).read_bytes)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobMissing(f"no blob at {url}") from None

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        data = await self.get(url)
        return data, _etag(data)

    async def copy(self, src: str, dst: str) -> None:
        source, target = file_path(src), file_path(dst)

        def link() -> None:
            # Blobs are immutable once written (puts replace whole files), so a hard link is
            # a copy that costs no bytes; across file systems, a real copy.
            tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
            try:
                try:
                    os.link(source, tmp)
                except OSError as exc:
                    if isinstance(exc, FileNotFoundError) and not source.exists():
                        raise
                    shutil.copyfile(source, tmp)
                tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)  # a failed copy leaves nothing behind

        try:
            await asyncio.to_thread(_into_dir, target, link)
        except (FileNotFoundError, IsADirectoryError):
            if not source.is_file():
                raise BlobMissing(f"no blob at {src}") from None
            raise

    async def get_range(self, url: str, start: int, end: int) -> bytes:

        def read() -> bytes:
            with file_path(url).open("rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))

        try:
            if end - start <= INLINE_READ_BYTES:
                # A small read from the page cache takes microseconds, less than the hop to
                # a thread and back: a task of 400 small files would spend more on hops.
                return read()
            return await asyncio.to_thread(read)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobMissing(f"no blob at {url}") from None

    async def size(self, url: str) -> int:
        path = file_path(url)
        if not path.is_file():
            raise BlobMissing(f"no blob at {url}")
        return path.stat().st_size

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return await asyncio.to_thread(self._under, prefix)

    def _under(self, prefix: str) -> builtins.list[BlobInfo]:
        """Files whose path starts with prefix *as a string*, as S3 lists keys: the prefix
        ".../job-1" also matches ".../job-10/x", exactly as it would on S3."""
        raw = prefix_path(prefix)
        root = Path(raw) if raw.endswith("/") else Path(raw).parent
        if not root.is_dir():
            return []
        found = []
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                p = Path(dirpath, f)
                if str(p).startswith(raw) and not f.endswith(".tmp"):
                    found.append(BlobInfo(file_url(p), p.stat().st_size))
        return sorted(found, key=lambda b: b.url)

    async def delete_prefix(self, prefix: str) -> int:

        def remove() -> int:
            gone = self._under(prefix)
            for blob in gone:
                file_path(blob.url).unlink(missing_ok=True)
            raw = prefix_path(prefix)
            if raw.endswith("/"):
                shutil.rmtree(raw, ignore_errors=True)  # empty directories are not blobs
            return len(gone)

        return await asyncio.to_thread(remove)

    async def delete(self, urls: Sequence[str]) -> None:

        def remove() -> None:
            for url in urls:
                file_path(url).unlink(missing_ok=True)

        await asyncio.to_thread(remove)

    async def upload_file(self, path: str, url: str) -> None:
        dst = file_path(url)

        if not os.path.isfile(path):
            raise FileNotFoundError(path)

        def write() -> None:
            # Never in place: the old file may be hard-linked to a published copy.
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{id(dst)}.tmp")
            shutil.copyfile(path, tmp)
            tmp.replace(dst)

        await asyncio.to_thread(_into_dir, dst, write)

    async def download_file(self, url: str, path: str) -> None:
        src = file_path(url)

        def copy_file() -> None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, path)

        try:
            await asyncio.to_thread(copy_file)
        except (FileNotFoundError, IsADirectoryError):
            # Also when a concurrent delete wins the race mid-copy, as S3 would answer 404.
            raise BlobMissing(f"no blob at {url}") from None


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()  # what S3 uses for a PUT


MAX_ITEM_BYTES = 400 * 1024  # DynamoDB's item size limit


def item_bytes(value: Any) -> int:
    """About the size DynamoDB charges an item or value: names and values, UTF-8 lengths,
    numbers at most 21 bytes, a few bytes per list or map element."""
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode()) + 1 + item_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 3 + sum(1 + item_bytes(v) for v in value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 1
    return min(21, 1 + len(repr(value)) // 2)


def _kind(value: Any) -> str:
    """DynamoDB's type of a value: one number type, and booleans are not numbers."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int | float):
        return "N"
    if isinstance(value, str):
        return "S"
    if isinstance(value, bytes):
        return "B"
    return type(value).__name__


def holds(cond: Condition | None, item: Item | None) -> bool:
    """Evaluate a write condition against the current item (None: absent)."""
    cur = item or {}
    match cond:
        case None:
            return True
        case Missing(attr):
            return attr not in cur
        case Present(attr):
            return attr in cur
        case Eq(attr, value):
            return attr in cur and _kind(cur[attr]) == _kind(value) and cur[attr] == value
        case Lt(attr, value):
            v = cur.get(attr)
            return v is not None and _kind(v) == _kind(value) in ("N", "S", "B") and v < value
        case AllOf(parts):
            return all(holds(p, item) for p in parts)
        case AnyOf(parts):
            return any(holds(p, item) for p in parts)
    raise TypeError(f"not a condition: {cond!r}")


TOKENS_KEPT = 10_000  # transaction tokens remembered (DynamoDB: ten minutes' worth)


class EmbeddedTable:
    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Item]] = {}
        self._tokens: dict[str, None] = {}  # insertion-ordered: the oldest are forgotten
        self.calls: Counter[str] = Counter()  # charged by the Counting middleware

    def _store(self, pk: str, sk: str, item: Item) -> None:
        size = item_bytes(item)
        if size > MAX_ITEM_BYTES:
            # As DynamoDB answers: a ValidationException, which no retry can cure.
            raise Rejected(
                f"dynamodb: item {pk}/{sk} of about {size:,} bytes exceeds the "
                f"{MAX_ITEM_BYTES:,}-byte item size limit"
            )
        self._parts.setdefault(pk, {})[sk] = item

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        part = self._parts.setdefault(pk, {})
        if not holds(condition, part.get(sk)):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        self._store(pk, sk, copy.deepcopy({**item, "pk": pk, "sk": sk}))

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        found = self._parts.get(pk, {}).get(sk)
        return copy.deepcopy(found)

    async def query(self, pk: str, *, prefix: str = "", consistent: bool = True) -> list[Item]:
        part = self._parts.get(pk, {})
        return [copy.deepcopy(part[sk]) for sk in sorted(part) if sk.startswith(prefix)]

    async def update(
        self,
        pk: str,
        sk: str,
        *,
        set_: Item | None = None,
        add: dict[str, int] | None = None,
        condition: Condition | None = None,
    ) -> Item:
        cur = self._parts.get(pk, {}).get(sk)
        if not holds(condition, cur):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        new = _updated(pk, sk, cur, set_, add)
        self._store(pk, sk, new)
        return copy.deepcopy(new)

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        part = self._parts.get(pk, {})
        if not holds(condition, part.get(sk)):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        part.pop(sk, None)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        if token in self._tokens:
            return  # a retry of a transaction already applied: DynamoDB answers success
        keys = [(w.pk, w.sk) for w in writes]
        if len(writes) > MAX_TX_WRITES or len(set(keys)) != len(keys):
            raise Rejected(
                f"dynamodb: a transaction takes at most {MAX_TX_WRITES} writes, each item "
                f"once; got {len(writes)} writes on {len(set(keys))} items"
            )
        for w in writes:
            if not holds(w.condition, self._parts.get(w.pk, {}).get(w.sk)):
                raise ConditionFailed(f"transaction cancelled: condition failed on {w.pk}/{w.sk}")
        staged: list[tuple[str, str, Item | None]] = []
        for w in writes:
            match w:
                case Put(pk, sk, item):
                    new: Item | None = copy.deepcopy({**item, "pk": pk, "sk": sk})
                case Update(pk, sk, set_, add):
                    new = _updated(pk, sk, self._parts.get(pk, {}).get(sk), set_, add)
                case Delete(pk, sk):
                    new = None
                case Check():
                    continue
            if new is not None and item_bytes(new) > MAX_ITEM_BYTES:
                raise Rejected(f"dynamodb: item {w.pk}/{w.sk} exceeds the item size limit")
            staged.append((w.pk, w.sk, new))
        for pk, sk, staged_item in staged:
            if staged_item is None:
                self._parts.get(pk, {}).pop(sk, None)
            else:
                self._parts.setdefault(pk, {})[sk] = staged_item
        self._tokens[token] = None
        if len(self._tokens) > TOKENS_KEPT:
            del self._tokens[next(iter(self._tokens))]


def _updated(
    pk: str, sk: str, cur: Item | None, set_: Item | None, add: dict[str, int] | None
) -> Item:
    new: dict[str, Any] = copy.deepcopy(cur) if cur else {"pk": pk, "sk": sk}
    new.update(copy.deepcopy(set_ or {}))
    for k, n in (add or {}).items():
        new[k] = new.get(k, 0) + n
    return new


def embedded_backend(
    scratch: str | Path,
    *,
    queues: EmbeddedQueues | None = None,
    table: EmbeddedTable | None = None,
) -> Backend:
    """The embedded backend with its scratch data under the directory ``scratch``, its
    requests counted. Pass ``queues`` or ``table`` to keep a handle on them (a test's clock)."""
    services = Backend(
        "embedded",
        queues if queues is not None else EmbeddedQueues(),
        EmbeddedBlobs(),
        table if table is not None else EmbeddedTable(),
        file_url(scratch),
        capabilities=EMBEDDED,
    )
    return wrap(services, Counting())


@contextlib.asynccontextmanager
async def temporary_backend(prefix: str = "cmr-scratch-") -> AsyncIterator[Backend]:
    """An embedded backend whose scratch directory is made now and removed on exit."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    try:
        yield embedded_backend(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
