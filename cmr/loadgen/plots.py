"""PNG figures of load tests, drawn from the commands' JSON (so saved results plot too).

- ``latency_boxplots``: seed 002 Fig. 1-2, a box per (op, mode) from the report's quartiles.
- ``freshness_plot``: seed 004 Fig. 2, P(fresh) against time since the latest write.
- ``sweep_plot``: seed 000's figures, total time against concurrency, a curve per item count.
- ``cpq_plot``: seed 003 Fig. 2, stale fraction and p95 latency against p.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never pyplot: no global
figure state, no GUI backend, safe in any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmr.loadgen.report import op_label, sorted_ops

if TYPE_CHECKING:  # matplotlib loads in ~1.3 s: only when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "box_stats",
    "cpq_plot",
    "freshness_plot",
    "latency_boxplots",
    "sweep_plot",
]

JsonObj = Mapping[str, Any]
_DPI = 110
_OP_TITLE = {"get": "Read (get) latency", "put": "Write (put) latency"}
_MODE_STYLE = {
    "eventual": "tab:orange",
    "consistent": "tab:blue",
    "plain": "tab:green",
    "conditional": "tab:purple",
}


def _save(fig: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=_DPI)
    return path


def _new(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def box_stats(latency_ms: Mapping[str, Any], label: str) -> dict[str, Any]:
    """A ``bxp`` box from precomputed quartiles; whiskers at the last sample within 1.5 IQR.

    The report keeps histograms, not samples, so the last non-outlier is known only to the
    histogram's resolution: when the report gives it (``whislo``/``whishi``) it is used,
    otherwise the 1.5 IQR fence clipped to the observed min and max stands in for it.
    """
    q1, med, q3 = (float(latency_ms[k]) for k in ("q1", "median", "q3"))
    iqr = q3 - q1
    lo = float(latency_ms.get("whislo", max(float(latency_ms.get("min", q1)), q1 - 1.5 * iqr)))
    hi = float(latency_ms.get("whishi", min(float(latency_ms.get("max", q3)), q3 + 1.5 * iqr)))
    box: dict[str, Any] = {
        "label": label,
        "q1": q1,
        "med": med,
        "q3": q3,
        "whislo": min(lo, q1),
        "whishi": max(hi, q3),
        "fliers": [],  # seed 002 does not plot outliers either; their share is in the label
    }
    if latency_ms.get("mean") is not None:
        box["mean"] = float(latency_ms["mean"])
    return box


def latency_boxplots(report: JsonObj, path: Path) -> Path:
    """Seed 002 Fig. 1-2: one panel per operation, one box per consistency mode."""
    ops = [o for o in sorted_ops(report.get("ops", [])) if _has_quartiles(o)]
    kinds = list(dict.fromkeys(str(o.get("op")) for o in ops)) or ["get"]
    fig = _new(4.2 * len(kinds) + 0.6, 4.8)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds, strict=True):
        series = [o for o in ops if o.get("op") == kind]
        stats = [
            box_stats(
                o["latency_ms"],
                f"{o.get('mode')}\nn={int(o.get('ok', o.get('count', 0))):,}\n"
                f"{float(o['latency_ms'].get('outliers_pct', 0.0)):.2f}% outliers",
            )
            for o in series
        ]
        if stats:
            ax.bxp(stats, showmeans=True, showfliers=False, widths=0.5, patch_artist=True)
            for patch, o in zip(ax.patches, series, strict=False):
                patch.set_facecolor(_MODE_STYLE.get(str(o.get("mode")), "tab:gray"))
                patch.set_alpha(0.45)
        else:
            _empty(ax, "no successful operations")
        ax.set_title(_OP_TITLE.get(kind, f"{kind} latency"))
        ax.set_ylabel("latency (ms)")
        ax.set_xlabel("mode")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"Latency per operation and mode: target {report.get('target', '?')}, "
        f"{report.get('tasks', '?')} task(s)\n"
        "box Q1 to Q3, line median, triangle mean, whiskers at the last point within 1.5 IQR",
        fontsize=10,
    )
    if ops:
        # a legend naming each series, so a reader need not decode the colours
        handles = list(ax.patches for ax in axes)
        flat = [h for hs in handles for h in hs]
        fig.legend(
            flat,
            [op_label(o) for o in ops],
            loc="outside lower center",
            ncols=min(4, len(ops)),
            fontsize=8,
        )
    return _save(fig, path)


def _has_quartiles(op: JsonObj) -> bool:
    lat = op.get("latency_ms") or {}
    return all(lat.get(k) is not None for k in ("q1", "median", "q3")) and int(op.get("ok", 1)) > 0


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def freshness_plot(report: JsonObj, path: Path) -> Path:
    """Seed 004 Fig. 2: P(reading the freshest value) per 10 ms bin, a line per read mode."""
    freshness: Mapping[str, Sequence[Mapping[str, Any]]] = report.get("freshness", {})
    fig = _new(7.5, 4.5)
    ax = fig.subplots()
    drawn = 0
    for mode in ("eventual", "consistent", *sorted(set(freshness) - {"eventual", "consistent"})):
        bins = [b for b in freshness.get(mode, []) if int(b["reads"]) > 0]
        if not bins:
            continue
        x = [(float(b["lag_ms"][0]) + float(b["lag_ms"][1])) / 2 for b in bins]
        y = [int(b["fresh"]) / int(b["reads"]) for b in bins]
        reads = sum(int(b["reads"]) for b in bins)
        ax.plot(
            x,
            y,
            marker=".",
            markersize=3,
            linewidth=1.2,
            color=_MODE_STYLE.get(mode),
            label=f"{mode} reads (n={reads:,})",
        )
        drawn += 1
    if not drawn:
        _empty(ax, "no reads could be judged (no completed write before them)")
    ax.set_xlabel("time since the end of the latest write (ms)")
    ax.set_ylabel("P(read returns the freshest value)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.set_title(f"Probability of reading the freshest value: target {report.get('target', '?')}")
    if drawn:
        ax.legend(loc="best")
    return _save(fig, path)


def _items_label(items: int) -> str:
    return "single item" if items == 1 else f"{items:,} items"


def sweep_plot(report: JsonObj, path: Path) -> Path:
    """Seed 000: total time for the same number of operations against concurrency."""
    points = report.get("points", [])
    fig = _new(7.0, 4.5)
    ax = fig.subplots()
    by_items: dict[int, list[JsonObj]] = {}
    for pt in points:
        by_items.setdefault(int(pt.get("items", 1)), []).append(pt)
    concurrencies = sorted({int(pt["concurrency"]) for pt in points})
    for items, unsorted in sorted(by_items.items()):
        pts = sorted(unsorted, key=lambda p: int(p["concurrency"]))
        ax.plot(
            [int(p["concurrency"]) for p in pts],
            [float(p["total_s"]) for p in pts],
            marker="o",
            label=f"{_items_label(items)}, {report.get('op', 'both')}",
        )
    if not points:
        _empty(ax, "no points")
    if len(concurrencies) > 1 and concurrencies[-1] / max(1, concurrencies[0]) >= 20:
        ax.set_xscale("log")  # 1 ... 200 threads: a log axis keeps the small counts readable
        ax.minorticks_off()
    if concurrencies:
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("concurrent operations (threads)")
    ax.set_ylabel("total time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    total = report.get("ops_per_point")
    ax.set_title(
        f"Total time vs concurrency: target {report.get('target', '?')}"
        + (f", {int(total):,} operations per point" if total else "")
    )
    if points:
        ax.legend()
    return _save(fig, path)


def cpq_plot(report: JsonObj, path: Path) -> Path:
    """Seed 003 Fig. 2: (a) consistency and (b) latency against p."""
    points = sorted(report.get("points", []), key=lambda x: float(x["p"]))
    fig = _new(10.0, 4.2)
    left, right = fig.subplots(1, 2)
    ps = [float(p["p"]) for p in points]
    left.plot(
        ps,
        [_f(p.get("stale_fraction")) for p in points],
        marker="o",
        color="tab:red",
        label="stale reads",
    )
    left.set_xlabel("p (probability of the strong mode)")
    left.set_ylabel("fraction of reads that are stale")
    worst = max((_f(p.get("stale_fraction")) for p in points), default=0.0)
    left.set_ylim(bottom=-0.03 * max(worst, 0.01))  # a point at 0 stays visible
    left.set_title("(a) consistency")
    for name, color in (("read", "tab:blue"), ("write", "tab:green")):
        right.plot(
            ps,
            [_f(p.get(f"{name}_p95_ms")) for p in points],
            marker="o",
            color=color,
            label=f"{name}s, p95",
        )
    right.set_xlabel("p (probability of the strong mode)")
    right.set_ylabel("95th percentile latency (ms)")
    right.set_ylim(bottom=0)
    right.set_title("(b) latency")
    for ax in (left, right):
        ax.set_xlim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"Consistency and latency vs p: target {report.get('target', '?')}")
    return _save(fig, path)


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)
