"""Seeded fault injection around any backend: the chaos the engine must survive, on demand.

``inject(backend, plan)`` wraps the three services of a backend. Every wrapper draws from
one ``random.Random(plan.seed)`` and counts what it injects, by kind, in one shared
``Counter`` (``injected(backend)``). Faults are made through the protocols themselves where
they can be (a duplicate delivery is a lease released at once, a lost lease is a release
scheduled a little later), so they work over the embedded backend and AWS alike, and the
requests they cost show up in ``calls`` like any other.

Kinds counted: ``delay``, ``throttle``, ``server_error_before``, ``server_error_after``,
``empty_receive``, ``reorder``, ``duplicate_delivery``, ``lease_loss``, ``duplicate_send``,
``stale_read``.

Every call draws the same four numbers first (delay, throttle, server error, before/after),
then a fixed number per message or a number fixed by the inner service's answer. So the same
seed and the same sequence of calls fire the same faults. Concurrent callers interleave
differently from run to run, which changes the sequence: a failing seed then reproduces the
rates and kinds of faults, and reproduces them exactly only when the run is single-worker
with no lease losses (those land at wall-clock times).

``ConditionFailed``, ``QueueGone`` and ``BlobMissing`` from the inner service pass through
untouched: they are answers, not faults. A server error "after" a call means the inner call
was carried out and only its response was lost; it is drawn for calls that change state,
``receive`` included (the lost messages stay leased until their visibility timeout ends).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import dataclasses
import itertools
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from cmr.backends.base import (
    Backend,
    BlobInfo,
    Blobs,
    Check,
    Condition,
    Item,
    Queues,
    Received,
    Table,
    TxWrite,
)
from cmr.errors import BackendError, Throttled, UsageError

T = TypeVar("T")

LEASE_CUT_MAX_S = 0.3  # a lost lease reappears within this long, well inside any test timeout
HISTORY = 8  # versions remembered per table item for stale reads; older ones are forgotten


@dataclass(frozen=True)
class FaultPlan:
    """What to inject and how often; probabilities are per call unless said per message."""

    seed: int
    duplicate_delivery: float = 0.0  # per received message: also left visible for the next receiver
    lease_loss: float = 0.0  # per received message: lease cut within LEASE_CUT_MAX_S
    empty_receive: float = 0.0  # per receive: [] although messages are visible
    reorder: float = 0.0  # per receive: messages shuffled, the oldest ones possibly skipped
    delay_max_s: float = 0.0  # every call first sleeps uniform(0, delay_max_s)
    throttle: float = 0.0  # per call: Throttled before anything is done
    server_error: float = 0.0  # per call: BackendError; for writes half after the write applied
    stale_read: float = 0.0  # per eventual table read: an older version, from recorded writes
    duplicate_send: float = 0.0  # per sent message: enqueued twice

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "seed":
                continue
            if f.name == "delay_max_s":
                if not value >= 0:
                    raise UsageError(f"FaultPlan.delay_max_s={value!r}: use a duration >= 0")
            elif not 0 <= value <= 1:
                raise UsageError(f"FaultPlan.{f.name}={value!r}: use a probability in [0, 1]")

    @classmethod
    def random(cls, seed: int) -> FaultPlan:
        """Every fault at a moderate rate drawn from the seed, for chaos runs."""
        draw = random.Random(f"cmr.faults.plan:{seed}")  # independent of the injection stream

        def rate(top: float) -> float:
            return round(draw.uniform(0, top), 3)  # short enough to print and paste back

        return cls(
            seed=seed,
            duplicate_delivery=rate(0.2),
            lease_loss=rate(0.2),
            empty_receive=rate(0.2),
            reorder=rate(0.2),
            delay_max_s=rate(0.02),
            throttle=rate(0.05),
            server_error=rate(0.05),
            stale_read=rate(0.2),
            duplicate_send=rate(0.2),
        )

    def describe(self) -> str:
        """A one-line expression that rebuilds this plan (defaults left out)."""
        args = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name == "seed" or getattr(self, f.name) != f.default
        ]
        return f"FaultPlan({', '.join(args)})"

    __str__ = describe


class _Chaos:
    """The state every wrapper of one injected backend shares."""

    def __init__(self, plan: FaultPlan, rng: random.Random, injected: Counter[str]) -> None:
        self.plan = plan
        self.rng = rng
        self.injected = injected

    def fires(self, p: float) -> bool:
        return self.rng.random() < p  # always one draw, so rates never shift other faults

    async def enter(self, op: str, target: str, *, write: bool) -> bool:
        """Delay, throttle or fail a call before it runs; True: fail it after it ran."""
        pause = self.rng.uniform(0, self.plan.delay_max_s)
        throttled = self.fires(self.plan.throttle)
        failed = self.fires(self.plan.server_error)
        after = self.fires(0.5) and write
        if pause > 0:
            self.injected["delay"] += 1
            await asyncio.sleep(pause)
        if throttled:
            self.injected["throttle"] += 1
            raise Throttled(f"{op} {target}: throttled (injected)")
        if failed and not after:
            self.injected["server_error_before"] += 1
            raise BackendError(f"{op} {target}: 500 InternalError (injected)")
        return failed

    def lose_response(self, op: str, target: str) -> BackendError:
        self.injected["server_error_after"] += 1
        return BackendError(f"{op} {target}: 500 InternalError (injected, after the call applied)")

    async def call(
        self, op: str, target: str, run: Callable[[], Awaitable[T]], *, write: bool
    ) -> T:
        lose = await self.enter(op, target, write=write)
        result = await run()
        if lose:
            raise self.lose_response(op, target)
        return result


def _chaos(plan: FaultPlan, rng: random.Random, injected: Counter[str] | None) -> _Chaos:
    return _Chaos(plan, rng, Counter() if injected is None else injected)


class FaultyQueues:
    """Queues with injected faults. ``close()`` cancels lease cuts still pending."""

    def __init__(
        self,
        inner: Queues,
        plan: FaultPlan,
        rng: random.Random,
        injected: Counter[str] | None = None,
    ) -> None:
        self.inner = inner
        self.calls = inner.calls  # the same object, so request counting sees every call
        self._chaos = _chaos(plan, rng, injected)
        self.injected = self._chaos.injected
        self._cuts: set[asyncio.Task[None]] = set()

    @property
    def max_message_bytes(self) -> int:
        return self.inner.max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None:
        self.inner.max_message_bytes = value

    async def create(self, name: str, *, visibility_s: int) -> None:
        await self._chaos.call(
            "sqs.CreateQueue",
            name,
            lambda: self.inner.create(name, visibility_s=visibility_s),
            write=True,
        )

    async def delete(self, name: str) -> None:
        await self._chaos.call("sqs.DeleteQueue", name, lambda: self.inner.delete(name), write=True)

    async def list(self, prefix: str) -> builtins.list[str]:
        return await self._chaos.call(
            "sqs.ListQueues", prefix, lambda: self.inner.list(prefix), write=False
        )

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        c = self._chaos
        lose = await c.enter("sqs.SendMessageBatch", name, write=True)
        twice = [b for b in bodies if c.fires(c.plan.duplicate_send)]
        c.injected["duplicate_send"] += len(twice)
        await self.inner.send(name, [*bodies, *twice])
        if lose:
            raise c.lose_response("sqs.SendMessageBatch", name)

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        c = self._chaos
        lose = await c.enter("sqs.ReceiveMessage", name, write=True)
        empty = c.fires(c.plan.empty_receive)
        reorder = c.fires(c.plan.reorder)
        if empty:
            c.injected["empty_receive"] += 1
            self.calls["sqs.ReceiveMessage"] += 1  # an empty answer is still a request
            return []
        limit = max(1, min(10, max_messages))
        got = await self.inner.receive(
            name, max_messages=10 if reorder else limit, wait_s=wait_s, visibility_s=visibility_s
        )
        if lose:
            raise c.lose_response("sqs.ReceiveMessage", name)
        if reorder and len(got) > 1:
            c.injected["reorder"] += 1
            skip = c.rng.randrange(len(got))  # the oldest come first; a lagging host misses them
            kept = got[skip:]
            c.rng.shuffle(kept)
            await self._release(name, [*got[:skip], *kept[limit:]])
            got = kept[:limit]
        again: builtins.list[Received] = []
        for m in got:
            dup = c.fires(c.plan.duplicate_delivery)
            cut = c.fires(c.plan.lease_loss)
            cut_after = c.rng.uniform(0, LEASE_CUT_MAX_S)
            if dup:
                again.append(m)
            elif cut:
                c.injected["lease_loss"] += 1
                self._cut_later(name, m.receipt, cut_after)
        c.injected["duplicate_delivery"] += len(again)
        await self._release(name, again)
        return got

    async def _release(self, name: str, messages: Sequence[Received]) -> None:
        if messages:
            # A release that fails leaves the messages leased: they come back on timeout.
            with contextlib.suppress(BackendError):
                await self.inner.change_visibility(name, [m.receipt for m in messages], 0)

    def _cut_later(self, name: str, receipt: str, after_s: float) -> None:
        task = asyncio.create_task(self._cut(name, receipt, after_s))
        self._cuts.add(task)
        task.add_done_callback(self._cuts.discard)

    async def _cut(self, name: str, receipt: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        with contextlib.suppress(BackendError):  # deleted message or queue: nothing to cut
            await self.inner.change_visibility(name, [receipt], 0)

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        await self._chaos.call(
            "sqs.DeleteMessageBatch",
            name,
            lambda: self.inner.delete_messages(name, receipts),
            write=True,
        )

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        await self._chaos.call(
            "sqs.ChangeMessageVisibilityBatch",
            name,
            lambda: self.inner.change_visibility(name, receipts, seconds),
            write=True,
        )

    async def counts(self, name: str) -> tuple[int, int]:
        return await self._chaos.call(
            "sqs.GetQueueAttributes", name, lambda: self.inner.counts(name), write=False
        )

    async def close(self) -> None:
        """Cancel the lease cuts not yet made (they would outlive the run otherwise)."""
        cuts = builtins.list(self._cuts)
        for task in cuts:
            task.cancel()
        await asyncio.gather(*cuts, return_exceptions=True)


class FaultyBlobs:
    """Blobs with delays, throttling and server errors (S3 is strongly consistent)."""

    def __init__(
        self,
        inner: Blobs,
        plan: FaultPlan,
        rng: random.Random,
        injected: Counter[str] | None = None,
    ) -> None:
        self.inner = inner
        self.calls = inner.calls
        self._chaos = _chaos(plan, rng, injected)
        self.injected = self._chaos.injected

    async def put(self, url: str, data: bytes) -> None:
        await self._chaos.call("s3.PutObject", url, lambda: self.inner.put(url, data), write=True)

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        return await self._chaos.call(
            "s3.PutObject", url, lambda: self.inner.put_if(url, data, etag=etag), write=True
        )

    async def get(self, url: str) -> bytes:
        return await self._chaos.call("s3.GetObject", url, lambda: self.inner.get(url), write=False)

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        return await self._chaos.call(
            "s3.GetObject", url, lambda: self.inner.get_with_etag(url), write=False
        )

    async def copy(self, src: str, dst: str) -> None:
        await self._chaos.call("s3.CopyObject", dst, lambda: self.inner.copy(src, dst), write=True)

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        return await self._chaos.call(
            "s3.GetObject", url, lambda: self.inner.get_range(url, start, end), write=False
        )

    async def size(self, url: str) -> int:
        return await self._chaos.call(
            "s3.HeadObject", url, lambda: self.inner.size(url), write=False
        )

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return await self._chaos.call(
            "s3.ListObjectsV2", prefix, lambda: self.inner.list(prefix), write=False
        )

    async def delete_prefix(self, prefix: str) -> int:
        return await self._chaos.call(
            "s3.DeleteObjects", prefix, lambda: self.inner.delete_prefix(prefix), write=True
        )

    async def delete(self, urls: Sequence[str]) -> None:
        where = urls[0] if urls else ""
        await self._chaos.call(
            "s3.DeleteObjects", where, lambda: self.inner.delete(urls), write=True
        )

    async def upload_file(self, path: str, url: str) -> None:
        await self._chaos.call(
            "s3.PutObject", url, lambda: self.inner.upload_file(path, url), write=True
        )

    async def download_file(self, url: str, path: str) -> None:
        await self._chaos.call(
            "s3.GetObject", url, lambda: self.inner.download_file(url, path), write=False
        )


Version = tuple[int, Item | None]  # (write sequence number, the item then; None: absent)


class FaultyTable:
    """A table whose eventual reads may answer from a lagging replica.

    The replica is modelled from the writes made through this wrapper: each item's last
    versions are kept with a global write sequence number, and a stale read picks an earlier
    point of that sequence and answers as of then (a query sees one consistent point). An
    item's history starts "absent" at its first write seen here, so items written only by
    others are never served stale.
    """

    def __init__(
        self,
        inner: Table,
        plan: FaultPlan,
        rng: random.Random,
        injected: Counter[str] | None = None,
    ) -> None:
        self.inner = inner
        self.calls = inner.calls
        self._chaos = _chaos(plan, rng, injected)
        self.injected = self._chaos.injected
        self._seq = itertools.count(1)
        self._versions: dict[str, dict[str, deque[Version]]] = {}

    def _record(self, pk: str, sk: str, item: Item | None) -> None:
        part = self._versions.setdefault(pk, {})
        history = part.setdefault(sk, deque([(0, None)], maxlen=HISTORY))
        history.append((next(self._seq), copy.deepcopy(item)))

    def _lagging_point(self, histories: builtins.list[deque[Version]]) -> int | None:
        """A write sequence number before the latest of these histories, or None if none."""
        seqs = sorted({seq for h in histories for seq, _ in h})
        return self._chaos.rng.choice(seqs[:-1]) if len(seqs) > 1 else None

    @staticmethod
    def _as_of(history: deque[Version], point: int) -> Item | None:
        seen = [item for seq, item in history if seq <= point]
        return copy.deepcopy(seen[-1] if seen else history[0][1])

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        async def run() -> None:
            await self.inner.put(pk, sk, item, condition=condition)
            self._record(pk, sk, {**item, "pk": pk, "sk": sk})

        await self._chaos.call("dynamodb.PutItem", f"{pk}/{sk}", run, write=True)

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        c = self._chaos
        await c.enter("dynamodb.GetItem", f"{pk}/{sk}", write=False)
        stale = c.fires(c.plan.stale_read) and not consistent
        found = await self.inner.get(pk, sk, consistent=consistent)
        history = self._versions.get(pk, {}).get(sk)
        if stale and history is not None:
            point = self._lagging_point([history])
            if point is not None:
                c.injected["stale_read"] += 1
                return self._as_of(history, point)
        return found

    async def query(
        self, pk: str, *, prefix: str = "", consistent: bool = True
    ) -> builtins.list[Item]:
        c = self._chaos
        await c.enter("dynamodb.Query", f"{pk}/{prefix}*", write=False)
        stale = c.fires(c.plan.stale_read) and not consistent
        items = await self.inner.query(pk, prefix=prefix, consistent=consistent)
        known = {sk: h for sk, h in self._versions.get(pk, {}).items() if sk.startswith(prefix)}
        point = self._lagging_point(builtins.list(known.values())) if stale else None
        if point is None:
            return items
        c.injected["stale_read"] += 1
        by_sk = {str(it["sk"]): it for it in items}
        for sk, history in known.items():
            old = self._as_of(history, point)
            if old is None:
                by_sk.pop(sk, None)
            else:
                by_sk[sk] = old
        return [by_sk[sk] for sk in sorted(by_sk)]

    async def update(
        self,
        pk: str,
        sk: str,
        *,
        set_: Item | None = None,
        add: dict[str, int] | None = None,
        condition: Condition | None = None,
    ) -> Item:
        async def run() -> Item:
            new = await self.inner.update(pk, sk, set_=set_, add=add, condition=condition)
            self._record(pk, sk, new)
            return new

        return await self._chaos.call("dynamodb.UpdateItem", f"{pk}/{sk}", run, write=True)

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        async def run() -> None:
            await self.inner.delete(pk, sk, condition=condition)
            self._record(pk, sk, None)

        await self._chaos.call("dynamodb.DeleteItem", f"{pk}/{sk}", run, write=True)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        async def run() -> None:
            await self.inner.transact(writes, token=token)
            for w in writes:
                if not isinstance(w, Check):
                    # The replica model learns the items as they are now.
                    self._record(w.pk, w.sk, await self.inner.get(w.pk, w.sk))

        where = ", ".join(f"{w.pk}/{w.sk}" for w in writes[:3])
        await self._chaos.call("dynamodb.TransactWriteItems", where, run, write=True)


@dataclass
class FaultyBackend(Backend):
    """A backend whose services inject the faults of ``plan``; usable as ``async with``."""

    plan: FaultPlan
    injected: Counter[str]  # faults injected so far, by kind, across the three services

    async def close(self) -> None:
        if isinstance(self.queues, FaultyQueues):
            await self.queues.close()

    async def __aenter__(self) -> FaultyBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def inject(backend: Backend, plan: FaultPlan) -> FaultyBackend:
    """The backend with its three services wrapped, sharing one seeded RNG and one counter.

    Call ``close()`` (or use ``async with``) when done, so pending lease cuts are cancelled.
    """
    rng = random.Random(plan.seed)
    counter: Counter[str] = Counter()
    return FaultyBackend(
        backend.name,
        FaultyQueues(backend.queues, plan, rng, counter),
        FaultyBlobs(backend.blobs, plan, rng, counter),
        FaultyTable(backend.table, plan, rng, counter),
        backend.scratch,
        plan,
        counter,
    )


def injected(backend: Backend) -> Counter[str]:
    """Faults injected so far, by kind; empty for a backend that ``inject`` did not make."""
    return backend.injected if isinstance(backend, FaultyBackend) else Counter()
