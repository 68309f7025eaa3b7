"""Terminal reports of load tests: rich tables over the commands' JSON, and a live status line.

Every table is a pure function of the JSON a command writes (``cmr loadgen jam --json``, ...),
so a saved file renders the same table later. The layouts follow the seeds: seed 002's
Table I (one column per series, one row per statistic), seed 004's Table 1 (freshness in
broad intervals, as "33.40% (168,908/505,821)"), the sweep of seed 000 and the CPQ points of
seed 003.
"""

from __future__ import annotations

import io
import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cmr.loadgen.consistency import FreshnessBin, aggregate_bins
from cmr.loadgen.targets import ERROR_CLASSES
from cmr.watch import Progress

__all__ = [
    "FRESHNESS_EDGES_MS",
    "Interval",
    "LiveStatus",
    "cpq_table",
    "freshness_intervals",
    "freshness_table",
    "jam_table",
    "op_label",
    "render_text",
    "sorted_ops",
    "staleness_table",
    "successive_table",
    "sweep_table",
    "total_errors",
]

_CELLS = ("stale_stale", "stale_fresh", "fresh_stale", "fresh_fresh")
# seed 004 Table 1's broad intervals, split at 550 ms where its freshness curve jumps
FRESHNESS_EDGES_MS = (0.0, 450.0, 550.0, 1000.0)
_MODE_ORDER = {"eventual": 0, "consistent": 1, "plain": 2, "conditional": 3}
_OP_ORDER = {"get": 0, "put": 1}
_MODE_TITLE = {"eventual": "Eventual Consistent Read", "consistent": "Consistent Read"}

JsonObj = Mapping[str, Any]


def _num(x: Any, digits: int = 2) -> str:
    """A table cell: thousands separators, fixed decimals, a dash for a missing value."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):  # a statistic over no samples
            return "—"
        return f"{x:,.{digits}f}"
    return str(x)


def _fnum(x: Any, digits: int = 2) -> str:
    """A measured quantity: always with decimals, even when JSON stored it as an integer."""
    return _num(None if x is None else float(x), digits)


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "—"


def op_label(op: JsonObj) -> str:
    """'get eventual', 'put conditional', ...: the name of one series of a jam report."""
    return f"{op.get('op', '?')} {op.get('mode', '?')}"


def sorted_ops(ops: Iterable[JsonObj]) -> list[JsonObj]:
    return sorted(
        ops,
        key=lambda o: (_OP_ORDER.get(o.get("op", ""), 9), _MODE_ORDER.get(o.get("mode", ""), 9)),
    )


def total_errors(ops: Iterable[JsonObj]) -> int:
    """Errors of every class over every series of a jam report's ``ops``."""
    return sum(int(v) for o in ops for v in (o.get("errors") or {}).values())


def jam_table(report: JsonObj) -> Table:
    """Seed 002's Table I for a jam report: a column per (op, mode), a row per statistic."""
    ops = sorted_ops(report.get("ops", []))
    duration = report.get("duration_s")
    caption = (
        f"target {report.get('target', '?')}, {report.get('tasks', '?')} task(s), "
        f"{_num(duration, 1)} s"
    )
    ok_total = sum(int(o.get("ok", 0)) for o in ops)
    if duration:
        caption += f", {ok_total / float(duration):,.1f} ok ops/s overall"
    t = Table(title="Latency and throughput per operation", caption=caption)
    t.add_column("", no_wrap=True)
    for o in ops:
        t.add_column(op_label(o), justify="right")
    lat = [o.get("latency_ms") or {} for o in ops]

    def row(name: str, cells: Sequence[Any], digits: int = 2) -> None:
        t.add_row(name, *(_num(c, digits) for c in cells))

    def ms_row(name: str, cells: Sequence[Any]) -> None:
        # histogram values may come back as ints; one format keeps the columns aligned
        t.add_row(name, *(_fnum(c) for c in cells))

    row("n (obs.)", [o.get("count") for o in ops])
    row("ok", [o.get("ok") for o in ops])
    ms_row("Min (ms)", [m.get("min") for m in lat])
    ms_row("Q1 (ms)", [m.get("q1") for m in lat])
    ms_row("Median (ms)", [m.get("median") for m in lat])
    ms_row("Q3 (ms)", [m.get("q3") for m in lat])
    iqr = [
        (float(m["q3"]) - float(m["q1"]))
        if m.get("q3") is not None and m.get("q1") is not None
        else None
        for m in lat
    ]
    ms_row("IQR (ms)", iqr)
    ms_row("Max (ms)", [m.get("max") for m in lat])
    ms_row("Outliers (%)", [m.get("outliers_pct") for m in lat])
    ms_row("Mean (ms)", [m.get("mean") for m in lat])
    ms_row("SD (ms)", [m.get("sd") for m in lat])
    ms_row("p95 (ms)", [m.get("p95") for m in lat])
    ms_row("p99 (ms)", [m.get("p99") for m in lat])
    ms_row("p99.9 (ms)", [m.get("p999") for m in lat])
    t.add_section()
    for cls in ERROR_CLASSES:
        label = "cond. failed" if cls == "conditional_failed" else cls
        row(f"errors: {label}", [int((o.get("errors") or {}).get(cls, 0)) for o in ops])
    t.add_section()
    t.add_row("ok ops/s", *(_fnum(o.get("throughput_ops_s"), 1) for o in ops))
    return t


@dataclass(frozen=True)
class Interval:
    """One row of seed 004's Table 1: per mode, (fresh, reads) over ``[lo_ms, hi_ms)``."""

    lo_ms: float
    hi_ms: float
    counts: dict[str, tuple[int, int]]


def freshness_intervals(
    freshness: Mapping[str, Sequence[Mapping[str, Any]]],
    edges_ms: Sequence[float] = FRESHNESS_EDGES_MS,
) -> list[Interval]:
    """The 10 ms bins summed into broad intervals; bins beyond the last edge get one more."""
    edges = list(edges_ms)
    top = max(
        (float(b["lag_ms"][1]) for bins in freshness.values() for b in bins), default=edges[-1]
    )
    if top > edges[-1]:
        edges.append(top)
    return [
        Interval(
            lo,
            hi,
            # JSON read back from a file has the bins' shape, not their static type
            {
                m: aggregate_bins(cast("Sequence[FreshnessBin]", b), lo, hi)
                for m, b in freshness.items()
            },
        )
        for lo, hi in itertools.pairwise(edges)
    ]


def freshness_table(report: JsonObj, edges_ms: Sequence[float] = FRESHNESS_EDGES_MS) -> Table:
    """Seed 004's Table 1: P(reading the freshest value) per lag interval and read mode."""
    freshness: Mapping[str, Sequence[Mapping[str, Any]]] = report.get("freshness", {})
    modes = sorted(freshness, key=lambda m: _MODE_ORDER.get(m, 9))
    t = Table(
        title="Probability of reading the freshest value",
        caption="time since the end of the latest write; fresh/reads in brackets",
    )
    t.add_column("Time since write (ms)")
    for mode in modes:
        t.add_column(_MODE_TITLE.get(mode, mode), justify="right")
    for iv in freshness_intervals(freshness, edges_ms):
        cells = []
        for mode in modes:
            fresh, reads = iv.counts[mode]
            cells.append(f"{_pct(fresh, reads)} ({fresh:,}/{reads:,})" if reads else "— (0/0)")
        t.add_row(f"[{iv.lo_ms:g}, {iv.hi_ms:g})", *cells)
    return t


def _violations(pc: Any) -> str:
    if not isinstance(pc, Mapping):
        return "—"
    pairs, bad = int(pc.get("pairs", 0)), int(pc.get("violations", 0))
    return f"{_pct(bad, pairs)} ({bad:,}/{pairs:,})"


def _latency_cell(report: JsonObj, name: str) -> str | None:
    """p50 / p95 / p99 of a staleness report's read or write latency."""
    lat = (report.get("latency_ms") or {}).get(name)
    if not isinstance(lat, Mapping):
        return None
    return " / ".join(_fnum(lat.get(k), 1) for k in ("median", "p95", "p99"))


def staleness_table(report: JsonObj) -> Table:
    """The other consistency measures of a staleness report (seed 004 section 2.1.1, seed 003)."""
    t = Table("measure", "value", title="Consistency", show_header=False)
    t.add_row("monotonic-read violations", _violations(report.get("monotonic_read_violations")))
    by_mode = report.get("monotonic_by_mode") or {}
    # seed 004 reports eventual reads alone; the total above mixes in consistent ones
    for mode in sorted(by_mode, key=lambda m: _MODE_ORDER.get(m, 9)):
        if isinstance(by_mode[mode], Mapping) and by_mode[mode].get("pairs"):
            t.add_row(f"  of {mode} reads", _violations(by_mode[mode]))
    t.add_row("read-your-writes violations", _violations(report.get("read_your_writes_violations")))
    if "stale_fraction" in report:
        t.add_row("stale reads, all modes", _fnum(report.get("stale_fraction"), 4))
        stale_by_mode = report.get("stale") or {}
        for mode in sorted(stale_by_mode, key=lambda m: _MODE_ORDER.get(m, 9)):
            v = stale_by_mode[mode]
            if isinstance(v, Mapping) and v.get("reads"):
                stale, reads = int(v.get("stale", 0)), int(v["reads"])
                t.add_row(f"stale reads, {mode}", f"{_pct(stale, reads)} ({stale:,}/{reads:,})")
    gamma = report.get("gamma")
    if isinstance(gamma, Mapping):
        t.add_row(
            "Γ per key, max / mean (ms)",
            f"{_fnum(gamma.get('max_ms'))} / {_fnum(gamma.get('mean_ms'))}",
        )
        t.add_row(
            "keys with Γ > 0", f"{_num(gamma.get('positive_keys'))} of {_num(gamma.get('keys'))}"
        )
    elif gamma is not None:
        t.add_row("Γ (ms)", _fnum(gamma))
    for name in ("read", "write"):
        cell = _latency_cell(report, name)
        if cell is not None:
            t.add_row(f"{name} latency p50 / p95 / p99 (ms)", cell)
    if "reads" in report or "writes" in report:
        t.add_row(
            "reads / writes analysed",
            f"{_num(report.get('reads'))} / {_num(report.get('writes'))}",
        )
    return t


def successive_table(report: JsonObj) -> Table | None:
    """Seed 004's Table 2: pairs of successive eventual reads, both soon after a write."""
    succ = report.get("successive_reads")
    if not isinstance(succ, Mapping):
        return None
    counts = {c: int(succ.get(c, 0)) for c in _CELLS}
    pairs = sum(counts.values())
    lo, hi = succ.get("window_ms", [0, 450])
    t = Table(
        title="Successive eventual consistent reads",
        caption=f"both in [{lo:g}, {hi:g}) ms after a write; fresh then stale breaks "
        f"monotonic reads; {pairs:,} pairs",
    )
    t.add_column("first \\ second")
    t.add_column("stale", justify="right")
    t.add_column("fresh", justify="right")
    for first in ("stale", "fresh"):
        t.add_row(
            first,
            *(
                f"{_pct(counts[f'{first}_{second}'], pairs)} ({counts[f'{first}_{second}']:,})"
                for second in ("stale", "fresh")
            ),
        )
    return t


def cpq_table(report: JsonObj) -> Table:
    """Seed 003 Fig. 2 as numbers: stale fraction and p95 latency per probability p."""
    t = Table(
        title=f"Consistency and latency vs p ({report.get('target', '?')})",
        caption="p: probability that an operation uses the strong mode",
    )
    for name in ("p", "reads", "stale", "stale fraction", "read p95 (ms)", "write p95 (ms)"):
        t.add_column(name, justify="right")
    for pt in sorted(report.get("points", []), key=lambda x: float(x.get("p", 0))):
        t.add_row(
            _num(float(pt.get("p", 0)), 2),
            _num(pt.get("reads")),
            _num(pt.get("stale")),
            _fnum(pt.get("stale_fraction"), 4),
            _fnum(pt.get("read_p95_ms"), 1),
            _fnum(pt.get("write_p95_ms"), 1),
        )
    return t


def sweep_table(report: JsonObj) -> Table:
    """Seed 000's sweep as numbers: total time, throughput and errors per concurrency."""
    t = Table(
        title=f"Total time vs concurrency ({report.get('target', '?')})",
        caption=f"op {report.get('op', '?')}; every point runs the same number of operations",
    )
    for name in ("items", "concurrency", "ops", "total (s)", "ops/s", "errors"):
        t.add_column(name, justify="right")
    points = sorted(
        report.get("points", []),
        key=lambda x: (int(x.get("items", 0)), int(x.get("concurrency", 0))),
    )
    for pt in points:
        ops = pt.get("ops", [])
        t.add_row(
            _num(pt.get("items")),
            _num(pt.get("concurrency")),
            _num(sum(int(o.get("count", 0)) for o in ops)),
            _fnum(pt.get("total_s"), 2),
            _fnum(pt.get("throughput_ops_s"), 1),
            _num(total_errors(ops)),
        )
    return t


def render_text(renderable: RenderableType, width: int = 160) -> str:
    """Plain text of a table, as a terminal of ``width`` columns would show it."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


class LiveStatus:
    """One live line while a load test runs: elapsed time, map/reduce tasks done and, when the
    job reports them, ops/s and errors; otherwise it says they come at the end."""

    def __init__(self, console: Console, label: str, enabled: bool = True) -> None:
        self._console = console
        self._label = label
        self._enabled = enabled
        self._started = time.monotonic()
        self._progress: Progress | None = None
        self._phase = "starting"
        self._live: Live | None = None

    def __enter__(self) -> LiveStatus:
        self._started = time.monotonic()
        if self._enabled:
            self._live = Live(self, console=self._console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def phase(self, text: str) -> None:
        """What the test is doing now: 'preparing target', 'running', 'cleaning up' ..."""
        self._phase = text

    def update(self, progress: Progress) -> None:
        """The engine's progress callback (``on_progress``)."""
        self._progress = progress
        self._phase = "running"

    def line(self) -> Text:
        elapsed = time.monotonic() - self._started
        parts = [f"{self._label}: {self._phase}", f"{elapsed:5.1f} s"]
        p = self._progress
        ops = errors = None
        if p is not None:
            parts.append(f"load tasks {p.maps_done}/{p.maps} done")
            parts.append(f"merge {p.reduces_done}/{p.reduces}")
            ops, errors = p.stats.get("c_load_ops"), p.stats.get("c_load_errors")
        if ops is not None:
            # live counters the tasks report every half second (Job.progress)
            parts.append(f"{ops / max(elapsed, 1e-9):,.0f} ops/s")
            parts.append(f"{errors or 0:,} errors")
        elif self._phase == "running" or p is not None:
            parts.append("ops/s and errors: measured in the tasks, reported when the job ends")
        return Text(" · ".join(parts), style="dim")

    def __rich__(self) -> RenderableType:
        return Group(self.line())
