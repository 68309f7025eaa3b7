"""benchmarks/fleet_sim.py (the package benchmarks/fleetsim): its latency middleware really
delays and counts calls, and the protocol really runs in parallel: with service latencies
injected, 4 workers have more map tasks of a fixed job under way at once than 1 can, and
both outputs are exact."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmarks.fleetsim.job import FleetJob, make_input, work_spans
from benchmarks.fleetsim.latency import Latency, with_latency
from benchmarks.fleetsim.meter import Meter, key_kind
from benchmarks.fleetsim.run import run_fleet
from cmr.backends.embedded import embedded_backend
from cmr.testing import sequential


def test_latency_draws_follow_the_table() -> None:
    fixed = Latency({"sqs.SendMessageBatch": (40, 40)})
    assert fixed.draw("sqs.SendMessageBatch") == 0.040  # median = p99: no spread
    assert fixed.draw("s3.GetObject") == 0.0  # no figure, no delay
    assert Latency(scale=0).draw("sqs.SendMessageBatch") == 0.0
    spread = Latency(seed=3)
    draws = sorted(spread.draw("sqs.ReceiveMessage") for _ in range(4000))
    median, p99 = draws[len(draws) // 2], draws[int(len(draws) * 0.99)]
    assert 0.017 < median < 0.023  # LATENCY_MS: 20 ms median, 80 ms p99
    assert 0.060 < p99 < 0.105


async def test_wrapper_delays_and_counts_every_call(tmp_path: Path) -> None:
    latency = Latency(
        {
            "sqs.SendMessageBatch": (40, 40),
            "sqs.ReceiveMessage": (40, 40),
            "dynamodb.PutItem": (30, 30),
        }
    )
    meter = Meter()
    base = embedded_backend(tmp_path)
    be = with_latency(base, latency, meter)
    await be.queues.create("cmr-x-in", visibility_s=30)

    started = time.monotonic()
    await be.queues.send("cmr-x-in", [b"task"] * 12)  # two SendMessageBatch requests
    got = await be.queues.receive("cmr-x-in", max_messages=10)
    await be.table.put("job#x", "map#0000001", {"attempt": "a"})
    elapsed = time.monotonic() - started

    assert len(got) == 10
    assert elapsed >= 0.040 + 0.040 + 0.030 - 0.005
    assert meter.calls["sqs.SendMessageBatch"] == 2
    assert meter.calls["sqs.ReceiveMessage"] == 1
    assert meter.calls["sqs.CreateQueue"] == 1
    assert meter.queues["input queue|messages sent"] == 12
    kind = key_kind("job#x", "map#0000001")
    assert meter.keys[f"{kind}|writes"] == 1
    assert meter.keys[f"{kind}|wcu"] == 1.0
    assert meter.busy_s["sqs.ReceiveMessage"] >= 0.035
    assert base.queues.calls["sqs.SendMessageBatch"] == 2  # the inner backend saw them too


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals under way at one instant."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:  # at a tie an end sorts first: touching spans do not overlap
        now += step
        most = max(most, now)
    return most


@pytest.mark.slow  # two whole fleet runs, ~10 s
async def test_four_workers_run_map_tasks_at_once_one_runs_two(tmp_path: Path) -> None:
    """The protocol runs in parallel: four workers of two map slots each have more than one
    worker's tasks under way at once; one worker never more than its two slots. Counted from
    when each task's modelled compute ran, not timed: a loaded machine makes the job slower,
    not serial. (How much faster four are is benchmarks/fleet_sim.py's to measure.)"""
    maps, reducers = 16, 2
    data = tmp_path / "in"
    split = make_input(data, maps, words=50, vocab=300)
    expected = sequential(FleetJob, data, reducers)
    runs, at_once = {}, {}
    for n in (1, 4):
        work_spans().clear()
        runs[n] = await run_fleet(
            n,
            data,
            tmp_path / f"out-{n}",
            maps=maps,
            split_bytes=split,
            reducers=reducers,
            latency=Latency(seed=n),
            work_ms=150,  # 16 tasks: 8 rounds of 2 slots alone, 2 rounds with 4 workers
            pairs_per_task=50,
            expected=expected,
        )
        assert runs[n].exact, runs[n].problems
        spans = list(work_spans())
        assert len(spans) >= maps, len(spans)  # every task's compute ran
        at_once[n] = _most_at_once(spans)
    assert at_once[1] <= 2, at_once  # one worker: its two map slots
    # 8 when every slot of the four works at once; a serialised protocol (one task at a
    # time, one worker's slots only) gives <= 2, and a fleet of which two workers starve <= 4.
    assert at_once[4] >= 5, at_once
    # Every task committed once (a transaction: only while the job runs).
    assert runs[4].fleet["calls"]["dynamodb.TransactWriteItems"] >= maps
