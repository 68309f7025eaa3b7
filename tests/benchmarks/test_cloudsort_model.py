"""benchmarks/cloudsort.py's model: the network time of a sort's two phases (its input and
its output cannot cross an instance's link at once), each phase taking its CPU or its network
time, the instance store's time from the code's disk passes and its drives' rates, and the
CPU slope between two sizes, from one of the measured runs the results hold."""

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


def test_the_instance_store_is_bounded_by_what_it_writes_and_reads() -> None:
    """Its time is what an instance writes over the drives' write rate plus what it reads
    over their read rate (ScyllaDB's iotune figures in the price table unless given)."""
    row = cloudsort.bill(_measured(), None, design="blob", **OPTIONS)
    written, read = row["disk_bytes_per_input_byte"]
    per_instance = 100e12 / 40
    prices = json.loads((HERE / "cloudsort_prices.json").read_text())["instances"]["i4i.8xlarge"]
    w, r = prices["nvme_write_mb_s"] * 1e6, prices["nvme_read_mb_s"] * 1e6
    expected = per_instance * (written / w + read / r)
    assert row["seconds_if_bound_by"]["disk"] == pytest.approx(expected, rel=0.01)
    slow = cloudsort.bill(
        _measured(), None, design="blob", nvme_read_mb_s=600, nvme_write_mb_s=400, **OPTIONS
    )
    assert slow["bound_by"] == "disk"
    assert slow["seconds_if_bound_by"]["disk"] == pytest.approx(
        per_instance * (written / 400e6 + read / 600e6), rel=0.01
    )
    assert slow["usd_per_tb"] > row["usd_per_tb"]


def test_the_disk_passes_are_the_codes() -> None:
    """The code as built streams each map task's split into its pool, and its object and
    each reducer's output to the store; at e0f2188 all three were files first, written and
    read back."""
    before = cloudsort.bill(_measured(), None, design="blob", code="e0f2188", **OPTIONS)
    now = cloudsort.bill(_measured(), None, design="blob", **OPTIONS)
    gone = set(before["disk_passes"]) - set(now["disk_passes"])
    assert gone == {
        "map: the split copied to local files",
        "map: the object's file, read to upload it",
        "reduce: the output file, read to upload it",
    }
    assert now["disk_passes"]["reduce: the fetched parts, decompressed"] == (1.0, 1.0)
    # 78 GB a partition, ~3.3 times that held, against 4 GiB: sorted runs, merged once.
    assert now["disk_passes"]["reduce: sorted runs"] == (1.0, 1.0)
    assert now["seconds_if_bound_by"]["disk"] < before["seconds_if_bound_by"]["disk"]
    with pytest.raises(ValueError, match="no disk passes known"):
        cloudsort.disk_traffic(1e12, 10, 10, 3.0, 4096, code="tomorrow")


def test_the_cpu_slope_is_between_two_sizes_only() -> None:
    small = [{"cpu_s": 30.0, "input_bytes": 1_000_000_000}, {"cpu_s": 34.0, "input_bytes": 1e9}]
    large = [{"cpu_s": 55.0, "input_bytes": 2_000_000_000}]
    assert cloudsort.cpu_slope(small, large)["cpu_s_per_gb"] == 23.0  # 55 - median 32
    with pytest.raises(SystemExit):
        cloudsort.cpu_slope(large, small)  # --larger's runs must be the larger
    with pytest.raises(SystemExit):
        cloudsort.cpu_slope(small + large, large)  # one size each


def test_the_reducers_read_the_table_eventually_at_half_the_units() -> None:
    """Their polls of the commit records and their page reads: strong at e0f2188, eventual
    now (each record is written once). On the job's one partition key, DynamoDB serves
    3,000 read units a second before it splits it."""
    before = cloudsort.bill(_measured(), None, design="blob", code="e0f2188", **OPTIONS)
    now = cloudsort.bill(_measured(), None, design="blob", **OPTIONS)
    assert now["units_per_poll"] == before["units_per_poll"] / 2
    per_second_then = before["table_read_units_per_s"] * before["hours"] / now["hours"]
    assert now["table_read_units_per_s"] < 0.55 * per_second_then
    assert now["table_read_units_per_s"] < 1500


BURN_IN_A_POOL = """
import multiprocessing as mp, time
def burn(_):
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
if __name__ == "__main__":
    with mp.get_context("forkserver").Pool(2) as pool:
        pool.map(burn, range(2))
"""


def test_a_runs_cpu_is_told_apart_by_process(tmp_path: Path) -> None:
    """measure's ``cpu_s_by_process``: a pool's processes, forked by the forkserver without
    exec, carry its argv; they are counted as the pool, not as the forkserver."""
    import subprocess
    import sys

    script = tmp_path / "burn.py"
    script.write_text(BURN_IN_A_POOL)
    proc = subprocess.Popen([sys.executable, str(script)])
    with cloudsort.TreeCpu(proc.pid, every=0.05) as cpu:
        assert proc.wait(timeout=60) == 0
    roles = cpu.by_role()
    assert roles["pool"] >= 0.8  # two processes burned 0.6 s each (the last tick may miss some)
    assert roles.get("forkserver", 0.0) < 0.5
    assert sum(roles.values()) == pytest.approx(cpu.seconds, abs=0.05)
