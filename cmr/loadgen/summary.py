"""The commands' JSON reports of a :class:`~cmr.loadgen.recorder.Measurement`.

``jam_report`` is ``cmr loadgen jam``'s JSON (seed 002's Table I columns per op and mode),
``staleness_report`` is ``cmr loadgen staleness``'s (freshness bins, violations, Γ), and
``latency_ms`` the latency columns both use. :mod:`cmr.loadgen.report` renders them as tables.
"""

from __future__ import annotations

import math
from typing import Any

from cmr.loadgen.recorder import CELLS, SATURATED_CPU, Measurement, Op, Staleness
from cmr.loadgen.targets import ERROR_CLASSES

__all__ = ["jam_report", "latency_ms", "staleness_report"]


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def latency_ms(h: Any) -> dict[str, float | None]:
    """Seed 002's Table I columns from a histogram, in milliseconds (None: no operations).

    Outliers are values outside [Q1 - 1.5 IQR, Q3 + 1.5 IQR] (the box plot's whiskers).
    """
    names = ("min", "q1", "median", "q3", "p95", "p99", "p999", "max", "mean", "sd")
    n = h.get_total_count()
    if n == 0:
        return dict.fromkeys((*names, "outliers_pct"), None)
    pct = h.get_percentile_to_value_dict([25.0, 50.0, 75.0, 95.0, 99.0, 99.9])
    q1, q3 = pct[25.0], pct[75.0]
    lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    outliers = 0
    for step in h.get_recorded_iterator():
        value = h.get_lowest_equivalent_value(step.value_iterated_to)
        if value < lo or value > hi:
            outliers += step.count_added_in_this_iter_step
    return {
        "min": _ms(h.get_min_value()),
        "q1": _ms(q1),
        "median": _ms(pct[50.0]),
        "q3": _ms(q3),
        "p95": _ms(pct[95.0]),
        "p99": _ms(pct[99.0]),
        "p999": _ms(pct[99.9]),
        "max": _ms(h.get_max_value()),
        "mean": _ms(h.get_mean_value()),
        "sd": _ms(h.get_stddev()),
        "outliers_pct": round(100.0 * outliers / n, 3),
    }


def _warnings(m: Measurement) -> list[str]:
    out = []
    if m.saturated_tasks:
        out.append(
            f"load generator CPU saturated in {m.saturated_tasks} of {m.tasks} tasks "
            f"(process CPU above {SATURATED_CPU:.0%} of wall time on its one event-loop core): "
            "latencies include client-side queueing; spread the load over more tasks or workers"
        )
    if m.dropped or m.late:
        out.append(
            f"open loop fell behind its intended rate: {m.late} ops started late, "
            f"{m.dropped} dropped; latencies are measured from the intended start"
        )
    return out


def _client(m: Measurement) -> dict[str, Any]:
    ops = m.count()
    return {
        "cpu_s": round(m.cpu_us / 1e6, 6),
        "wall_s": round(m.wall_us / 1e6, 6),
        "cpu_per_op_us": round(m.cpu_us / ops, 3) if ops else None,
        "tasks": m.tasks,
        "saturated_tasks": m.saturated_tasks,
    }


def jam_report(
    m: Measurement, target: str, tasks: int, duration_s: float | None = None
) -> dict[str, Any]:
    """The ``cmr loadgen jam`` JSON: one entry per (op, mode) with seed 002's Table I columns.

    ``throughput_ops_s`` counts successful operations per second of ``duration_s`` (default:
    the longest task's load phase); ``latency_ms`` describes the successful operations. Extra
    top-level keys: retries, dropped, late, span_s, client_cpu, warnings, overloaded (any
    throttled or unavailable answer: the store was jammed).
    """
    duration = duration_s if duration_s and duration_s > 0 else m.elapsed_s
    ops = []
    for op, mode in m.pairs():
        ok = m.count(op, mode, "ok")
        ops.append(
            {
                "op": op,
                "mode": mode,
                "count": m.count(op, mode),
                "ok": ok,
                "errors": {cls: m.count(op, mode, cls) for cls in ERROR_CLASSES},
                "throughput_ops_s": round(ok / duration, 3) if duration > 0 else 0.0,
                "latency_ms": latency_ms(m.histogram(op, mode, "ok")),
            }
        )
    overloaded = any(m.count(outcome=cls) for cls in ("throttled", "unavailable"))
    return {
        "target": target,
        "tasks": tasks,
        "duration_s": round(duration, 6),
        "ops": ops,
        "retries": {
            "total": sum(m.retries.values()),
            "by_op": {f"{op}/{mode}": n for (op, mode), n in sorted(m.retries.items())},
        },
        "dropped": m.dropped,
        "late": m.late,
        "overloaded": overloaded,
        # wall time from the first task's start to the last one's end, across machines
        "span_s": (
            round(m.last_end - m.first_start, 6)
            if m.first_start is not None and m.last_end is not None
            else None
        ),
        "client_cpu": _client(m),
        "warnings": _warnings(m),
    }


def _fraction(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def staleness_report(m: Measurement) -> dict[str, Any]:
    """The ``cmr loadgen staleness`` JSON (10 ms bins of time since the end of the latest
    write), plus stale fractions, Γ per key (ms) and read/write latency percentiles."""
    s = m.staleness or Staleness()
    freshness = {
        mode: [
            {"lag_ms": [lo, hi], "reads": n, "fresh": k}
            for (lo, hi), (n, k) in sorted(s.freshness.get(mode, {}).items())
        ]
        for mode in ("eventual", "consistent")
    }
    mono = [sum(v[i] for v in s.monotonic.values()) for i in (0, 1)]
    stale_reads = sum(v[0] for v in s.stale.values())
    stale = sum(v[1] for v in s.stale.values())
    gammas = sorted(s.gamma_s.values())

    def latency(op: Op) -> dict[str, float | None]:
        full = latency_ms(m.histogram(op))
        return {k: full[k] for k in ("median", "p95", "p99", "mean", "max")}

    return {
        "freshness": freshness,
        "monotonic_read_violations": {"pairs": mono[0], "violations": mono[1]},
        "read_your_writes_violations": {
            "pairs": s.read_your_writes[0],
            "violations": s.read_your_writes[1],
        },
        "monotonic_by_mode": {
            mode: {"pairs": v[0], "violations": v[1]} for mode, v in sorted(s.monotonic.items())
        },
        "stale_fraction": _fraction(stale, stale_reads),
        "stale": {
            mode: {"reads": v[0], "stale": v[1], "fraction": _fraction(v[1], v[0])}
            for mode, v in sorted(s.stale.items())
        },
        "successive_reads": {"window_ms": [0, 450], **{c: s.successive[c] for c in CELLS}},
        "gamma": {
            "keys": len(gammas),
            "positive_keys": sum(1 for g in gammas if g > 0),
            "max_ms": _ms(gammas[-1] * 1e6) if gammas else None,
            "mean_ms": _ms(math.fsum(gammas) / len(gammas) * 1e6) if gammas else None,
            "per_key_ms": {k: _ms(g * 1e6) for k, g in sorted(s.gamma_s.items())},
        },
        "latency_ms": {"read": latency("get"), "write": latency("put")},
        "writes": s.writes,
        "reads": s.reads,
        "unjudged_reads": s.unjudged,
        "untraced_ops": s.untraced,
        "client_cpu": _client(m),
        "warnings": _warnings(m),
    }
