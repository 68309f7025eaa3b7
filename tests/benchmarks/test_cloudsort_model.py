"""benchmarks/cloudsort.py's model: the network time of a sort's two phases (its input and
its output cannot cross an instance's link at once), each phase taking its CPU or its network
time, the instance store bounded only when asked, and the CPU slope between two sizes,
from one of the measured runs the results hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import cloudsort

HERE = Path(__file__).resolve().parents[2] / "benchmarks"
OPTIONS: dict[str, Any] = dict(
    tb=100, instance="i4i.8xlarge", instances=40, split_gb=32, reducers=1280, memory_mb=4096
)


def _measured(name: str = "results-cloudsort-2000mb-a.json") -> dict[str, Any]:
    m: dict[str, Any] = json.loads((HERE / name).read_text())
    return m


def _bps() -> float:
    prices = json.loads((HERE / "cloudsort_prices.json").read_text())
    gbps = float(prices["instances"]["i4i.8xlarge"]["network_gbps"])
    return gbps * 1e9 / 8 * cloudsort.NETWORK_EFFICIENCY


def test_the_network_time_is_each_phase_at_its_busier_direction() -> None:
    """Maps: the input in, the shuffle out; reducers: the shuffle in, the output out. Each
    phase is the input's size, so the sort's network time is twice it over the bandwidth,
    not half that (the busier direction of the whole run) nor twice that (every byte added)."""
    row = cloudsort.bill(_measured(), None, design="blob", **OPTIONS)
    d = 100e12
    assert row["seconds_if_bound_by"]["network"] == round(2 * d / 40 / _bps())


def test_each_phase_takes_its_cpu_or_its_network_time() -> None:
    m = {**_measured(), "cpu_s_per_gb": 40.0}
    even = cloudsort.bill(m, None, design="blob", map_cpu_share=0.5, **OPTIONS)
    cpu, net = even["seconds_if_bound_by"]["cpu"], even["seconds_if_bound_by"]["network"]
    assert cpu > net  # CPU-bound either way at 40 CPU s per GB
    assert even["seconds_if_bound_by"]["phases"] == cpu  # an even split: each phase's CPU
    lopsided = cloudsort.bill(m, None, design="blob", map_cpu_share=0.9, **OPTIONS)
    # The reduce phase's network is longer than its tenth of the CPU: the sort lengthens.
    assert lopsided["seconds_if_bound_by"]["phases"] == round(0.9 * cpu + net / 2)
    assert lopsided["bound_by"] == "cpu and network by phase"
    assert lopsided["usd_per_tb"] > even["usd_per_tb"]


def test_the_instance_store_is_bounded_only_when_asked() -> None:
    free = cloudsort.bill(_measured(), None, design="blob", **OPTIONS)
    assert free["seconds_if_bound_by"]["disk"] == 0
    slow = cloudsort.bill(_measured(), None, design="blob", nvme_mb_s=3000, **OPTIONS)
    per_instance = free["disk_mb_s_per_instance"] * free["hours"] * 3600  # MB it moves
    assert slow["bound_by"] == "disk"
    assert slow["seconds_if_bound_by"]["disk"] == pytest.approx(per_instance / 3000, rel=0.02)
    assert slow["usd_per_tb"] > free["usd_per_tb"]


def test_the_cpu_slope_is_between_two_sizes_only() -> None:
    small = [{"cpu_s": 30.0, "input_bytes": 1_000_000_000}, {"cpu_s": 34.0, "input_bytes": 1e9}]
    large = [{"cpu_s": 55.0, "input_bytes": 2_000_000_000}]
    assert cloudsort.cpu_slope(small, large)["cpu_s_per_gb"] == 23.0  # 55 - median 32
    with pytest.raises(SystemExit):
        cloudsort.cpu_slope(large, small)  # --larger's runs must be the larger
    with pytest.raises(SystemExit):
        cloudsort.cpu_slope(small + large, large)  # one size each
