"""``cmr loadgen`` end to end on the embedded backend against the simulated store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cmr.cli import app
from cmr.cli.loadgen import loadgen_app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ERROR_KEYS = {"throttled", "unavailable", "timeout", "conditional_failed", "other"}
LATENCY_KEYS = {"min", "q1", "median", "q3", "p95", "p99", "p999", "max", "mean", "sd",
                "outliers_pct"}  # fmt: skip


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["loadgen", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _ok(*args: str) -> str:
    code, out, err = _run(*args)
    assert code == 0, err
    return out


def _png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 10_000


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_loadgen_is_a_subcommand_with_the_four_commands(tmp_path: Path) -> None:
    """``cmr loadgen`` as a user runs it, through the installed ``cmr`` script in a process
    of its own: a brief jam runs as a cmr job on the embedded backend against the simulated
    store and reports every operation; and the four commands are the subcommand's."""
    cmr = Path(sys.executable).with_name("cmr")
    proc = subprocess.run(
        [str(cmr), "loadgen", "jam", "--target", "sim", "--tasks", "2", "--readers", "2",
         "--writers", "2", "--items", "5", "--ops", "40", "--json", "jam.json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = _load(tmp_path / "jam.json")
    assert (data["target"], data["tasks"]) == ("sim", 2)
    series = {(o["op"], o["mode"]): o for o in data["ops"]}
    assert set(series) == {("get", "eventual"), ("put", "plain")}
    assert sum(o["count"] for o in data["ops"]) == 40
    assert all(o["ok"] == o["count"] for o in data["ops"])  # the simulated store never fails
    assert "get eventual" in proc.stdout and "put plain" in proc.stdout  # the table
    commands = set(typer.main.get_group(loadgen_app).commands)
    assert commands == {"jam", "sweep", "staleness", "cpq"}


# In virtual time (--sim virtual=1) the latencies are the model's own, whatever else the
# machine runs: the bounds below need no quiet machine.
@pytest.mark.slow
def test_jam_writes_the_contract_json_a_table_and_box_plots(tmp_path: Path) -> None:
    out = _ok(
        "jam", "--target", "sim", "--tasks", "2", "--readers", "4", "--writers", "4",
        "--items", "10", "--ops", "400", "--consistent-ratio", "0.5",
        "--conditional-ratio", "0.5", "--sim", "virtual=1", "--json", str(tmp_path / "jam.json"),
        "--plots", str(tmp_path / "figs"),
    )  # fmt: skip
    data = _load(tmp_path / "jam.json")
    assert {"target", "tasks", "duration_s", "ops"} <= set(data)
    assert (data["target"], data["tasks"]) == ("sim", 2)
    assert data["duration_s"] > 0
    series = {(o["op"], o["mode"]): o for o in data["ops"]}
    assert set(series) == {
        ("get", "eventual"), ("get", "consistent"), ("put", "plain"), ("put", "conditional"),
    }  # fmt: skip
    assert sum(o["count"] for o in data["ops"]) == 400
    for o in data["ops"]:
        assert {"op", "mode", "count", "ok", "errors", "throughput_ops_s", "latency_ms"} <= set(o)
        assert set(o["errors"]) == ERROR_KEYS
        assert set(o["latency_ms"]) == LATENCY_KEYS
        assert o["ok"] + sum(o["errors"].values()) == o["count"]
        lat = o["latency_ms"]
        assert lat["min"] <= lat["q1"] <= lat["median"] <= lat["q3"] <= lat["max"]
    # seed 002's shapes, as the simulated store draws them: reads ~16 ms, writes ~56 ms
    assert 10 < series[("get", "eventual")]["latency_ms"]["median"] < 30
    assert 25 < series[("put", "plain")]["latency_ms"]["median"] < 120
    assert series[("put", "plain")]["errors"]["conditional_failed"] == 0
    assert "Median (ms)" in out and "get eventual" in out
    _png(tmp_path / "figs" / "jam-latency.png")


@pytest.mark.slow  # two whole load jobs
def test_the_simulated_store_in_virtual_time_repeats_its_timings_exactly(tmp_path: Path) -> None:
    """--sim virtual=1: the same seed gives the same latencies, run after run, and the load
    generator's loop, running flat out by design, is not reported as CPU-saturated."""
    runs = []
    for i in range(2):
        _ok(
            "jam", "--target", "sim", "--tasks", "2", "--readers", "2", "--writers", "2",
            "--ops", "200", "--sim", "virtual=1", "--json", str(tmp_path / f"{i}.json"),
        )  # fmt: skip
        runs.append(_load(tmp_path / f"{i}.json"))
    first, second = ([(o["op"], o["mode"], o["latency_ms"]) for o in r["ops"]] for r in runs)
    assert first == second
    assert runs[0]["duration_s"] == runs[1]["duration_s"] > 0
    assert runs[0]["client_cpu"]["saturated_tasks"] == 0 and runs[0]["warnings"] == []


@pytest.mark.slow
def test_sweep_runs_each_point_with_the_same_ops(tmp_path: Path) -> None:
    out = _ok(
        "sweep", "--target", "sim", "--concurrency", "1,4", "--ops", "200", "--items", "1,10",
        "--op", "put", "--sim", "time_scale=10", "--json", str(tmp_path / "sweep.json"),
        "--plots", str(tmp_path),
    )  # fmt: skip
    data = _load(tmp_path / "sweep.json")
    assert {"target", "items", "points"} <= set(data)
    assert data["items"] == [1, 10]
    points = {(p["items"], p["concurrency"]): p for p in data["points"]}
    assert set(points) == {(1, 1), (1, 4), (10, 1), (10, 4)}
    for p in data["points"]:
        assert {"concurrency", "total_s", "throughput_ops_s", "ops"} <= set(p)
        assert sum(o["count"] for o in p["ops"]) == 200
        assert {o["op"] for o in p["ops"]} == {"put"}
        assert p["throughput_ops_s"] == pytest.approx(sum(o["ok"] for o in p["ops"]) / p["total_s"])
    for items in (1, 10):
        # seed 000: more threads hide the latency, so the same work takes less time
        assert points[(items, 4)]["total_s"] < points[(items, 1)]["total_s"] / 2
    assert "concurrency" in out
    _png(tmp_path / "sweep-total-time.png")


@pytest.mark.slow
def test_staleness_reports_freshness_by_lag(tmp_path: Path) -> None:
    out = _ok(
        "staleness", "--target", "sim", "--duration", "3", "--write-interval-ms", "500",
        "--readers", "4", "--json", str(tmp_path / "stale.json"), "--plots", str(tmp_path),
    )  # fmt: skip
    data = _load(tmp_path / "stale.json")
    assert {"freshness", "monotonic_read_violations", "read_your_writes_violations"} <= set(data)
    assert set(data["freshness"]) == {"eventual", "consistent"}
    for bins in data["freshness"].values():
        for b in bins:
            assert {"lag_ms", "reads", "fresh"} <= set(b)
            assert b["lag_ms"][1] - b["lag_ms"][0] == pytest.approx(10)
            assert 0 <= b["fresh"] <= b["reads"]
    assert set(data["monotonic_read_violations"]) == {"pairs", "violations"}
    assert set(data["read_your_writes_violations"]) == {"pairs", "violations"}
    consistent = [b for b in data["freshness"]["consistent"] if b["reads"]]
    eventual = [b for b in data["freshness"]["eventual"] if b["reads"]]
    assert consistent and all(b["fresh"] == b["reads"] for b in consistent)
    assert sum(b["fresh"] for b in eventual) < sum(b["reads"] for b in eventual)
    assert "[0, 450)" in out and "Consistent Read" in out
    _png(tmp_path / "staleness-freshness.png")


@pytest.mark.slow
def test_cpq_stale_fraction_falls_with_p(tmp_path: Path) -> None:
    out = _ok(
        "cpq", "--target", "sim", "--p", "0,1", "--duration", "3", "--write-interval-ms", "500",
        "--sim", "time_scale=3", "--sim", "virtual=1", "--json", str(tmp_path / "cpq.json"),
        "--plots", str(tmp_path),
    )  # fmt: skip
    data = _load(tmp_path / "cpq.json")
    assert {"target", "points"} <= set(data)
    by_p = {p["p"]: p for p in data["points"]}
    assert set(by_p) == {0.0, 1.0}
    for p in data["points"]:
        assert {"p", "stale_fraction", "read_p95_ms", "write_p95_ms", "reads"} <= set(p)
        assert p["reads"] > 100
        assert 5 < p["read_p95_ms"] < 100 and 10 < p["write_p95_ms"] < 500
    assert by_p[1.0]["stale_fraction"] == 0
    assert by_p[0.0]["stale_fraction"] > 0.1
    assert "stale fraction" in out
    _png(tmp_path / "cpq.png")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jam", "--target", "nope", "--ops", "10"], "unknown --target 'nope'"),
        (["jam", "--target", "sim"], "exactly one of --duration and --ops"),
        (["jam", "--target", "sim", "--ops", "10", "--duration", "1"], "exactly one of"),
        (["jam", "--target", "sim", "--ops", "10", "--retries", "maybe"], "--retries 'maybe'"),
        (["jam", "--target", "sim", "--ops", "10", "--consistent-ratio", "2"], "between 0 and 1"),
        (["jam", "--target", "sim", "--ops", "10", "--sim", "capacty=1"], "--sim 'capacty=1'"),
        (["jam", "--target", "sim", "--ops", "10", "--target-table", "t"], "does not apply"),
        (["jam", "--target", "sim", "--ops", "1", "--tasks", "2"], "fewer than one operation"),
        (["sweep", "--target", "sim", "--concurrency", "1,x"], "--concurrency '1,x'"),
        (["sweep", "--target", "sim", "--op", "delete"], "--op 'delete'"),
        (["cpq", "--target", "sim", "--p", "0,2"], "between 0 and 1"),
        (["staleness", "--target", "sqs", "--duration", "1"], "sqs has no keys"),
        (["jam", "--target", "sim", "--ops", "10", "--backend", "gcp"], "unknown --backend"),
    ],
)
def test_bad_flags_fail_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    code, _, err = _run(*args, "--json", str(tmp_path / "out.json"))
    assert code == 1
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_an_unwritable_json_path_fails_before_the_test(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = _run("jam", "--target", "sim", "--ops", "10", "--json", str(blocker / "x.json"))
    assert code == 1 and err.startswith("error: cannot create")


def test_an_unreachable_target_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no credentials anywhere (the autouse fixture scrubbed them): botocore gives up at once
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    code, _, err = _run(
        "jam", "--target", "dynamodb", "--ops", "10", "--yes", "--json", str(tmp_path / "x.json")
    )
    assert code == 1
    # the target is AWS (no endpoint set): --yes, then the first request, a read, fails
    assert err.startswith("error: cannot check dynamodb table 'cmr-load-")
    assert "Traceback" not in err and err.count("\n") <= 2
