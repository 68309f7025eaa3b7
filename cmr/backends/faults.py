"""Seeded fault injection around any backend: the chaos the engine must survive, on demand.

``inject(backend, plan)`` wraps the three services of a backend in one :class:`Faults`
middleware (:mod:`cmr.backends.middleware`). It draws from one ``random.Random(plan.seed)``
and counts what it injects, by kind, in one ``Counter`` (``injected(backend)``). Faults
are made through the protocols themselves where they can be (a duplicate delivery is a
lease released at once, a lost lease is a release scheduled a little later), so they work
over the embedded backend and AWS alike, and the requests they cost show up in ``calls``
like any other.

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
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from cmr.backends.base import Backend, Check, Item, Received
from cmr.backends.middleware import Call, Middleware, Proceed, wrap
from cmr.errors import BackendError, Throttled, UsageError

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


class Faults(Middleware):
    """The injector: one seeded RNG and one counter for the three services of a backend.

    Most calls draw the four numbers of ``enter`` and nothing else; ``send``, ``receive``
    and the table's eventual reads draw more, in the order their methods below give.

    Stale reads model a lagging replica from the writes made through this middleware: each
    item's last versions are kept with a global write sequence number, and a stale read picks
    an earlier point of that sequence and answers as of then (a query sees one consistent
    point). An item's history starts "absent" at its first write seen here, so items written
    only by others are never served stale.
    """

    def __init__(self, plan: FaultPlan, rng: random.Random, injected: Counter[str]) -> None:
        self.plan = plan
        self.rng = rng
        self.injected = injected
        self._cuts: set[asyncio.Task[None]] = set()
        self._seq = itertools.count(1)
        self._versions: dict[str, dict[str, deque[Version]]] = {}
        self._below: Backend | None = None

    def bind(self, below: Backend) -> None:
        self._below = below

    @property
    def below(self) -> Backend:
        assert self._below is not None, "bound by wrap"
        return self._below

    def fires(self, p: float) -> bool:
        return self.rng.random() < p  # always one draw, so rates never shift other faults

    async def enter(self, call: Call) -> bool:
        """Delay, throttle or fail a call before it runs; True: fail it after it ran."""
        pause = self.rng.uniform(0, self.plan.delay_max_s)
        throttled = self.fires(self.plan.throttle)
        failed = self.fires(self.plan.server_error)
        after = self.fires(0.5) and call.writes
        if pause > 0:
            self.injected["delay"] += 1
            await asyncio.sleep(pause)
        if throttled:
            self.injected["throttle"] += 1
            raise Throttled(f"{call}: throttled (injected)")
        if failed and not after:
            self.injected["server_error_before"] += 1
            raise BackendError(f"{call}: 500 InternalError (injected)")
        return failed

    def lose_response(self, call: Call) -> BackendError:
        self.injected["server_error_after"] += 1
        return BackendError(f"{call}: 500 InternalError (injected, after the call applied)")

    async def around(self, call: Call, proceed: Proceed) -> Any:
        match call.service, call.method:
            case "queues", "send":
                return await self._send(call, proceed)
            case "queues", "receive":
                return await self._receive(call, proceed)
            case "table", "get":
                return await self._get(call, proceed)
            case "table", "query":
                return await self._query(call, proceed)
        lose = await self.enter(call)
        result = await proceed(call)
        if call.service == "table" and call.writes:
            await self._learn(call, result)
        if lose:
            raise self.lose_response(call)
        return result

    # ------------------------------------------------------------------ queues

    async def _send(self, call: Call, proceed: Proceed) -> None:
        name, bodies = call.args
        lose = await self.enter(call)
        twice = [b for b in bodies if self.fires(self.plan.duplicate_send)]
        self.injected["duplicate_send"] += len(twice)
        await proceed(call.replace(name, [*bodies, *twice]))
        if lose:
            raise self.lose_response(call)

    async def _receive(self, call: Call, proceed: Proceed) -> builtins.list[Received]:
        name = call.args[0]
        lose = await self.enter(call)
        empty = self.fires(self.plan.empty_receive)
        reorder = self.fires(self.plan.reorder)
        if empty:
            self.injected["empty_receive"] += 1
            self.below.queues.calls["sqs.ReceiveMessage"] += 1  # an empty answer is a request
            return []
        limit = max(1, min(10, call.kwargs["max_messages"]))
        got: builtins.list[Received] = await proceed(
            call.replace(max_messages=10 if reorder else limit)
        )
        if lose:
            raise self.lose_response(call)
        if reorder and len(got) > 1:
            self.injected["reorder"] += 1
            skip = self.rng.randrange(len(got))  # the oldest come first; a lagging host misses them
            kept = got[skip:]
            self.rng.shuffle(kept)
            await self._release(name, [*got[:skip], *kept[limit:]])
            got = kept[:limit]
        again: builtins.list[Received] = []
        for m in got:
            dup = self.fires(self.plan.duplicate_delivery)
            cut = self.fires(self.plan.lease_loss)
            cut_after = self.rng.uniform(0, LEASE_CUT_MAX_S)
            if dup:
                again.append(m)
            elif cut:
                self.injected["lease_loss"] += 1
                self._cut_later(name, m.receipt, cut_after)
        self.injected["duplicate_delivery"] += len(again)
        await self._release(name, again)
        return got

    async def _release(self, name: str, messages: Sequence[Received]) -> None:
        if messages:
            # A release that fails leaves the messages leased: they come back on timeout.
            with contextlib.suppress(BackendError):
                await self.below.queues.change_visibility(name, [m.receipt for m in messages], 0)

    def _cut_later(self, name: str, receipt: str, after_s: float) -> None:
        task = asyncio.create_task(self._cut(name, receipt, after_s))
        self._cuts.add(task)
        task.add_done_callback(self._cuts.discard)

    async def _cut(self, name: str, receipt: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        with contextlib.suppress(BackendError):  # deleted message or queue: nothing to cut
            await self.below.queues.change_visibility(name, [receipt], 0)

    async def close(self) -> None:
        """Cancel the lease cuts not yet made (they would outlive the run otherwise)."""
        cuts = builtins.list(self._cuts)
        for task in cuts:
            task.cancel()
        await asyncio.gather(*cuts, return_exceptions=True)

    # ------------------------------------------------------------------ table

    def _record(self, pk: str, sk: str, item: Item | None) -> None:
        part = self._versions.setdefault(pk, {})
        history = part.setdefault(sk, deque([(0, None)], maxlen=HISTORY))
        history.append((next(self._seq), copy.deepcopy(item)))

    async def _learn(self, call: Call, result: Any) -> None:
        """Record the versions a table write made, for stale reads later."""
        match call.method:
            case "put":
                pk, sk, item = call.args
                self._record(pk, sk, {**item, "pk": pk, "sk": sk})
            case "update":
                self._record(call.args[0].pk, call.args[0].sk, result)
            case "delete":
                self._record(call.args[0], call.args[1], None)
            case "transact":
                for w in call.args[0]:
                    if not isinstance(w, Check):
                        # The replica model learns the items as they are now.
                        self._record(w.pk, w.sk, await self.below.table.get(w.pk, w.sk))

    def _lagging_point(self, histories: builtins.list[deque[Version]]) -> int | None:
        """A write sequence number before the latest of these histories, or None if none."""
        seqs = sorted({seq for h in histories for seq, _ in h})
        return self.rng.choice(seqs[:-1]) if len(seqs) > 1 else None

    @staticmethod
    def _as_of(history: deque[Version], point: int) -> Item | None:
        seen = [item for seq, item in history if seq <= point]
        return copy.deepcopy(seen[-1] if seen else history[0][1])

    async def _get(self, call: Call, proceed: Proceed) -> Item | None:
        pk, sk = call.args
        await self.enter(call)
        stale = self.fires(self.plan.stale_read) and not call.kwargs["consistent"]
        found: Item | None = await proceed(call)
        history = self._versions.get(pk, {}).get(sk)
        if stale and history is not None:
            point = self._lagging_point([history])
            if point is not None:
                self.injected["stale_read"] += 1
                return self._as_of(history, point)
        return found

    async def _query(self, call: Call, proceed: Proceed) -> builtins.list[Item]:
        (pk,) = call.args
        prefix, start = call.kwargs["prefix"], call.kwargs["start"]
        await self.enter(call)
        stale = self.fires(self.plan.stale_read) and not call.kwargs["consistent"]
        items: builtins.list[Item] = await proceed(call)
        known = {
            sk: h
            for sk, h in self._versions.get(pk, {}).items()
            if sk.startswith(prefix) and sk >= start
        }
        point = self._lagging_point(builtins.list(known.values())) if stale else None
        if point is None:
            return items
        self.injected["stale_read"] += 1
        by_sk = {str(it["sk"]): it for it in items}
        for sk, history in known.items():
            old = self._as_of(history, point)
            if old is None:
                by_sk.pop(sk, None)
            else:
                by_sk[sk] = old
        return [by_sk[sk] for sk in sorted(by_sk)]


Version = tuple[int, Item | None]  # (write sequence number, the item then; None: absent)


@dataclass
class FaultyBackend(Backend):
    """A backend whose services inject the faults of ``plan``; usable as ``async with``."""

    plan: FaultPlan
    injected: Counter[str]  # faults injected so far, by kind, across the three services
    faults: Faults

    async def close(self) -> None:
        await self.faults.close()

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
    faults = Faults(plan, random.Random(plan.seed), Counter())
    wrapped = wrap(backend, faults)
    return FaultyBackend(
        wrapped.name,
        wrapped.queues,
        wrapped.blobs,
        wrapped.table,
        wrapped.scratch,
        plan,
        faults.injected,
        faults,
        capabilities=wrapped.capabilities,
        local_blobs=wrapped.local_blobs,
    )


def injected(backend: Backend) -> Counter[str]:
    """Faults injected so far, by kind; empty for a backend that ``inject`` did not make."""
    return backend.injected if isinstance(backend, FaultyBackend) else Counter()
