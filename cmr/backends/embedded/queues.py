"""In-process queues with SQS's delivery semantics: at least once, visibility timeouts,
per-delivery receipts, size limits."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cmr.backends.base import Received
from cmr.clock import monotonic
from cmr.errors import QueueGone, UsageError

Clock = Callable[[], float]

# SQS's 256 KiB body limit, less the base64 the AWS backend needs for binary bodies: the
# engine packs batches to the same size on both backends.
SQS_BODY_LIMIT = 262_144
MAX_MESSAGE_BYTES = SQS_BODY_LIMIT * 3 // 4 - 1024


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
    """Queues in memory. Visibility is measured by ``clock``: by default the running
    event loop's (cmr.clock), so the queues keep the time of the workers that use them,
    virtual time included (cmr.virtualtime)."""

    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(self, clock: Clock = monotonic) -> None:
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
            # asyncio.timeout, never wait_for: Python 3.11's wait_for returns what finished as
            # we were cancelled and loses the cancellation (a stopping worker's slot ran on).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(
                    remaining if nxt is None else min(remaining, nxt + 0.001)
                ):
                    await q.arrived.wait()
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
