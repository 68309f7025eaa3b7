"""One load task: drive a target as its :class:`LoadTask` says and measure it.

``jam``, closed loop (``rate`` unset): ``readers`` + ``writers`` coroutines, like seed 000's
threads, each issuing one operation after the other on a key drawn from ``items`` keys, until
``duration_s`` has passed or ``ops`` operations were started. Latency is each call's own time.

``jam``, open loop (``rate`` set): operations are scheduled at ``rate`` per second and handed
to ``readers`` + ``writers`` operators; each is a read with probability readers / (readers +
writers). Latency is measured from the operation's *intended* start, so time spent waiting
for an operator counts (the coordinated-omission correction). An operation that starts more
than ``LATE_S`` after its intended start is counted late. An operation still waiting
``BACKLOG_S`` after its intended start is dropped instead of sent, and so is a new one when
``BACKLOG_S`` worth of operations (at least one per operator) already wait: that bounds
memory and the drain after the schedule ends. ``ops`` counts intended operations, dropped
ones included.

``staleness``: each of ``writers`` writers owns ``items`` keys and writes the next integer
(1, 2, 3, ...) to each of them every ``write_interval_ms``, then reads each key back once in
its own session (for read-your-writes). ``readers`` readers read random keys continuously.
Every read is strongly consistent with probability ``consistent_ratio``; every jam write is
conditional with probability ``conditional_ratio``. Reads and writes are traced on the loop's
monotonic clock; at the end the task runs the analyses of :mod:`cmr.loadgen.consistency`
(freshness in 10 ms bins since the end of the latest write, monotonic reads, read-your-writes,
stale fractions, seed 004's successive-read table, Γ per key) and keeps only their mergeable
results. The trace is capped at ``TRACE_CAP`` operations; later ones are measured (latency,
errors) but not analysed, and counted as untraced. Reads of a value no recorded write produced
(a write that failed yet took effect, data left by an earlier run) are counted and left out.

Times are model time for the simulated store (loop time times its ``time_scale``) and loop
time otherwise. All random choices come from ``random.Random(task.seed)``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from cmr.aio import TaskGroup
from cmr.errors import UsageError
from cmr.loadgen.consistency import (
    Read,
    Write,
    freshness,
    monotonic_read_violations,
    read_your_writes_violations,
    stale_reads,
    successive_reads,
)
from cmr.loadgen.gamma import gamma_per_key
from cmr.loadgen.recorder import Measurement, Staleness
from cmr.loadgen.sim import VirtualTimeLoop
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.targets import OpFailed, Reply, Target, make_target

__all__ = ["BACKLOG_S", "BIN_MS", "LATE_S", "TRACE_CAP", "run_task"]

LATE_S = 0.010  # an open-loop op starting later than this after its intended start is late
LIVE_REPORT_S = 0.5  # how often a task reports its live counters
TRACE_CAP = 200_000  # staleness ops kept for analysis per task (~100 bytes each)
BIN_MS = 10.0
BACKLOG_S = 1.0  # open loop: the longest an intended op may wait for an operator


class _Clock:
    """Model time: the loop's clock times the target's ``time_scale``."""

    def __init__(self, scale: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.scale = scale

    def now(self) -> float:
        return self._loop.time() * self.scale

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self.scale
        if delay > 0:
            await asyncio.sleep(delay)


class _Budget:
    """When to stop: a deadline, or a number of operations to start."""

    def __init__(self, task: LoadTask, clock: _Clock) -> None:
        self._clock = clock
        self.deadline = None if task.duration_s is None else clock.now() + task.duration_s
        self._left = task.ops

    def take(self) -> bool:
        if self.deadline is not None:
            return self._clock.now() < self.deadline
        assert self._left is not None
        if self._left <= 0:
            return False
        self._left -= 1
        return True


def _read_mode(target: Target, consistent: bool) -> str:
    if not target.consistent_reads:
        return "plain"
    return "consistent" if consistent else "eventual"


def _write_mode(target: Target, conditional: bool) -> str:
    return "conditional" if conditional and target.conditional_writes else "plain"


async def _timed(
    m: Measurement, clock: _Clock, op: str, mode: str, call: Awaitable[Reply], since: float
) -> Reply | None:
    """Await one call, record its outcome and latency since ``since``; None if it failed."""
    try:
        reply = await call
    except OpFailed as exc:
        m.record(op, mode, exc.kind, clock.now() - since, exc.retries)
        return None
    m.record(op, mode, "ok", clock.now() - since, reply.retries)
    return reply


async def _report_live(m: Measurement, report: Callable[..., None]) -> None:
    """Every half second, the operations and errors since the last report (live display)."""
    sent_ops = sent_errors = 0
    try:
        while True:
            await asyncio.sleep(LIVE_REPORT_S)
            ops, errors = m.count(), m.count() - m.count(outcome="ok")
            report(load_ops=ops - sent_ops, load_errors=errors - sent_errors)
            sent_ops, sent_errors = ops, errors
    except asyncio.CancelledError:
        ops, errors = m.count(), m.count() - m.count(outcome="ok")
        report(load_ops=ops - sent_ops, load_errors=errors - sent_errors)
        raise


async def run_task(
    task: LoadTask, target: Target | None = None, report: Callable[..., None] | None = None
) -> Measurement:
    """Run one load task and return what it measured.

    Without ``target`` the task's own is made, set up and closed here; a given one must be
    set up already and is left open.
    """
    if task.kind == "staleness" and task.target == "sqs":
        raise UsageError("staleness needs a keyed store; sqs has no keys (use jam)")
    own = target is None
    if target is None:
        target = make_target(task)
        await target.setup()
    try:
        clock = _Clock(target.time_scale)
        m = Measurement()
        cpu0, wall0, epoch0, model0 = (
            time.process_time(),
            time.perf_counter(),
            time.time(),
            clock.now(),
        )
        live = asyncio.create_task(_report_live(m, report)) if report is not None else None
        if task.kind == "staleness":
            m.staleness = await _staleness(task, target, m, clock)
        elif task.rate is not None:
            await _open_loop(task, target, m, clock)
        else:
            await _closed_loop(task, target, m, clock)
        if live is not None:
            live.cancel()
            await asyncio.wait([live])  # not `suppress(CancelledError)`: ours would vanish
        m.finish_task(
            cpu_s=time.process_time() - cpu0,
            wall_s=time.perf_counter() - wall0,
            elapsed_s=clock.now() - model0,
            span=(epoch0, time.time()),
            # In virtual time the loop runs flat out by design: its CPU is no limit on the
            # load, which waits on no clock.
            saturable=not isinstance(asyncio.get_running_loop(), VirtualTimeLoop),
        )
    finally:
        if own:
            await target.close()
    return m


async def _closed_loop(task: LoadTask, target: Target, m: Measurement, clock: _Clock) -> None:
    rng = random.Random(task.seed)
    keys = task.keys()
    budget = _Budget(task, clock)
    values = itertools.count(1)

    async def reader() -> None:
        while budget.take():
            key = keys[rng.randrange(len(keys))]
            consistent = rng.random() < task.consistent_ratio
            mode = _read_mode(target, consistent)
            await _timed(m, clock, "get", mode, target.get(key, consistent), clock.now())

    async def writer() -> None:
        while budget.take():
            key = keys[rng.randrange(len(keys))]
            conditional = rng.random() < task.conditional_ratio
            mode = _write_mode(target, conditional)
            call = target.put(key, next(values), conditional)
            await _timed(m, clock, "put", mode, call, clock.now())

    async with TaskGroup() as tg:
        for _ in range(task.readers):
            tg.create_task(reader())
        for _ in range(task.writers):
            tg.create_task(writer())


@dataclass(frozen=True, slots=True)
class _Planned:
    intended: float
    read: bool
    key: str
    strong: bool  # consistent read or conditional write
    value: int


async def _open_loop(task: LoadTask, target: Target, m: Measurement, clock: _Clock) -> None:
    rate = task.rate
    if rate is None or rate <= 0:
        raise UsageError("--rate must be positive")
    rng = random.Random(task.seed)
    keys = task.keys()
    operators = task.readers + task.writers
    p_read = task.readers / operators
    capacity = max(operators, math.ceil(rate * BACKLOG_S))
    backlog: deque[_Planned] = deque()
    ready = asyncio.Condition()
    finished = False

    async def schedule() -> None:
        nonlocal finished
        t0 = clock.now()
        deadline = None if task.duration_s is None else t0 + task.duration_s
        for i in itertools.count():
            if task.ops is not None and i >= task.ops:
                break
            intended = t0 + i / rate
            if deadline is not None and intended >= deadline:
                break
            if intended > clock.now():
                await clock.sleep_until(intended)
            elif i % 64 == 0:
                await asyncio.sleep(0)  # far behind: still let the operators run
            read = rng.random() < p_read
            key = keys[rng.randrange(len(keys))]
            strong = rng.random() < (task.consistent_ratio if read else task.conditional_ratio)
            if len(backlog) >= capacity:
                m.dropped += 1
                continue
            backlog.append(_Planned(intended, read, key, strong, i + 1))
            async with ready:
                ready.notify()
        async with ready:
            finished = True
            ready.notify_all()

    async def operator() -> None:
        while True:
            async with ready:
                await ready.wait_for(lambda: bool(backlog) or finished)
                if not backlog:
                    return
                op = backlog.popleft()
            behind = clock.now() - op.intended
            if behind > BACKLOG_S:
                m.dropped += 1  # expired: bounds the wait, and the drain after the schedule
                continue
            if behind > LATE_S:
                m.late += 1
            if op.read:
                mode = _read_mode(target, op.strong)
                await _timed(m, clock, "get", mode, target.get(op.key, op.strong), op.intended)
            else:
                mode = _write_mode(target, op.strong)
                call = target.put(op.key, op.value, op.strong)
                await _timed(m, clock, "put", mode, call, op.intended)

    async with TaskGroup() as tg:
        tg.create_task(schedule())
        for _ in range(operators):
            tg.create_task(operator())


@dataclass
class _Trace:
    """A staleness task's operations, up to ``TRACE_CAP`` of them."""

    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    session_reads: list[Read] = field(default_factory=list)  # writers reading their own keys
    untraced: int = 0

    def room(self) -> bool:
        if len(self.writes) + len(self.reads) + len(self.session_reads) < TRACE_CAP:
            return True
        self.untraced += 1
        return False


async def _staleness(task: LoadTask, target: Target, m: Measurement, clock: _Clock) -> Staleness:
    rng = random.Random(task.seed)
    if task.target != "sim" and "prefix" not in task.resources:
        # fresh keys on a real store, so values an earlier run left behind are never read
        # (a prepared task has a prefix of its run's own)
        task = replace(task, resources={**task.resources, "prefix": f"s{uuid.uuid4().hex[:8]}-"})
    every = task.keys()
    owned = [every[w * task.items : (w + 1) * task.items] for w in range(task.writers)]
    if not every:
        raise UsageError("a staleness task needs at least one writer")
    budget = _Budget(task, clock)
    trace = _Trace()
    interval = task.write_interval_ms / 1000.0

    async def read(key: str, reader: str, into: list[Read]) -> None:
        consistent = rng.random() < task.consistent_ratio
        start = clock.now()
        got = await _timed(
            m, clock, "get", _read_mode(target, consistent), target.get(key, consistent), start
        )
        if got is not None and trace.room():
            # a store without consistent reads (s3) has its reads judged as eventual ones
            strong = consistent and target.consistent_reads
            into.append(Read(key, got.value, start, clock.now(), strong, reader))

    async def write(w: int, key: str, value: int) -> None:
        start = clock.now()
        got = await _timed(m, clock, "put", "plain", target.put(key, value, False), start)
        if got is not None and trace.room():
            trace.writes.append(Write(key, value, start, clock.now()))
        if budget.take():
            await read(key, f"w{w}", trace.session_reads)

    async def writer(w: int) -> None:
        next_at = clock.now()
        for value in itertools.count(1):
            if not budget.take():
                return
            await asyncio.gather(*(write(w, key, value) for key in owned[w]))
            next_at += interval
            await clock.sleep_until(next_at)

    async def reader(r: int) -> None:
        while budget.take():
            await read(every[rng.randrange(len(every))], f"r{r}", trace.reads)

    async with TaskGroup() as tg:
        for w in range(task.writers):
            tg.create_task(writer(w))
        for r in range(task.readers):
            tg.create_task(reader(r))
    return _analyse(task, trace, owned)


def _analyse(task: LoadTask, trace: _Trace, owned: list[list[str]]) -> Staleness:
    written: dict[str, set[int]] = {}
    for w in trace.writes:
        written.setdefault(w.key, set()).add(w.value)

    def judged(reads: list[Read]) -> list[Read]:
        return [r for r in reads if r.value is None or r.value in written.get(r.key, ())]

    reads, session = judged(trace.reads), judged(trace.session_reads)
    s = Staleness()
    s.writes = len(trace.writes)
    s.reads = len(reads)
    s.unjudged = len(trace.reads) + len(trace.session_reads) - len(reads) - len(session)
    s.untraced = trace.untraced
    max_ms = max(1000.0, math.ceil(task.write_interval_ms / BIN_MS) * BIN_MS)
    for mode, bins in freshness(trace.writes, reads, bin_ms=BIN_MS, max_ms=max_ms).items():
        s.freshness[mode] = {
            (b["lag_ms"][0], b["lag_ms"][1]): [b["reads"], b["fresh"]] for b in bins
        }
    for mode, consistent in (("eventual", False), ("consistent", True)):
        mono = monotonic_read_violations(reads, consistent=consistent)
        s.monotonic[mode] = [mono["pairs"], mono["violations"]]
        st = stale_reads(trace.writes, reads, consistent=consistent)
        s.stale[mode] = [st["reads"], st["stale"]]
    owner = {key: f"w{w}" for w, keys in enumerate(owned) for key in keys}
    own: dict[str, list[Write]] = {session: [] for session in set(owner.values())}
    for x in trace.writes:
        own[owner[x.key]].append(x)
    ryw = read_your_writes_violations(own, session)
    s.read_your_writes = [ryw["pairs"], ryw["violations"]]
    table = successive_reads(trace.writes, reads, consistent=False, window_ms=(0, 450))
    s.successive.update({k: v for k, v in table.items() if k != "pairs"})
    s.gamma_s = gamma_per_key([*trace.writes, *reads, *session])
    return s
