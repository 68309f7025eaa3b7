"""The consistency meter: pure analysis of recorded reads and writes (no I/O, no clock).

The staleness protocol of seeds 002 and 004: for each key, writers write unique integer values
that increase over time (a counter, or the writer's clock); readers record what they saw. Every
operation carries its start and end time in seconds on one machine's monotonic clock. "Newer"
means a larger value, and a read that returned ``None`` saw nothing written yet (the oldest
state). Reads with a value no write produced are the caller's to filter out.

What is measured:

- ``freshness``: P(fresh | time since the newest completed write), in ``bin_ms`` bins, for
  eventual and consistent reads separately (seed 004 Figure 2 / Table 1, seed 002 Fig. 8).
- ``successive_reads`` and ``monotonic_read_violations``: pairs of successive reads by one
  reader (seed 004 Table 2); ``read_your_writes_violations``: reads after a session's own write.
- ``stale_reads``: the fraction of reads that are stale, the consistency axis of the
  continuous-partial-quorum trade-off (seed 003).
- Golab et al.'s Γ (Gamma) score, exact, is :mod:`cmr.loadgen.gamma` (over these ``Write``
  and ``Read`` records).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

__all__ = [
    "FreshnessBin",
    "PairCount",
    "Read",
    "StaleCount",
    "SuccessiveReads",
    "Write",
    "aggregate_bins",
    "freshness",
    "monotonic_read_violations",
    "read_your_writes_violations",
    "stale_reads",
    "successive_reads",
]


@dataclass(frozen=True, slots=True)
class Write:
    """One completed write of ``value`` to ``key`` (times in seconds)."""

    key: str
    value: int
    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"write of {self.value!r} to {self.key!r} ends before it starts")


@dataclass(frozen=True, slots=True)
class Read:
    """One completed read of ``key`` by ``reader``; ``value`` is None when nothing was there."""

    key: str
    value: int | None
    start: float
    end: float
    consistent: bool
    reader: str

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"read of {self.key!r} by {self.reader!r} ends before it starts")


class FreshnessBin(TypedDict):
    """Reads whose lag fell in ``[lag_ms[0], lag_ms[1])`` and how many of them were fresh."""

    lag_ms: list[float]
    reads: int
    fresh: int


class PairCount(TypedDict):
    pairs: int
    violations: int


class SuccessiveReads(TypedDict):
    """Seed 004 Table 2: pairs of successive reads classified (first, second) fresh or stale."""

    pairs: int
    stale_stale: int
    stale_fresh: int
    fresh_stale: int
    fresh_fresh: int


class StaleCount(TypedDict):
    reads: int
    stale: int


def _older(seen: int | None, than: int | None) -> bool:
    """True when value ``seen`` is older than ``than`` (None is older than any write)."""
    if than is None:
        return False
    return seen is None or seen < than


def _newer(a: Write, b: Write) -> Write:
    return b if b.value > a.value else a


class _KeyWrites:
    """The writes of one key, indexed to answer the two questions every read asks."""

    __slots__ = ("_by_end", "_ends", "_newest", "_reach", "_starts")

    def __init__(self, writes: Iterable[Write]) -> None:
        by_start = sorted(writes, key=lambda w: w.start)
        self._starts = [w.start for w in by_start]
        # the latest end among writes started so far: an interval stabbing query in O(log n)
        self._reach = list(itertools.accumulate((w.end for w in by_start), max))
        self._by_end = sorted(by_start, key=lambda w: w.end)
        self._ends = [w.end for w in self._by_end]
        # newest value completed so far; with one writer per key this is just the last write
        self._newest: list[Write] = list(itertools.accumulate(self._by_end, _newer))

    def overlaps(self, start: float, end: float) -> bool:
        """Does any write overlap the open interval (start, end)? Touching does not count."""
        i = bisect.bisect_left(self._starts, end)
        return i > 0 and self._reach[i - 1] > start

    def newest_completed(self, t: float) -> Write | None:
        """The newest write that ended at or before ``t``."""
        j = bisect.bisect_right(self._ends, t)
        return self._newest[j - 1] if j else None


def _index(writes: Iterable[Write]) -> dict[str, _KeyWrites]:
    by_key: dict[str, list[Write]] = defaultdict(list)
    for w in writes:
        by_key[w.key].append(w)
    return {key: _KeyWrites(ws) for key, ws in by_key.items()}


def _reference(index: Mapping[str, _KeyWrites], r: Read) -> Write | None:
    """The write a read is judged against, or None when the read cannot be judged.

    That is the newest write completed before the read started; reads that overlap any write
    of their key are not judged (either answer would be right) and neither are reads before
    the first write.
    """
    kw = index.get(r.key)
    if kw is None or kw.overlaps(r.start, r.end):
        return None
    return kw.newest_completed(r.start)


def freshness(
    writes: Iterable[Write],
    reads: Iterable[Read],
    bin_ms: float = 10,
    max_ms: float = 1000,
    since: Literal["end", "start"] = "end",
) -> dict[str, list[FreshnessBin]]:
    """P(fresh | lag) per ``bin_ms`` bin up to ``max_ms``, for eventual and consistent reads.

    Each read is judged against the newest write that ended before the read started. Its lag
    is ``read.start - write.end`` (``since="end"``, seed 002's definition, and the default) or
    ``read.start - write.start`` (``since="start"``, seed 004's Figure 2 and Table 1). The read
    is fresh when it returned that write's value or a newer one. Reads that overlap a write of
    their key, reads before the first write, and lags of ``max_ms`` or more are left out.

    Returns ``{"eventual": bins, "consistent": bins}``, every bin present (possibly empty) so
    results from many readers merge bin by bin.
    """
    if bin_ms <= 0 or max_ms <= 0:
        raise ValueError("bin_ms and max_ms must be positive")
    count = math.ceil(max_ms / bin_ms)
    tallies = {mode: [[0, 0] for _ in range(count)] for mode in ("eventual", "consistent")}
    index = _index(writes)
    for r in reads:
        w = _reference(index, r)
        if w is None:
            continue
        lag_ms = (r.start - (w.end if since == "end" else w.start)) * 1000.0
        if not 0 <= lag_ms < max_ms:
            continue
        tally = tallies["consistent" if r.consistent else "eventual"][int(lag_ms // bin_ms)]
        tally[0] += 1
        tally[1] += not _older(r.value, w.value)
    return {
        mode: [
            {"lag_ms": [i * bin_ms, min((i + 1) * bin_ms, max_ms)], "reads": n, "fresh": k}
            for i, (n, k) in enumerate(bins)
        ]
        for mode, bins in tallies.items()
    }


def aggregate_bins(bins: Iterable[FreshnessBin], lo_ms: float, hi_ms: float) -> tuple[int, int]:
    """(fresh, reads) over the bins that lie wholly inside [lo_ms, hi_ms), as in Table 1."""
    fresh = reads = 0
    for b in bins:
        if b["lag_ms"][0] >= lo_ms and b["lag_ms"][1] <= hi_ms:
            fresh += b["fresh"]
            reads += b["reads"]
    return fresh, reads


def _successive_pairs(reads: Iterable[Read], consistent: bool) -> Iterator[tuple[Read, Read]]:
    """Successive reads (by start time) of one key by one reader, in the chosen mode."""
    runs: dict[tuple[str, str], list[Read]] = defaultdict(list)
    for r in reads:
        if r.consistent == consistent:
            runs[(r.reader, r.key)].append(r)
    for run in runs.values():
        run.sort(key=lambda r: r.start)
        yield from itertools.pairwise(run)


def _in_window(
    index: Mapping[str, _KeyWrites], first: Read, second: Read, window_ms: tuple[float, float]
) -> Write | None:
    """The write both reads are judged against, when both lags fall in ``window_ms``."""
    w = _reference(index, first)
    if w is None or _reference(index, second) is not w:
        return None
    lo, hi = window_ms
    for r in (first, second):
        if not lo <= (r.start - w.end) * 1000.0 < hi:
            return None
    return w


def monotonic_read_violations(
    reads: Iterable[Read],
    *,
    consistent: bool = False,
    writes: Iterable[Write] | None = None,
    window_ms: tuple[float, float] | None = None,
) -> PairCount:
    """Successive reads by the same reader of the same key where the second saw older data.

    Only reads of one mode are paired (``consistent=False``: eventual reads, the default;
    consistent reads are counted by a separate call). With ``writes`` and ``window_ms``, only
    pairs whose two reads both started within ``[lo, hi)`` ms after the end of the same write
    count, none of them overlapping a write (seed 004 Table 2 uses the stale window).
    """
    if (writes is None) != (window_ms is None):
        raise ValueError("writes and window_ms go together")
    index = _index(writes) if writes is not None else None
    pairs = violations = 0
    for first, second in _successive_pairs(reads, consistent):
        if (
            index is not None
            and window_ms is not None
            and _in_window(index, first, second, window_ms) is None
        ):
            continue
        pairs += 1
        violations += _older(second.value, first.value)
    return {"pairs": pairs, "violations": violations}


def successive_reads(
    writes: Iterable[Write],
    reads: Iterable[Read],
    *,
    consistent: bool = False,
    window_ms: tuple[float, float] = (0, 450),
) -> SuccessiveReads:
    """Seed 004 Table 2: successive reads by one reader, both within ``window_ms`` of a write.

    Each read of a pair is fresh or stale against the same write (the newest completed before
    it started); a fresh read followed by a stale one is a monotonic-read violation.
    """
    index = _index(writes)
    table: SuccessiveReads = {
        "pairs": 0,
        "stale_stale": 0,
        "stale_fresh": 0,
        "fresh_stale": 0,
        "fresh_fresh": 0,
    }
    for first, second in _successive_pairs(reads, consistent):
        w = _in_window(index, first, second, window_ms)
        if w is None:
            continue
        table["pairs"] += 1
        a = "stale" if _older(first.value, w.value) else "fresh"
        b = "stale" if _older(second.value, w.value) else "fresh"
        cell: Literal["stale_stale", "stale_fresh", "fresh_stale", "fresh_fresh"] = (
            "stale_stale"
            if (a, b) == ("stale", "stale")
            else "stale_fresh"
            if a == "stale"
            else "fresh_stale"
            if b == "stale"
            else "fresh_fresh"
        )
        table[cell] += 1
    return table


def read_your_writes_violations(
    writes_by_session: Mapping[str, Sequence[Write]], reads: Iterable[Read]
) -> PairCount:
    """Reads by a session after one of its own writes to the key ended that saw older data.

    A read's session is its ``reader``; each read is paired with the newest write its session
    completed on that key before the read started (reads with none are not counted).
    """
    own = {session: _index(session_writes) for session, session_writes in writes_by_session.items()}
    pairs = violations = 0
    for r in reads:
        kw = own.get(r.reader, {}).get(r.key)
        w = kw.newest_completed(r.start) if kw is not None else None
        if w is None:
            continue
        pairs += 1
        violations += _older(r.value, w.value)
    return {"pairs": pairs, "violations": violations}


def stale_reads(
    writes: Iterable[Write], reads: Iterable[Read], *, consistent: bool | None = None
) -> StaleCount:
    """How many reads returned data older than a write that had completed before they began.

    Unlike ``freshness`` this keeps reads that overlap a later write: seeing the older of two
    values is stale whatever is in flight. Reads before the first write are not counted;
    ``consistent`` picks one mode (None: every read, as when each read chooses its mode with
    probability p under continuous partial quorums, seed 003).
    """
    index = _index(writes)
    n = stale = 0
    for r in reads:
        if consistent is not None and r.consistent != consistent:
            continue
        kw = index.get(r.key)
        w = kw.newest_completed(r.start) if kw is not None else None
        if w is None:
            continue
        n += 1
        stale += _older(r.value, w.value)
    return {"reads": n, "stale": stale}
