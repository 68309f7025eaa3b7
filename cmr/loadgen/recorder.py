"""Measurements a load task takes and reducers merge (:mod:`cmr.loadgen.summary` reports them).

A :class:`Measurement` holds one HDR histogram (the ``hdrhistogram`` library: microseconds,
1 µs to 60 s, 3 significant digits; longer calls are recorded as 60 s) per (op, mode, outcome),
where outcome is ``ok`` or an error class; SDK retries per (op, mode); open-loop ops dropped
and started late; the generator's own CPU and wall time; and, for staleness runs, the merged
results of the consistency analyses (never the raw trace). Everything merges by sums, except
the elapsed time and Γ per key (max) and the first start / last end (min / max), so merging
is associative and commutative and a reducer can fold measurements in any order.

``to_wire`` gives plain data (str keys, lists, ints, floats, str: msgpack- and JSON-safe,
histograms as their base64 ``encode()``); ``from_wire`` accepts it back, lists or tuples.

The generator-saturation rule: a task's operations all run on one asyncio event loop, i.e.
one core, so a task whose process CPU time exceeds 90% of its wall time was mostly busy
generating load rather than waiting on the store; its latencies include client-side queueing.
Tasks that share a core with other tasks are not caught by this rule (their CPU share is
lower than their wall time), so run at most one load task per core.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cmr.errors import WireError
from cmr.loadgen.extra import INSTALL
from cmr.loadgen.targets import ERROR_CLASSES

try:
    from hdrh.histogram import HdrHistogram
except ModuleNotFoundError as exc:
    # a worker without the loadgen extra, handed a load task: its error says what to install
    raise ModuleNotFoundError(
        f"{exc}; the load generator needs the loadgen extra: {INSTALL}", name=exc.name
    ) from None

__all__ = [
    "HIGHEST_US",
    "LOWEST_US",
    "SATURATED_CPU",
    "Measurement",
    "Staleness",
]

LOWEST_US = 1
HIGHEST_US = 60_000_000
SIGNIFICANT = 3
SATURATED_CPU = 0.9  # process CPU / wall above which a task's generator was the bottleneck
WIRE_VERSION = 1

Op = Literal["get", "put"]
OUTCOMES = ("ok", *ERROR_CLASSES)
MODE_ORDER = {"eventual": 0, "consistent": 1, "plain": 2, "conditional": 3}
CELLS = ("stale_stale", "stale_fresh", "fresh_stale", "fresh_fresh")


def _histogram() -> Any:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT)


def _add(into: Any, other: Any) -> None:
    """``into += other``; HdrHistogram.add takes an empty histogram's minimum as 0."""
    if other.get_total_count() == 0:
        return
    low = into.min_value if into.get_total_count() else other.min_value
    into.add(other)
    into.min_value = min(low, other.min_value)


def _decode(text: str) -> Any:
    h = HdrHistogram.decode(text.encode("ascii"))
    if (h.lowest_trackable_value, h.highest_trackable_value) != (LOWEST_US, HIGHEST_US):
        # a histogram of another range would add up with shifted buckets
        fresh = _histogram()
        _add(fresh, h)
        return fresh
    return h


@dataclass
class Staleness:
    """Merged results of the consistency analyses of staleness tasks."""

    # mode -> (lo_ms, hi_ms) -> [reads, fresh]
    freshness: dict[str, dict[tuple[float, float], list[int]]] = field(
        default_factory=lambda: {"eventual": {}, "consistent": {}}
    )
    monotonic: dict[str, list[int]] = field(
        default_factory=lambda: {"eventual": [0, 0], "consistent": [0, 0]}
    )  # mode -> [pairs, violations]
    read_your_writes: list[int] = field(default_factory=lambda: [0, 0])
    stale: dict[str, list[int]] = field(
        default_factory=lambda: {"eventual": [0, 0], "consistent": [0, 0]}
    )  # mode -> [reads, stale]
    successive: Counter[str] = field(default_factory=Counter)  # seed 004 Table 2 cells
    gamma_s: dict[str, float] = field(default_factory=dict)  # key -> Γ in seconds
    writes: int = 0
    reads: int = 0  # reads analysed
    unjudged: int = 0  # reads of values no recorded write produced (a failed write's, say)
    untraced: int = 0  # operations past the trace cap, measured but not analysed

    def add(self, other: Staleness) -> None:
        for mode, bins in other.freshness.items():
            mine = self.freshness.setdefault(mode, {})
            for span, (reads, fresh) in bins.items():
                tally = mine.setdefault(span, [0, 0])
                tally[0] += reads
                tally[1] += fresh
        for mode, (pairs, violations) in other.monotonic.items():
            m = self.monotonic.setdefault(mode, [0, 0])
            m[0] += pairs
            m[1] += violations
        self.read_your_writes[0] += other.read_your_writes[0]
        self.read_your_writes[1] += other.read_your_writes[1]
        for mode, (reads, stale) in other.stale.items():
            s = self.stale.setdefault(mode, [0, 0])
            s[0] += reads
            s[1] += stale
        self.successive.update(other.successive)
        for key, g in other.gamma_s.items():
            self.gamma_s[key] = max(g, self.gamma_s.get(key, 0.0))
        self.writes += other.writes
        self.reads += other.reads
        self.unjudged += other.unjudged
        self.untraced += other.untraced

    def to_wire(self) -> dict[str, Any]:
        return {
            "freshness": {
                mode: [[lo, hi, n, k] for (lo, hi), (n, k) in sorted(bins.items())]
                for mode, bins in sorted(self.freshness.items())
            },
            "monotonic": {mode: list(v) for mode, v in sorted(self.monotonic.items())},
            "read_your_writes": list(self.read_your_writes),
            "stale": {mode: list(v) for mode, v in sorted(self.stale.items())},
            "successive": {cell: self.successive[cell] for cell in CELLS},
            "gamma_s": dict(sorted(self.gamma_s.items())),
            "writes": self.writes,
            "reads": self.reads,
            "unjudged": self.unjudged,
            "untraced": self.untraced,
        }

    @staticmethod
    def from_wire(data: Mapping[str, Any]) -> Staleness:
        s = Staleness()
        s.freshness = {
            str(mode): {(float(lo), float(hi)): [int(n), int(k)] for lo, hi, n, k in bins}
            for mode, bins in data["freshness"].items()
        }
        s.monotonic = {str(m): [int(v[0]), int(v[1])] for m, v in data["monotonic"].items()}
        s.read_your_writes = [int(x) for x in data["read_your_writes"]]
        s.stale = {str(m): [int(v[0]), int(v[1])] for m, v in data["stale"].items()}
        s.successive = Counter({str(c): int(n) for c, n in data["successive"].items()})
        s.gamma_s = {str(k): float(g) for k, g in data["gamma_s"].items()}
        for name in ("writes", "reads", "unjudged", "untraced"):
            setattr(s, name, int(data[name]))
        return s


class Measurement:
    """What one or more load tasks measured; see the module notes."""

    def __init__(self) -> None:
        self.histograms: dict[tuple[str, str, str], Any] = {}
        self.retries: Counter[tuple[str, str]] = Counter()
        self.dropped = 0  # open loop: intended ops never sent (backlog full, or waited too long)
        self.late = 0  # open loop: ops sent more than LATE_S after their intended start
        self.cpu_us = 0  # the generator's process CPU time during the load
        self.wall_us = 0  # the load's wall time, summed over tasks
        self.elapsed_us = 0  # the longest task's load phase (model time for the sim)
        self.tasks = 0
        self.saturated_tasks = 0
        self.first_start: float | None = None  # epoch seconds, across tasks
        self.last_end: float | None = None
        self.staleness: Staleness | None = None

    def record(self, op: str, mode: str, outcome: str, seconds: float, retries: int = 0) -> None:
        """One completed operation and its latency in seconds (clamped to the histogram)."""
        key = (op, mode, outcome)
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = _histogram()
        h.record_value(min(HIGHEST_US, max(LOWEST_US, round(seconds * 1e6))))
        if retries:
            self.retries[(op, mode)] += retries

    def finish_task(
        self,
        cpu_s: float,
        wall_s: float,
        elapsed_s: float,
        span: tuple[float, float],
        saturable: bool = True,
    ) -> None:
        """Close this measurement as one task's: its CPU, wall and load-phase times.
        ``saturable``: whether the task's CPU could have held its load back (not in
        virtual time)."""
        self.tasks += 1
        self.cpu_us += round(cpu_s * 1e6)
        self.wall_us += round(wall_s * 1e6)
        self.elapsed_us = max(self.elapsed_us, round(elapsed_s * 1e6))
        self.saturated_tasks += saturable and wall_s > 0 and cpu_s / wall_s > SATURATED_CPU
        self._span(*span)

    def _span(self, start: float | None, end: float | None) -> None:
        if start is not None:
            self.first_start = start if self.first_start is None else min(self.first_start, start)
        if end is not None:
            self.last_end = end if self.last_end is None else max(self.last_end, end)

    def count(
        self, op: str | None = None, mode: str | None = None, outcome: str | None = None
    ) -> int:
        """Operations recorded, optionally of one op, mode and outcome."""
        return sum(
            h.get_total_count()
            for (o, m, out), h in self.histograms.items()
            if (op is None or o == op)
            and (mode is None or m == mode)
            and (outcome is None or out == outcome)
        )

    def histogram(
        self, op: str | None = None, mode: str | None = None, outcome: str | None = "ok"
    ) -> Any:
        """A merged copy of the matching histograms (default: successful operations)."""
        merged = _histogram()
        for (o, m, out), h in self.histograms.items():
            if (
                (op is None or o == op)
                and (mode is None or m == mode)
                and (outcome is None or out == outcome)
            ):
                _add(merged, h)
        return merged

    def pairs(self) -> list[tuple[str, str]]:
        """The (op, mode) combinations seen, gets first, modes in report order."""
        seen = {(o, m) for o, m, _ in self.histograms}
        return sorted(seen, key=lambda om: (om[0], MODE_ORDER.get(om[1], 9), om[1]))

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_us / 1e6

    def add(self, other: Measurement) -> None:
        """``self += other``."""
        for key, h in other.histograms.items():
            mine = self.histograms.get(key)
            if mine is None:
                mine = self.histograms[key] = _histogram()
            _add(mine, h)
        self.retries.update(other.retries)
        self.dropped += other.dropped
        self.late += other.late
        self.cpu_us += other.cpu_us
        self.wall_us += other.wall_us
        self.elapsed_us = max(self.elapsed_us, other.elapsed_us)
        self.tasks += other.tasks
        self.saturated_tasks += other.saturated_tasks
        self._span(other.first_start, other.last_end)
        if other.staleness is not None:
            if self.staleness is None:
                self.staleness = Staleness()
            self.staleness.add(other.staleness)

    def merge(self, other: Measurement) -> Measurement:
        """A new measurement holding both; neither operand changes."""
        out = Measurement()
        out.add(self)
        out.add(other)
        return out

    @staticmethod
    def merged(items: Iterable[Measurement]) -> Measurement:
        out = Measurement()
        for m in items:
            out.add(m)
        return out

    def to_wire(self) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "histograms": [
                [op, mode, outcome, h.encode().decode("ascii")]
                for (op, mode, outcome), h in sorted(self.histograms.items())
                if h.get_total_count()
            ],
            "retries": [[op, mode, n] for (op, mode), n in sorted(self.retries.items()) if n],
            "dropped": self.dropped,
            "late": self.late,
            "cpu_us": self.cpu_us,
            "wall_us": self.wall_us,
            "elapsed_us": self.elapsed_us,
            "tasks": self.tasks,
            "saturated_tasks": self.saturated_tasks,
            "first_start": self.first_start,
            "last_end": self.last_end,
            "staleness": None if self.staleness is None else self.staleness.to_wire(),
        }

    @staticmethod
    def from_wire(data: Mapping[str, Any]) -> Measurement:
        try:
            if data.get("v") != WIRE_VERSION:
                raise WireError(f"measurement format {data.get('v')!r}, expected {WIRE_VERSION}")
            m = Measurement()
            for op, mode, outcome, text in data["histograms"]:
                key = (str(op), str(mode), str(outcome))
                h = _decode(str(text))
                if key in m.histograms:
                    _add(m.histograms[key], h)
                else:
                    m.histograms[key] = h
            for op, mode, n in data["retries"]:
                m.retries[(str(op), str(mode))] += int(n)
            for name in (
                "dropped",
                "late",
                "cpu_us",
                "wall_us",
                "elapsed_us",
                "tasks",
                "saturated_tasks",
            ):
                setattr(m, name, int(data[name]))
            m._span(
                None if data["first_start"] is None else float(data["first_start"]),
                None if data["last_end"] is None else float(data["last_end"]),
            )
            if data["staleness"] is not None:
                m.staleness = Staleness.from_wire(data["staleness"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"not a load measurement: {type(exc).__name__}: {exc}") from None
        return m
