"""Tables and figures of load-test reports, on hand-built JSON shaped like the commands' output."""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cmr.loadgen import plots, report
from cmr.watch import Progress

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ERR0 = {"throttled": 0, "unavailable": 0, "timeout": 0, "conditional_failed": 0, "other": 0}


def _lat(mn: float, q1: float, med: float, q3: float, mx: float, mean: float, sd: float,
         out: float) -> dict[str, float]:  # fmt: skip
    return {
        "min": mn, "q1": q1, "median": med, "q3": q3, "p95": q3 * 1.8, "p99": q3 * 3,
        "p999": mx * 0.8, "max": mx, "mean": mean, "sd": sd, "outliers_pct": out,
    }  # fmt: skip


# seed 002 Table I, as a jam report would carry it
JAM: dict[str, Any] = {
    "target": "sim",
    "tasks": 2,
    "duration_s": 10.0,
    "ops": [
        {"op": "put", "mode": "plain", "count": 4600, "ok": 4590,
         "errors": {**ERR0, "unavailable": 7, "throttled": 3}, "throughput_ops_s": 459.0,
         "latency_ms": _lat(42, 50, 56, 103, 2391, 114.4, 186.84, 9.35)},
        {"op": "get", "mode": "eventual", "count": 260132, "ok": 260132, "errors": ERR0,
         "throughput_ops_s": 26013.2,
         "latency_ms": _lat(9, 14, 16, 18, 1576, 18.78, 17.61, 7.81)},
        {"op": "get", "mode": "consistent", "count": 225891, "ok": 225891, "errors": ERR0,
         "throughput_ops_s": 22589.1,
         "latency_ms": _lat(9, 14, 16, 18, 1350, 18.19, 24.34, 8.66)},
    ],
}  # fmt: skip


def _bins(fresh_at: Any) -> list[dict[str, Any]]:
    return [
        {"lag_ms": [i * 10, i * 10 + 10], "reads": 100, "fresh": fresh_at(i * 10)}
        for i in range(100)
    ]


# shaped like summary.staleness_report's output
STALENESS: dict[str, Any] = {
    "target": "sim",
    "freshness": {
        "eventual": _bins(lambda ms: 33 if ms < 500 else (80 if ms < 520 else 100)),
        "consistent": _bins(lambda ms: 100),
    },
    "monotonic_read_violations": {"pairs": 1000, "violations": 233},
    "read_your_writes_violations": {"pairs": 50, "violations": 30},
    "monotonic_by_mode": {
        "eventual": {"pairs": 600, "violations": 233},
        "consistent": {"pairs": 400, "violations": 0},
    },
    "stale_fraction": 0.3,
    "stale": {
        "eventual": {"reads": 900, "stale": 300, "fraction": 0.3333},
        "consistent": {"reads": 100, "stale": 0, "fraction": 0.0},
    },
    "successive_reads": {"window_ms": [0, 450], "stale_stale": 3994, "stale_fresh": 2108,
                         "fresh_stale": 2336, "fresh_fresh": 1562},
    "gamma": {"keys": 2, "positive_keys": 1, "max_ms": 512.0, "mean_ms": 256.0,
              "per_key_ms": {"a": 512.0, "b": 0.0}},
    "latency_ms": {
        "read": {"median": 16.0, "p95": 24.5, "p99": 40.0, "mean": 18.8, "max": 1576.0},
        "write": {"median": 56.0, "p95": 182.5, "p99": 900.0, "mean": 114.4, "max": 2391.0},
    },
    "writes": 100,
    "reads": 1000,
}  # fmt: skip

SWEEP: dict[str, Any] = {
    "target": "sim",
    "items": [1, 1000],
    "op": "put",
    "ops_per_point": 10000,
    "points": [
        {
            "items": items,
            "concurrency": c,
            "total_s": t * slow,
            "throughput_ops_s": 10000 / (t * slow),
            "ops": [{**JAM["ops"][0], "count": 10000}],
        }
        for items, slow in ((1, 1.3), (1000, 1.0))
        for c, t in ((1, 560.0), (10, 60.0), (50, 14.0), (100, 8.0), (200, 8.5))
    ],
}

CPQ: dict[str, Any] = {
    "target": "sim",
    "points": [
        {"p": p, "stale_fraction": 0.3 * (1 - p), "read_p95_ms": 25 + 2 * p,
         "write_p95_ms": 130 + 5 * p, "reads": 1000, "stale": round(300 * (1 - p))}
        for p in (0.0, 0.25, 0.5, 0.75, 1.0)
    ],
}  # fmt: skip


def test_jam_table_has_table_i_rows_and_numbers() -> None:
    text = report.render_text(report.jam_table(JAM))
    for row in ("n (obs.)", "Min (ms)", "Q1 (ms)", "Median (ms)", "Q3 (ms)", "IQR (ms)",
                "Max (ms)", "Outliers (%)", "Mean (ms)", "SD (ms)", "p95 (ms)",
                "errors: throttled", "errors: unavailable", "ok ops/s"):  # fmt: skip
        assert row in text, row
    # columns in Table I's order: reads before writes, eventual before consistent
    header = next(line for line in text.splitlines() if "get eventual" in line)
    assert header.index("get eventual") < header.index("get consistent") < header.index("put")
    for number in ("260,132", "225,891", "4,600", "53.00", "2,391.00", "9.35", "186.84",
                   "26,013.2"):  # fmt: skip
        assert number in text, number
    cells = next(line for line in text.splitlines() if "errors: unavailable" in line)
    assert [c.strip() for c in cells.split("│")[2:5]] == ["0", "0", "7"]
    assert "49,061.3 ok ops/s overall" in text


def test_jam_table_survives_an_op_with_no_successes() -> None:
    empty = {"op": "get", "mode": "eventual", "count": 5, "ok": 0,
             "errors": {**ERR0, "timeout": 5}, "throughput_ops_s": 0.0,
             "latency_ms": dict.fromkeys(("min", "q1", "median", "q3", "max"))}  # fmt: skip
    text = report.render_text(report.jam_table({"target": "sim", "tasks": 1, "ops": [empty]}))
    assert "—" in text
    assert "timeout" in text


def test_freshness_intervals_sum_the_bins_like_seed_004_table_1() -> None:
    rows = report.freshness_intervals(STALENESS["freshness"])
    assert [(r.lo_ms, r.hi_ms) for r in rows] == [(0, 450), (450, 550), (550, 1000)]
    assert rows[0].counts["eventual"] == (33 * 45, 4500)
    assert rows[1].counts["eventual"] == (33 * 5 + 80 * 2 + 100 * 3, 1000)
    assert rows[2].counts["consistent"] == (4500, 4500)


def test_freshness_intervals_add_one_for_lags_past_the_last_edge() -> None:
    long = {"eventual": [{"lag_ms": [i * 10, i * 10 + 10], "reads": 1, "fresh": 1}
                         for i in range(150)]}  # fmt: skip
    rows = report.freshness_intervals(long)
    assert (rows[-1].lo_ms, rows[-1].hi_ms) == (1000, 1500)
    assert rows[-1].counts["eventual"] == (50, 50)


def test_freshness_table_shows_percent_and_counts() -> None:
    text = report.render_text(report.freshness_table(STALENESS))
    assert "[0, 450)" in text and "[550, 1000)" in text
    assert "33.00% (1,485/4,500)" in text
    assert "100.00% (4,500/4,500)" in text
    assert "Eventual Consistent Read" in text and "Consistent Read" in text


def test_staleness_table_shows_violations_and_latency() -> None:
    text = report.render_text(report.staleness_table(STALENESS))
    assert "23.30% (233/1,000)" in text
    assert "38.83% (233/600)" in text  # eventual reads alone, as seed 004 counts them
    assert "60.00% (30/50)" in text
    assert "0.3000" in text and "33.33% (300/900)" in text
    assert "512.00 / 256.00" in text and "1 of 2" in text
    assert "16.0 / 24.5 / 40.0" in text and "56.0 / 182.5 / 900.0" in text


def test_successive_table_is_seed_004_table_2() -> None:
    table = report.successive_table(STALENESS)
    assert table is not None
    text = report.render_text(table)
    assert "39.94% (3,994)" in text and "23.36% (2,336)" in text
    assert "10,000 pairs" in text
    assert report.successive_table({}) is None


def test_cpq_and_sweep_tables() -> None:
    cpq = report.render_text(report.cpq_table(CPQ))
    assert "0.2250" in cpq and "131.2" in cpq and "0.0000" in cpq
    sweep = report.render_text(report.sweep_table(SWEEP))
    assert "728.00" in sweep and "560.00" in sweep and "1,250.0" in sweep
    assert "10,000" in sweep
    first = next(line for line in sweep.splitlines() if "728.00" in line)
    assert [c.strip() for c in first.split("│")[1:7]] == [
        "1",
        "1",
        "10,000",
        "728.00",
        "13.7",
        "10",
    ]


def test_box_stats_whiskers_stop_at_the_data_or_the_fence() -> None:
    box = plots.box_stats(JAM["ops"][0]["latency_ms"], "put")
    assert (box["q1"], box["med"], box["q3"]) == (50, 56, 103)
    assert box["whislo"] == 42  # the fence (-29.5) lies below the fastest write
    assert box["whishi"] == pytest.approx(103 + 1.5 * 53)
    given = plots.box_stats({**JAM["ops"][0]["latency_ms"], "whishi": 170.0}, "put")
    assert given["whishi"] == 170.0


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.mark.parametrize(
    ("draw", "data", "name"),
    [
        (plots.latency_boxplots, JAM, "jam-latency.png"),
        (plots.freshness_plot, STALENESS, "staleness-freshness.png"),
        (plots.sweep_plot, SWEEP, "sweep-total-time.png"),
        (plots.cpq_plot, CPQ, "cpq.png"),
    ],
)
def test_plots_write_sane_pngs(draw: Any, data: dict[str, Any], name: str, tmp_path: Path) -> None:
    path = draw(data, tmp_path / "figs" / name)
    assert path == tmp_path / "figs" / name
    assert path.stat().st_size > 10_000  # axes, labels and lines, not a blank canvas
    width, height = _png_size(path)
    assert 400 <= width <= 2000 and 300 <= height <= 1200


@pytest.mark.slow
def test_plots_of_empty_reports_still_draw(tmp_path: Path) -> None:
    for draw, data in (
        (plots.latency_boxplots, {"target": "sim", "ops": []}),
        (plots.freshness_plot, {"freshness": {"eventual": [], "consistent": []}}),
        (plots.sweep_plot, {"points": []}),
        (plots.cpq_plot, {"points": []}),
    ):
        path = draw(data, tmp_path / f"{draw.__name__}.png")
        assert _png_size(path)[0] > 0


def test_live_status_says_when_numbers_come_only_at_the_end() -> None:
    status = report.LiveStatus(Console(file=io.StringIO()), "jam sim", enabled=False)
    assert "starting" in status.line().plain
    status.update(Progress(1, 2, 0, 1, "RUNNING", {}))
    line = status.line().plain
    assert "load tasks 1/2 done" in line
    assert "reported when the job ends" in line
    status.update(Progress(2, 2, 0, 1, "RUNNING", {"c_load_ops": 500, "c_load_errors": 3}))
    assert "3 errors" in status.line().plain
