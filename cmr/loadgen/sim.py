"""A simulated replicated store: the model seed 004 (§4.3) conjectures for SimpleDB.

Each item lives on ``replicas`` nodes, one primary and the rest secondaries. A write reaches
every replica synchronously: the primary applies it at once, each secondary buffers it and
applies it ``propagation_ms`` later (jittered, independently per secondary), or earlier when
the next write arrives at that secondary, which first applies whatever it had buffered
(``flush="store"``: a write to any key flushes, as §3.1-3.2 observe; ``"key"``: only the same
key; ``"none"``: timers only). A write of the value the item already holds is suppressed: it
neither flushes nor changes the version (§3.1, Figure 5). A consistent read reads the primary;
an eventual read reads a replica chosen uniformly at random, the primary included, which is why
a read in the first ~500 ms sees the newest value with probability 1/3.

Latencies are lognormal, shaped like seed 002's table (reads: median 16 ms, IQR 14-18;
writes: median 56 ms, IQR 50-103, so sigma ≈ ln(Q3/Q1)/1.349). A call acts on the replicas at
one instant inside its interval: a read samples its replica ``read_effect_point`` of the way
through, a write reaches the replicas ``write_effect_point`` of the way through (late, because
it is acknowledged only after every replica has it). Above ``capacity_ops_s`` calls fail with
``ServiceUnavailable`` (SimpleDB's 503) from a token bucket holding ``burst_s`` seconds of
capacity, i.e. at most ``capacity_ops_s * (burst_s + T)`` calls are admitted in any T seconds.

Time is the running event loop's clock divided into model time by ``time_scale`` (2: twice as
fast as real time). Every state change and every replica sample is a timer callback at an
exact model instant, so the loop's lateness never reorders them; only the caller's recorded
end times can come out late, and ``time_scale`` multiplies that lateness (about 1 ms per timer
on epoll). For fast, exact simulations run under ``VirtualTimeLoop`` instead, whose clock jumps
straight to the next timer: ``run_virtual(main())``.

Single process, state on the instance, one ``random.Random(seed)``: the same seed and the same
sequence of calls give the same answers, and under ``VirtualTimeLoop`` the same timings too.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from cmr.errors import ConditionFailed, Throttled, UsageError

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

__all__ = [
    "ConditionalCheckFailed",
    "ServiceUnavailable",
    "SimConfig",
    "SimStore",
    "VirtualTimeLoop",
    "run_virtual",
]

V = TypeVar("V")
T = TypeVar("T")


class ServiceUnavailable(Throttled):
    """The simulated store is over capacity and refused the call (SimpleDB's 503)."""


class ConditionalCheckFailed(ConditionFailed):
    """A conditional put found another version at the primary; ``current`` is that version."""

    def __init__(self, key: str, expected: int, current: int) -> None:
        super().__init__(f"put to {key!r} expected version {expected}, found {current}")
        self.key = key
        self.expected = expected
        self.current = current


@dataclass(frozen=True)
class SimConfig:
    """Every knob of the simulated store; defaults are seed 004's model with seed 002's timing."""

    replicas: int = 3
    propagation_ms: float = 500.0
    propagation_jitter_ms: float = 10.0  # standard deviation; delays are clipped at zero
    flush: Literal["store", "key", "none"] = "store"
    suppress_redundant_writes: bool = True
    read_median_ms: float = 16.0
    read_sigma: float = 0.19
    write_median_ms: float = 56.0
    write_sigma: float = 0.54
    read_effect_point: float = 0.5
    write_effect_point: float = 0.9
    capacity_ops_s: float | None = None  # None: unlimited
    burst_s: float = 1.0
    seed: int = 0
    time_scale: float = 1.0
    # Run the load in virtual time (VirtualTimeLoop): sleeps cost nothing, so a load test
    # of the model ends as fast as its callbacks run, and its timings are the model's own,
    # exact and untouched by the machine's load. Only the simulated store can: a real one
    # answers in real time.
    virtual: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.replicas < 1:
            problems.append("replicas must be at least 1")
        if self.propagation_ms < 0 or self.propagation_jitter_ms < 0:
            problems.append("propagation_ms and propagation_jitter_ms must be >= 0")
        if self.flush not in ("store", "key", "none"):
            problems.append("flush must be 'store', 'key' or 'none'")
        if self.read_median_ms <= 0 or self.write_median_ms <= 0:
            problems.append("latency medians must be positive")
        if self.read_sigma < 0 or self.write_sigma < 0:
            problems.append("latency sigmas must be >= 0")
        if not (0 <= self.read_effect_point <= 1 and 0 <= self.write_effect_point <= 1):
            problems.append("effect points are fractions of a call's latency, in [0, 1]")
        if self.capacity_ops_s is not None and self.capacity_ops_s <= 0:
            problems.append("capacity_ops_s must be positive (or None for unlimited)")
        if self.burst_s <= 0:
            problems.append("burst_s must be positive")
        if self.time_scale <= 0:
            problems.append("time_scale must be positive")
        if problems:
            raise UsageError("bad simulated store config: " + "; ".join(problems))


class _Replica(Generic[V]):
    """One node's copy: applied (value, version) per key, and writes buffered for later."""

    __slots__ = ("data", "pending")

    def __init__(self) -> None:
        self.data: dict[str, tuple[V, int]] = {}
        self.pending: dict[tuple[str, int], V] = {}

    def read(self, key: str) -> tuple[V | None, int]:
        return self.data.get(key, (None, 0))

    def apply(self, key: str, version: int, value: V) -> None:
        # timers may fire out of order under jitter; a replica never goes back in time
        if version > self.data.get(key, (None, 0))[1]:
            self.data[key] = (value, version)

    def apply_pending(self, key: str, version: int) -> None:
        """The propagation timer of one write; a no-op if a later write already flushed it."""
        if (key, version) in self.pending:
            self.apply(key, version, self.pending.pop((key, version)))

    def flush(self, key: str | None) -> None:
        """Apply buffered writes: all of them, or only those of ``key``."""
        for k, version in sorted(self.pending, key=lambda kv: kv[1]):
            if key is None or k == key:
                self.apply(k, version, self.pending.pop((k, version)))


class SimStore(Generic[V]):
    """The simulated store. ``get``/``put`` must run on an event loop; see the module notes."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.stats: Counter[str] = Counter()  # get, put, rejected, condition_failed, suppressed
        self._rng = random.Random(self.config.seed)
        self._replicas: list[_Replica[V]] = [_Replica() for _ in range(self.config.replicas)]
        cap = self.config.capacity_ops_s
        self._bucket_size = max(1.0, cap * self.config.burst_s) if cap is not None else 0.0
        self._tokens = self._bucket_size
        self._refilled_at: float | None = None

    # the model clock -------------------------------------------------------------------

    def now(self) -> float:
        """Model time in seconds: the running loop's clock times ``time_scale``."""
        return asyncio.get_running_loop().time() * self.config.time_scale

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of model time."""
        await asyncio.sleep(max(0.0, seconds) / self.config.time_scale)

    # the API -----------------------------------------------------------------------------

    async def get(self, key: str, consistent: bool) -> tuple[V | None, int]:
        """(value, version) of ``key``: from the primary if ``consistent``, else any replica.

        A key never written reads as (None, 0).
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        cfg = self.config
        latency = self._latency(cfg.read_median_ms, cfg.read_sigma)
        if not self._admit(t0):
            await self._refuse(loop, t0, latency)
        self.stats["get"] += 1
        replica = self._replicas[0] if consistent else self._rng.choice(self._replicas)
        seen: list[tuple[V | None, int]] = []
        await self._act(
            loop, t0, latency, cfg.read_effect_point, lambda: seen.append(replica.read(key))
        )
        return seen[0]

    async def put(self, key: str, value: V, condition_version: int | None = None) -> int:
        """Write ``value`` to ``key`` and return its new version (1 for the first write).

        With ``condition_version``, the write happens only if the primary holds that version
        (0: the key must not exist) and raises ``ConditionalCheckFailed`` otherwise. A write of
        the value the primary already holds is suppressed and returns the current version.
        Cancelling a put does not recall it: once sent it reaches the replicas.
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        cfg = self.config
        latency = self._latency(cfg.write_median_ms, cfg.write_sigma)
        if not self._admit(t0):
            await self._refuse(loop, t0, self._latency(cfg.read_median_ms, cfg.read_sigma))
        self.stats["put"] += 1
        effect_at = t0 + latency * cfg.write_effect_point / cfg.time_scale
        outcome: list[int | ConditionalCheckFailed] = []
        await self._act(
            loop,
            t0,
            latency,
            cfg.write_effect_point,
            lambda: outcome.append(self._write(loop, effect_at, key, value, condition_version)),
            recall=False,
        )
        result = outcome[0]
        if isinstance(result, ConditionalCheckFailed):
            raise result
        return result

    def snapshot(self) -> list[Mapping[str, tuple[V, int]]]:
        """What each replica has applied, primary first (for tests and reports)."""
        return [dict(r.data) for r in self._replicas]

    # internals ---------------------------------------------------------------------------

    def _latency(self, median_ms: float, sigma: float) -> float:
        """One call's latency in model seconds."""
        return self._rng.lognormvariate(math.log(median_ms / 1000.0), sigma)

    def _admit(self, loop_now: float) -> bool:
        """Take a token from the bucket, or refuse the call."""
        cap = self.config.capacity_ops_s
        if cap is None:
            return True
        now = loop_now * self.config.time_scale
        if self._refilled_at is not None:
            self._tokens = min(self._bucket_size, self._tokens + (now - self._refilled_at) * cap)
        self._refilled_at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    async def _refuse(self, loop: asyncio.AbstractEventLoop, t0: float, latency: float) -> None:
        self.stats["rejected"] += 1
        await asyncio.sleep(max(0.0, t0 + latency / self.config.time_scale - loop.time()))
        raise ServiceUnavailable(
            f"simulated store over capacity ({self.config.capacity_ops_s} ops/s); try again later"
        )

    async def _act(
        self,
        loop: asyncio.AbstractEventLoop,
        t0: float,
        latency: float,
        point: float,
        effect: Callable[[], None],
        *,
        recall: bool = True,
    ) -> None:
        """Run ``effect`` at ``point`` of the call's latency, return at its end."""
        scale = self.config.time_scale
        done: list[bool] = []

        def fire() -> None:
            done.append(True)
            effect()

        handle = loop.call_at(t0 + latency * point / scale, fire)
        try:
            await asyncio.sleep(max(0.0, t0 + latency / scale - loop.time()))
        except asyncio.CancelledError:
            if recall:
                handle.cancel()
            raise
        if not done:
            # a timer due at the same instant as the wake-up may not have run yet
            handle.cancel()
            fire()

    def _write(
        self,
        loop: asyncio.AbstractEventLoop,
        at: float,
        key: str,
        value: V,
        condition_version: int | None,
    ) -> int | ConditionalCheckFailed:
        """The write reaching the replicas at loop time ``at``: the primary decides."""
        cfg = self.config
        primary, secondaries = self._replicas[0], self._replicas[1:]
        current_value, current = primary.read(key)
        if condition_version is not None and condition_version != current:
            self.stats["condition_failed"] += 1
            return ConditionalCheckFailed(key, condition_version, current)
        if cfg.suppress_redundant_writes and current > 0 and current_value == value:
            self.stats["suppressed"] += 1
            return current
        version = current + 1
        primary.apply(key, version, value)
        for secondary in secondaries:
            if cfg.flush != "none":
                secondary.flush(None if cfg.flush == "store" else key)
            secondary.pending[(key, version)] = value
            delay_ms = max(0.0, self._rng.gauss(cfg.propagation_ms, cfg.propagation_jitter_ms))
            # scheduled from the exact arrival instant, so a late loop cannot shift it
            loop.call_at(
                at + delay_ms / 1000.0 / cfg.time_scale, secondary.apply_pending, key, version
            )
        return version


class _SkipAheadSelector(selectors.BaseSelector):
    """A real selector that, instead of waiting for the next timer, moves the clock to it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:
            # no timer pending: only I/O (a thread, a signal) can wake us, so really wait
            return self._inner.select(None)
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock starts at 0 and jumps to the next timer instead of waiting.

    Sleeps cost no wall time, so a simulation runs as fast as its callbacks do and its timings
    are exact and reproducible. Real I/O still works, but time does not pass while it is
    awaited unless nothing else is scheduled.
    """

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_SkipAheadSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh ``VirtualTimeLoop`` and return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
