"""The meter against the simulated store: seed 004's tables, seed 002's latencies, seed 003's p.

Runs use ``VirtualTimeLoop`` (exact, reproducible, fast) except the capacity test, which runs
on the real clock at ``time_scale``. Rates are checked against the model's prediction within
Z binomial standard deviations; the seed's own figures are quoted beside each check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from cmr.errors import ConditionFailed, Throttled, UsageError
from cmr.loadgen.consistency import (
    Read,
    Write,
    aggregate_bins,
    freshness,
    monotonic_read_violations,
    read_your_writes_violations,
    stale_reads,
    successive_reads,
)
from cmr.loadgen.gamma import gamma, gamma_per_value
from cmr.loadgen.sim import (
    ConditionalCheckFailed,
    ServiceUnavailable,
    SimConfig,
    SimStore,
    VirtualTimeLoop,
    run_virtual,
)

Z = 4.0  # standard deviations a sampled rate may stray from its prediction


def assert_rate(k: int, n: int, p: float, what: str) -> None:
    """k successes in n trials are consistent with probability p (exact when p is 0 or 1)."""
    assert n > 0, f"{what}: no trials"
    sd = math.sqrt(n * p * (1 - p))
    assert abs(k - n * p) <= Z * sd, f"{what}: {k}/{n} = {k / n:.4f}, model {p:.4f} within {Z} sd"


def assert_rate_at_least(k: int, n: int, p: float, what: str) -> None:
    """k/n is not significantly below p."""
    assert n > 0, f"{what}: no trials"
    assert k >= n * p - Z * math.sqrt(n * p * (1 - p)), f"{what}: {k}/{n} = {k / n:.4f} < {p}"


# the seeds' experiment ---------------------------------------------------------------------


@dataclass
class Trace:
    writes: list[Write]
    reads: list[Read]
    store: SimStore[int]


async def staleness_run(
    config: SimConfig,
    *,
    duration_s: float,
    eventual_readers: int = 10,
    consistent_readers: int = 0,
    p_strong: float | None = None,
    write_period_s: float = 1.0,
    think_ms: float = 10.0,
    seed: int = 1,
) -> Trace:
    """Seeds 002/004: one writer writes 1, 2, 3... every period; readers read in a loop.

    Each reader waits uniform(0, think_ms) between reads. With ``p_strong`` every reader
    picks a consistent read with that probability, per read (seed 003).
    """
    store = SimStore[int](config)
    rng = random.Random(seed)
    writes: list[Write] = []
    reads: list[Read] = []
    t0 = store.now()
    stop = t0 + duration_s

    async def writer() -> None:
        for value in itertools.count(1):
            due = t0 + (value - 1) * write_period_s
            await store.sleep(due - store.now())
            if store.now() >= stop:
                return
            start = store.now()
            await store.put("k", value)
            writes.append(Write("k", value, start, store.now()))

    async def reader(name: str, consistent: bool) -> None:
        while store.now() < stop:
            strong = consistent if p_strong is None else rng.random() < p_strong
            start = store.now()
            value, _ = await store.get("k", strong)
            reads.append(Read("k", value, start, store.now(), strong, name))
            await store.sleep(rng.uniform(0, think_ms / 1000))

    await asyncio.gather(
        writer(),
        *(reader(f"e{i}", False) for i in range(eventual_readers)),
        *(reader(f"c{i}", True) for i in range(consistent_readers)),
    )
    return Trace(writes, reads, store)


@functools.cache
def default_trace() -> Trace:
    """60 s of the default model: 60 writes, ~28k eventual and ~11k consistent reads."""
    return run_virtual(staleness_run(SimConfig(seed=2011), duration_s=60, consistent_readers=4))


@pytest.mark.slow
def test_eventual_reads_reproduce_table_1() -> None:
    # Seed 004 Table 1 (lag from the write's start): [0, 450) 33.40%, [500, 1000) 99.78%.
    # The model: a secondary has the value only ~500 ms after the write, so 1/3 before.
    bins = freshness(default_trace().writes, default_trace().reads)["eventual"]
    fresh, n = aggregate_bins(bins, 0, 450)
    assert_rate(fresh, n, 1 / 3, "eventual reads fresh in [0, 450) ms")
    fresh, n = aggregate_bins(bins, 550, 1000)
    assert_rate_at_least(fresh, n, 0.98, "eventual reads fresh in [550, 1000) ms")


@pytest.mark.slow
def test_consistent_reads_are_always_fresh() -> None:
    # seed 004: "With consistent read, the probability is 100% from about 0ms onwards"
    bins = freshness(default_trace().writes, default_trace().reads)["consistent"]
    fresh, n = aggregate_bins(bins, 0, 1000)
    assert n > 5000
    assert_rate(fresh, n, 1.0, "consistent reads fresh")
    assert monotonic_read_violations(default_trace().reads, consistent=True)["violations"] == 0


def test_successive_eventual_reads_reproduce_table_2() -> None:
    # Seed 004 Table 2: stale->stale 39.94%, stale->fresh 21.08%, fresh->stale 23.36%,
    # fresh->fresh 15.63%. Independent replica picks predict 4/9, 2/9, 2/9, 1/9; the
    # fresh->stale pairs are the monotonic-read violations.
    trace = default_trace()
    table = successive_reads(trace.writes, trace.reads, window_ms=(0, 450))
    n = table["pairs"]
    assert_rate(table["stale_stale"], n, 4 / 9, "stale then stale")
    assert_rate(table["stale_fresh"], n, 2 / 9, "stale then fresh")
    assert_rate(table["fresh_stale"], n, 2 / 9, "fresh then stale")
    assert_rate(table["fresh_fresh"], n, 1 / 9, "fresh then fresh")
    mono = monotonic_read_violations(trace.reads, writes=trace.writes, window_ms=(0, 450))
    assert mono == {"pairs": n, "violations": table["fresh_stale"]}


@pytest.mark.slow
def test_gamma_is_zero_for_consistent_reads_and_bounds_eventual_staleness() -> None:
    trace = default_trace()
    consistent = [r for r in trace.reads if r.consistent]
    # writes apply and consistent reads sample the primary inside their intervals
    assert gamma([*trace.writes, *consistent]) == 0
    everything = gamma([*trace.writes, *trace.reads])
    by_value = {w.value: w for w in trace.writes}
    latest_start: dict[int, float] = {}
    ops: list[Write | Read] = [*trace.writes, *trace.reads]
    for op in ops:
        if op.value is not None:
            latest_start[op.value] = max(latest_start.get(op.value, op.start), op.start)
    # below: a read of v starting L after the overwrite v + 1 ended forces Γ >= L, since the
    # writes are ~1 s apart, more than L, and cannot be reordered instead
    worst_lag = max(
        r.start - by_value[r.value + 1].end
        for r in trace.reads
        if r.value is not None and r.value + 1 in by_value
    )
    # above: every conflict pairs a value a with a newer b, scored at most S_a - F_b, and
    # nothing of b ends before w(a + 1) starts
    bound = max(latest_start[v] - by_value[v + 1].start for v in by_value if v + 1 in by_value)
    assert worst_lag <= everything <= bound
    assert worst_lag >= 0.45  # stale reads last to the end of Table 1's [0, 450) window


@pytest.mark.slow
def test_cpq_stale_fraction_falls_linearly_in_p() -> None:
    # Seed 003: each read picks strong with probability p. The stale fraction is then
    # (1 - p) x the all-eventual one; p = 1 is linearizable.
    def run(p: float) -> Trace:
        return run_virtual(
            staleness_run(SimConfig(seed=3), duration_s=30, p_strong=p, seed=int(p * 10) + 5)
        )

    traces = {p: run(p) for p in (0.0, 0.5, 1.0)}
    counts = {p: stale_reads(t.writes, t.reads) for p, t in traces.items()}
    rate = {p: c["stale"] / c["reads"] for p, c in counts.items()}
    assert counts[1.0]["stale"] == 0
    strong = sum(r.consistent for r in traces[0.5].reads)
    assert_rate(strong, len(traces[0.5].reads), 0.5, "reads choosing strong at p = 0.5")
    # the midpoint of the line through p = 0 and p = 1, with both points' sampling error
    var = sum(
        w * w * rate[p] * (1 - rate[p]) / counts[p]["reads"]
        for p, w in ((0.0, 0.5), (1.0, 0.5), (0.5, 1.0))
    )
    expected = (rate[0.0] + rate[1.0]) / 2
    assert abs(rate[0.5] - expected) <= Z * math.sqrt(var), (rate, expected)
    assert rate[0.0] - rate[1.0] > 2 * Z * math.sqrt(var)  # a slope the test can see
    # seed 003's other axis: the share of positive per-value Γ scores falls to zero with p
    positive = {
        p: sum(s > 0 for s in gamma_per_value([*t.writes, *t.reads]).values()) / len(t.writes)
        for p, t in traces.items()
    }
    assert positive[0.0] > 0
    assert positive[1.0] == 0


def test_eventual_reads_miss_your_own_writes() -> None:
    # Seed 004: stale eventual reads happen within one thread, so no read-your-writes.
    # Right after its write, a session's read hits the primary with probability 1/3.
    async def session(consistent: bool) -> tuple[list[Write], list[Read]]:
        store = SimStore[int](SimConfig(seed=9))
        writes, reads = [], []
        for value in range(1, 301):
            start = store.now()
            await store.put("k", value)
            writes.append(Write("k", value, start, store.now()))
            start = store.now()
            seen, _ = await store.get("k", consistent)
            reads.append(Read("k", seen, start, store.now(), consistent, "s"))
        return writes, reads

    writes, reads = run_virtual(session(False))
    ryw = read_your_writes_violations({"s": writes}, reads)
    assert_rate(ryw["violations"], ryw["pairs"], 2 / 3, "eventual read-your-writes violations")
    writes, reads = run_virtual(session(True))
    assert read_your_writes_violations({"s": writes}, reads) == {"pairs": 300, "violations": 0}


# the flushes of seed 004 section 3 ---------------------------------------------------------


async def cycles(
    config: SimConfig, keys: tuple[str, str], values: tuple[int, int], count: int = 100
) -> Counter[str]:
    """Seed 004 §3: write ``keys[0]`` then ``keys[1]`` at once, then read for 3 s, ``count`` times.

    Cycle i writes ``10 * i + values[0]`` then ``10 * i + values[1]``. Reads start 50-400 ms
    into the cycle and are tallied by key and by which write they saw: "k:v1", "x:v0"...
    where v0 is whatever the key held before the cycle.
    """
    store = SimStore[int](config)
    tally: Counter[str] = Counter()
    for i in range(count):
        written: dict[str, dict[int, str]] = {}
        begin = store.now()
        for key, value in zip(keys, values, strict=True):
            await store.put(key, 10 * i + value)
            written.setdefault(key, {})[10 * i + value] = f"v{value}"
        while store.now() < begin + 3.0:
            for key, names in written.items():
                start = store.now()
                seen_value, _ = await store.get(key, False)
                if 0.05 <= start - begin < 0.4:
                    seen = "v0" if seen_value is None else names.get(seen_value, "v0")
                    tally[f"{key}:{seen}"] += 1
            await store.sleep(0.01)
    return tally


def test_a_second_write_flushes_the_first() -> None:
    # Seed 004 §3.1, Figure 4: 50-400 ms after writing v1 then v2, reads saw v0 0.097%,
    # v1 66.339%, v2 33.564%: the second write pushes v1 to the secondaries.
    tally = run_virtual(cycles(SimConfig(seed=4), ("k", "k"), (1, 2)))
    n = tally.total()
    assert tally["k:v0"] == 0
    assert_rate(tally["k:v1"], n, 2 / 3, "v1 after two writes")
    assert_rate(tally["k:v2"], n, 1 / 3, "v2 after two writes")


def test_writing_the_same_value_twice_does_not_flush() -> None:
    # Seed 004 §3.1, Figure 5: with v1 = v2, reads saw v0 66.526% and v1 33.474%.
    tally = run_virtual(cycles(SimConfig(seed=5), ("k", "k"), (1, 1)))
    n = tally.total()
    assert_rate(tally["k:v0"], n, 2 / 3, "v0 after a redundant second write")
    assert_rate(tally["k:v1"], n, 1 / 3, "v1 after a redundant second write")


@pytest.mark.parametrize(("flush", "x_fresh"), [("store", 1.0), ("key", 1 / 3)])
def test_a_write_to_another_key_flushes_too(flush: str, x_fresh: float) -> None:
    # Seed 004 Table 3, "two PutAttributes" to X then Y, in one item: X fresh 99.6%
    # (34.459 + 65.142), Y fresh 34.6%. With flush="key" they would be independent, 1/3 each.
    config = SimConfig(seed=6, flush=flush)  # type: ignore[arg-type]
    tally = run_virtual(cycles(config, ("x", "y"), (1, 1)))
    assert_rate(tally["x:v1"], tally["x:v0"] + tally["x:v1"], x_fresh, f"X fresh ({flush})")
    assert_rate(tally["y:v1"], tally["y:v0"] + tally["y:v1"], 1 / 3, f"Y fresh ({flush})")


# latency, conditions, capacity -------------------------------------------------------------


def median_interval(samples: list[float]) -> tuple[float, float]:
    """A Z-sigma distribution-free interval for the median: order statistics around n/2."""
    ordered = sorted(samples)
    n = len(ordered)
    half_width = Z * math.sqrt(n) / 2
    return ordered[max(0, math.floor(n / 2 - half_width))], ordered[
        min(n - 1, math.ceil(n / 2 + half_width))
    ]


def test_latencies_have_seed_002s_medians() -> None:
    # Seed 002 Table I: reads median 16 ms (eventual and strong alike), writes 56 ms.
    async def writes_only() -> list[float]:
        store = SimStore[int](SimConfig(seed=8))
        latencies = []
        for value in range(2000):
            start = store.now()
            await store.put("k", value)
            latencies.append(store.now() - start)
        return latencies

    trace = default_trace()
    for consistent in (False, True):
        lo, hi = median_interval(
            [r.end - r.start for r in trace.reads if r.consistent == consistent]
        )
        assert lo <= 0.016 <= hi, (consistent, lo, hi)
    lo, hi = median_interval(run_virtual(writes_only()))
    assert lo <= 0.056 <= hi


def test_conditional_puts_and_suppressed_writes() -> None:
    async def main() -> None:
        store = SimStore[str](SimConfig(seed=10))
        assert await store.get("k", True) == (None, 0)
        assert await store.put("k", "a", condition_version=0) == 1
        with pytest.raises(ConditionalCheckFailed) as failed:
            await store.put("k", "b", condition_version=0)
        assert (failed.value.expected, failed.value.current) == (0, 1)
        assert isinstance(failed.value, ConditionFailed)
        assert await store.put("k", "b", condition_version=1) == 2
        assert await store.put("k", "b") == 2  # the same value again is suppressed
        assert store.stats["suppressed"] == 1
        assert await store.get("k", True) == ("b", 2)
        await store.sleep(1.0)
        assert [replica["k"] for replica in store.snapshot()] == [("b", 2)] * 3

        plain = SimStore[str](SimConfig(seed=10, suppress_redundant_writes=False))
        assert await plain.put("k", "a") == 1
        assert await plain.put("k", "a") == 2

    run_virtual(main())


def test_same_seed_same_history() -> None:
    def history() -> list[tuple[object, ...]]:
        trace = run_virtual(staleness_run(SimConfig(seed=12), duration_s=3))
        ops: list[Write | Read] = [*trace.writes, *trace.reads]
        return [dataclasses.astuple(op) for op in ops]

    assert history() == history()


def test_beyond_capacity_the_store_answers_service_unavailable() -> None:
    # Seed 004 §4.1 / seed 000: a jammed store returns 503 ServiceUnavailable. On the real
    # clock at 5x: 20 closed-loop clients offer ~1000 ops/s against 100 ops/s of capacity.
    capacity, burst_s, scale, duration = 100.0, 0.5, 5.0, 2.0

    async def jam(clients: int) -> tuple[list[float], list[float], float, float]:
        store = SimStore[int](
            SimConfig(seed=13, capacity_ops_s=capacity, burst_s=burst_s, time_scale=scale)
        )
        admitted: list[float] = []
        refused: list[float] = []
        start, wall = store.now(), time.perf_counter()

        async def client() -> None:
            while store.now() < start + duration:
                at = store.now()
                try:
                    await store.get("k", False)
                    admitted.append(at - start)
                except Throttled:  # ServiceUnavailable is the project's Throttled
                    refused.append(at - start)

        await asyncio.gather(*(client() for _ in range(clients)))
        return admitted, refused, store.now() - start, time.perf_counter() - wall

    assert issubclass(ServiceUnavailable, Throttled)
    admitted, refused, elapsed, wall = asyncio.run(jam(20))
    assert refused, "a jammed store must refuse calls"
    # a token bucket of burst_s x capacity: never more than that plus capacity x time, and,
    # with clients always waiting, at least capacity x time up to the last refusal
    bucket = capacity * burst_s
    admitted.sort()
    for i, at in enumerate(admitted, start=1):
        assert i <= bucket + capacity * at + 1e-6
    assert len(admitted) >= capacity * max(refused)
    # time_scale runs the model faster than real time, never faster than asked
    assert wall >= elapsed / scale * 0.999

    admitted, refused, _, _ = asyncio.run(jam(1))  # ~50 ops/s: under capacity
    assert refused == []
    assert admitted


def test_virtual_time_loop_jumps_to_the_next_timer() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        before = loop.time()
        await asyncio.sleep(3600)
        return before, loop.time()

    wall = time.perf_counter()
    before, after = run_virtual(main())
    assert after - before == pytest.approx(3600)
    assert time.perf_counter() - wall < 3600  # an hour of model time without an hour of waiting


def test_bad_configs_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="replicas"):
        SimConfig(replicas=0)
    with pytest.raises(UsageError, match="time_scale"):
        SimConfig(time_scale=0)
    with pytest.raises(UsageError, match="effect points"):
        SimConfig(read_effect_point=1.5)
