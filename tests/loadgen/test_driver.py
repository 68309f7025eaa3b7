"""The driver on the simulated store, and the measurements it produces.

The sim runs on the event loop's clock (the driver measures real calls); latencies are injected
through the sim's config (sigma 0 makes every call take exactly its median). The tests that
assert on time (a duration kept, ops on time or late, latencies from the intended start) run
on :class:`cmr.virtualtime.VirtualTimeLoop`: the waits between timers cost no real time and a
loaded machine's late timers cannot blur them, so they need not run alone, while the driver's
own work still takes the real time it takes.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from cmr.errors import UsageError
from cmr.loadgen import driver
from cmr.loadgen.consistency import aggregate_bins
from cmr.loadgen.driver import run_task
from cmr.loadgen.recorder import Measurement
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.summary import jam_report, latency_ms, staleness_report
from cmr.loadgen.targets import ERROR_CLASSES, cleanup, prepare
from cmr.virtualtime import in_virtual_time

FAST = {"read_median_ms": 2.0, "write_median_ms": 4.0}

OP_KEYS = {"op", "mode", "count", "ok", "errors", "throughput_ops_s", "latency_ms"}
LATENCY_KEYS = {
    *("min", "q1", "median", "q3", "p95", "p99", "p999", "max", "mean", "sd"),
    "outliers_pct",
}


def jam(**kw: Any) -> LoadTask:
    base: dict[str, Any] = {"kind": "jam", "target": "sim", "task": 0, "seed": 7, "sim": FAST}
    return LoadTask(**{**base, **kw})


async def test_closed_loop_runs_exactly_the_ops_and_splits_modes() -> None:
    task = jam(readers=4, writers=4, items=3, ops=600, consistent_ratio=0.5, conditional_ratio=0.5)
    m = await run_task(task)
    assert m.count() == 600 and m.tasks == 1
    assert {(op, mode) for op, mode in m.pairs()} == {
        ("get", "eventual"),
        ("get", "consistent"),
        ("put", "plain"),
        ("put", "conditional"),
    }
    for op in ("get", "put"):
        modes = [m.count(op, mode) for mode in ("eventual", "consistent", "plain", "conditional")]
        strong, weak = (modes[1], modes[0]) if op == "get" else (modes[3], modes[2])
        assert 0.3 < strong / (strong + weak) < 0.7
    # four writers on three keys, conditioned on the version each last saw: some lose
    assert m.count("put", "conditional", "conditional_failed") > 0
    assert m.count("put", "plain", "conditional_failed") == 0
    assert m.cpu_us > 0 and m.wall_us > 0


@in_virtual_time
async def test_closed_loop_stops_at_the_duration() -> None:
    m = await run_task(jam(readers=2, writers=1, duration_s=0.3))
    assert 0.3 <= m.elapsed_s < 1.0
    assert m.count("get") > 20 and m.count("put") > 10


async def test_jamming_finds_the_capacity() -> None:
    """Seed 000's jam: readers and writers until the store answers 503 ServiceUnavailable."""
    sim = {**FAST, "capacity_ops_s": 200.0, "burst_s": 0.1}
    m = await run_task(jam(readers=10, writers=10, duration_s=0.5, sim=sim))
    report = jam_report(m, "sim", 1)
    assert report["overloaded"]
    assert m.count(outcome="unavailable") > m.count(outcome="ok") > 0
    # the store admits about capacity * (burst + T) calls in T seconds
    assert m.count(outcome="ok") <= 200 * (0.1 + m.elapsed_s) + 5


@in_virtual_time
async def test_open_loop_within_capacity_is_on_time() -> None:
    sim = {"read_median_ms": 20.0, "read_sigma": 0.0}
    m = await run_task(jam(readers=2, writers=0, duration_s=0.5, rate=40.0, sim=sim))
    assert m.count() == 20 and m.dropped == 0
    assert m.late <= 5  # the driver's own work may start a few a little late
    lat = latency_ms(m.histogram("get"))
    assert lat["min"] is not None and lat["median"] is not None
    assert lat["min"] >= 20 and lat["median"] < 2 * 20


@in_virtual_time
async def test_open_loop_beyond_capacity_measures_from_the_intended_start() -> None:
    """Two operators and 50 ms calls serve 40 ops/s; at 200 ops/s the backlog grows, so
    latencies from the intended start grow far past the 50 ms service time (the
    coordinated-omission correction), ops start late, and those waiting too long are dropped."""
    sim = {"read_median_ms": 50.0, "read_sigma": 0.0}
    m = await run_task(jam(readers=2, writers=0, duration_s=1.0, rate=200.0, sim=sim))
    assert m.late > 0 and m.dropped > 0
    assert m.count() + m.dropped == 200
    lat = latency_ms(m.histogram("get"))
    assert lat["min"] is not None and lat["max"] is not None and lat["median"] is not None
    assert lat["min"] >= 50
    assert lat["median"] > 4 * 50 and lat["max"] > 700
    assert lat["max"] <= 1000 * driver.BACKLOG_S + 50 + 20  # the backlog bounds the wait
    assert any("fell behind" in w for w in jam_report(m, "sim", 1)["warnings"])


async def test_open_loop_counts_intended_ops() -> None:
    m = await run_task(jam(readers=2, writers=2, ops=50, rate=500.0))
    assert m.count() + m.dropped == 50


@pytest.mark.slow
@in_virtual_time
async def test_staleness_on_sim_reproduces_seed_004() -> None:
    """Eventual reads are fresh 1/3 of the time until the secondaries apply (~500 ms), then
    always; consistent reads always. Wide tolerances: test_sim validates the analysis."""
    task = LoadTask(
        kind="staleness",
        target="sim",
        task=3,
        seed=11,
        readers=4,
        writers=1,
        duration_s=10.0,
        write_interval_ms=1000,
        consistent_ratio=0.25,
        sim={"time_scale": 2.0},
    )
    m = await run_task(task)
    assert m.staleness is not None
    report = staleness_report(m)
    fresh, reads = aggregate_bins(report["freshness"]["eventual"], 0, 450)
    assert reads > 400 and 0.25 < fresh / reads < 0.42
    fresh, reads = aggregate_bins(report["freshness"]["eventual"], 550, 1000)
    assert reads > 200 and fresh / reads > 0.95
    fresh, reads = aggregate_bins(report["freshness"]["consistent"], 0, 1000)
    assert reads > 200 and fresh == reads
    mono = report["monotonic_read_violations"]
    assert mono["pairs"] > 1000 and 0 < mono["violations"] < mono["pairs"] / 2
    assert report["monotonic_by_mode"]["consistent"]["violations"] == 0
    ryw = report["read_your_writes_violations"]
    assert ryw["pairs"] >= 8  # one session read after each of ~10 writes
    assert report["stale"]["consistent"]["stale"] == 0
    assert 0.1 < report["stale"]["eventual"]["fraction"] < 0.6
    gamma = report["gamma"]
    assert gamma["keys"] == 1 and 300 < gamma["max_ms"] < 700  # about the propagation delay
    assert list(gamma["per_key_ms"]) == ["s-t3-w0-k0"]
    assert report["writes"] >= 9 and report["untraced_ops"] == 0 and report["unjudged_reads"] == 0
    assert report["latency_ms"]["read"]["p95"] < report["latency_ms"]["write"]["p95"]


async def test_staleness_trace_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "TRACE_CAP", 40)
    task = LoadTask(
        kind="staleness",
        target="sim",
        task=0,
        seed=1,
        readers=2,
        writers=1,
        items=2,
        duration_s=0.5,
        write_interval_ms=100,
        sim=FAST,
    )
    m = await run_task(task)
    assert m.staleness is not None
    s = m.staleness
    assert s.untraced > 0 and s.reads + s.writes <= 40
    assert m.count() > 40  # every operation is still measured
    assert len(s.gamma_s) == 2


async def test_staleness_on_sqs_is_refused() -> None:
    task = LoadTask(kind="staleness", target="sqs", task=0, seed=1, ops=5, resources={"queue": "q"})
    with pytest.raises(UsageError, match="no keys"):
        await run_task(task)


# measurements -------------------------------------------------------------------------------------


async def three_measurements() -> list[Measurement]:
    sim = {**FAST, "capacity_ops_s": 400.0, "burst_s": 0.05}
    a = await run_task(jam(readers=3, writers=3, ops=300, consistent_ratio=0.5, sim=sim))
    b = await run_task(jam(readers=2, writers=1, ops=100, rate=300.0, conditional_ratio=1.0))
    c = await run_task(
        LoadTask(
            kind="staleness",
            target="sim",
            task=1,
            seed=3,
            readers=2,
            writers=1,
            duration_s=0.4,
            write_interval_ms=100,
            sim=FAST,
        )
    )
    return [a, b, c]


async def test_merge_is_associative_and_commutative_and_survives_the_wire() -> None:
    a, b, c = await three_measurements()
    left = a.merge(b).merge(c).to_wire()
    right = a.merge(b.merge(c)).to_wire()
    shuffled = c.merge(a).merge(b).to_wire()
    assert left == right == shuffled
    merged = Measurement.from_wire(left)
    assert merged.count() == a.count() + b.count() + c.count()
    assert merged.tasks == 3 and merged.staleness is not None
    assert merged.histogram().get_min_value() == min(
        m.histogram().get_min_value() for m in (a, b, c)
    )
    # JSON and msgpack (lists arrive as tuples) both carry it unchanged
    assert Measurement.from_wire(json.loads(json.dumps(left))).to_wire() == left
    packed = msgpack.unpackb(msgpack.packb(left), use_list=False)
    assert Measurement.from_wire(packed).to_wire() == left
    # merging with an empty measurement changes nothing
    assert Measurement().merge(merged).to_wire() == left


@pytest.mark.slow
async def test_jam_report_has_exactly_the_issue_shape() -> None:
    a, b, _ = await three_measurements()
    report = jam_report(a.merge(b), "sim", 2, 1.5)
    assert {"target", "tasks", "duration_s", "ops"} <= set(report)
    assert (report["target"], report["tasks"], report["duration_s"]) == ("sim", 2, 1.5)
    assert report["ops"]
    for op in report["ops"]:
        assert set(op) == OP_KEYS
        assert op["op"] in ("get", "put")
        assert op["mode"] in ("eventual", "consistent", "plain", "conditional")
        assert set(op["errors"]) == set(ERROR_CLASSES)
        assert op["count"] == op["ok"] + sum(op["errors"].values())
        assert op["throughput_ops_s"] == pytest.approx(op["ok"] / 1.5, abs=1e-3)
        assert set(op["latency_ms"]) == LATENCY_KEYS
    json.dumps(report)


async def test_staleness_report_shape() -> None:
    *_, c = await three_measurements()
    report = staleness_report(c)
    assert set(report["freshness"]) == {"eventual", "consistent"}
    for b in report["freshness"]["eventual"]:
        assert set(b) == {"lag_ms", "reads", "fresh"} and b["lag_ms"][1] - b["lag_ms"][0] == 10
    for name in ("monotonic_read_violations", "read_your_writes_violations"):
        assert set(report[name]) == {"pairs", "violations"}
    assert set(report["latency_ms"]) == {"read", "write"}
    assert report["latency_ms"]["read"]["p95"] is not None
    json.dumps(report)


def test_latency_columns_and_outliers_from_the_histogram() -> None:
    m = Measurement()
    for ms in [10] * 50 + [12] * 45:
        m.record("get", "eventual", "ok", ms / 1000)
    for ms in (100, 200, 300, 400, 500):
        m.record("get", "eventual", "ok", ms / 1000)
    m.record("get", "eventual", "timeout", 5.0)
    lat = latency_ms(m.histogram("get", "eventual"))
    assert lat["min"] == pytest.approx(10, rel=1e-3) and lat["max"] == pytest.approx(500, rel=1e-3)
    assert lat["median"] == pytest.approx(10, rel=1e-3) and lat["q3"] == pytest.approx(12, rel=1e-3)
    assert lat["outliers_pct"] == pytest.approx(5.0)  # Q3 + 1.5 IQR = 15 ms
    report = jam_report(m, "sim", 1, 1.0)
    assert report["ops"][0]["errors"]["timeout"] == 1 and report["ops"][0]["ok"] == 100
    assert latency_ms(m.histogram("put"))["median"] is None


def test_generator_saturation_rule() -> None:
    busy, idle = Measurement(), Measurement()
    busy.finish_task(cpu_s=0.95, wall_s=1.0, elapsed_s=1.0, span=(0.0, 1.0))
    idle.finish_task(cpu_s=0.2, wall_s=1.0, elapsed_s=1.0, span=(0.0, 1.0))
    both = busy.merge(idle)
    assert (both.saturated_tasks, both.tasks) == (1, 2)
    assert any("CPU saturated in 1 of 2" in w for w in jam_report(both, "sim", 2)["warnings"])
    assert jam_report(idle, "sim", 1)["warnings"] == []


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
@pytest.mark.alone
async def test_staleness_on_the_local_dynamodb() -> None:
    """The local DynamoDB (moto) is one copy: every read is fresh, whatever its mode."""
    prepared = await prepare("dynamodb", {})
    resources = prepared.resources
    try:
        task = LoadTask(
            kind="staleness",
            target="dynamodb",
            task=0,
            seed=1,
            readers=3,
            writers=1,
            items=2,
            duration_s=1.0,
            write_interval_ms=100,
            consistent_ratio=0.5,
            resources=resources,
        )
        report = staleness_report(await run_task(task))
        # Enough happened for "every read was fresh" to mean something: each item
        # written several times and read many times. Not a speed bound (a slow CI
        # machine wrote 12 times in the second where this machine writes 20).
        assert report["writes"] >= 3 * 2 and report["reads"] >= 20
        assert report["stale_fraction"] == 0.0 and report["unjudged_reads"] == 0
        assert report["read_your_writes_violations"]["pairs"] >= report["writes"] - 2
        assert report["gamma"]["keys"] == 2 and report["gamma"]["max_ms"] == 0.0
    finally:
        await cleanup(prepared)
