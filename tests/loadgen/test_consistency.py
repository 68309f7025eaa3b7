"""The meter on tiny hand-built traces whose answers are worked out in the comments."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmr.loadgen.consistency import (
    FreshnessBin,
    Read,
    Write,
    aggregate_bins,
    freshness,
    monotonic_read_violations,
    read_your_writes_violations,
    stale_reads,
    successive_reads,
)
from cmr.loadgen.gamma import gamma, gamma_per_key, gamma_per_value


def w(value: int, start: float, end: float, key: str = "k") -> Write:
    return Write(key, value, start, end)


def r(
    value: int | None,
    start: float,
    end: float,
    *,
    consistent: bool = False,
    reader: str = "a",
    key: str = "k",
) -> Read:
    return Read(key, value, start, end, consistent, reader)


def nonempty(bins: list[FreshnessBin]) -> dict[tuple[float, float], tuple[int, int]]:
    """{(lo, hi): (reads, fresh)} for the bins that saw reads."""
    return {(b["lag_ms"][0], b["lag_ms"][1]): (b["reads"], b["fresh"]) for b in bins if b["reads"]}


# freshness -------------------------------------------------------------------------------

WRITES = [w(1, 0.000, 0.050), w(2, 1.000, 1.050)]
READS = [
    r(None, -0.100, -0.080),  # before any write: not judged
    r(1, 0.020, 0.040),  # overlaps write 1: not judged
    r(1, 0.055, 0.070),  # 5 ms after write 1 ended, saw it: fresh, bin [0, 10)
    r(None, 0.105, 0.120),  # 55 ms after, saw nothing: stale, bin [50, 60)
    r(1, 0.605, 0.620, consistent=True),  # 555 ms: fresh, consistent bin [550, 560)
    r(1, 1.205, 1.220),  # 155 ms after write 2 ended, saw 1: stale, bin [150, 160)
    r(2, 1.505, 1.520),  # 455 ms after write 2: fresh, bin [450, 460)
    r(2, 2.555, 2.570),  # 1505 ms: beyond max_ms, dropped
    r(7, 0.5, 0.6, key="other"),  # a key nobody wrote: not judged
]


def test_freshness_bins_by_time_since_the_end_of_the_newest_completed_write() -> None:
    f = freshness(WRITES, READS)
    assert len(f["eventual"]) == len(f["consistent"]) == 100  # every 10 ms bin up to 1 s
    assert nonempty(f["eventual"]) == {
        (0, 10): (1, 1),
        (50, 60): (1, 0),
        (150, 160): (1, 0),
        (450, 460): (1, 1),
    }
    assert nonempty(f["consistent"]) == {(550, 560): (1, 1)}
    assert aggregate_bins(f["eventual"], 0, 450) == (1, 3)
    assert aggregate_bins(f["eventual"], 450, 1000) == (1, 1)


def test_freshness_since_start_is_seed_004s_lag() -> None:
    # the same reads measured from each write's start: 55, 105, 605 (consistent), 205, 505 ms
    f = freshness(WRITES, READS, bin_ms=50, max_ms=600, since="start")
    assert nonempty(f["eventual"]) == {
        (50, 100): (1, 1),
        (100, 150): (1, 0),
        (200, 250): (1, 0),
        (500, 550): (1, 1),
    }
    assert nonempty(f["consistent"]) == {}
    assert f["eventual"][-1]["lag_ms"] == [550, 600]


def test_freshness_counts_a_newer_value_as_fresh_and_a_last_short_bin() -> None:
    # a second writer's newer value seen 20 ms after the first write ended is fresh too
    f = freshness([w(5, 0, 0.01), w(9, 0.5, 0.52)], [r(9, 0.03, 0.04)], bin_ms=30, max_ms=100)
    assert nonempty(f["eventual"]) == {(0, 30): (1, 1)}
    assert f["eventual"][-1]["lag_ms"] == [90, 100]
    with pytest.raises(ValueError, match="positive"):
        freshness([], [], bin_ms=0)


def test_operations_must_not_end_before_they_start() -> None:
    with pytest.raises(ValueError, match="ends before"):
        w(1, 1.0, 0.5)
    with pytest.raises(ValueError, match="ends before"):
        r(1, 1.0, 0.5)


# successive reads ------------------------------------------------------------------------


def test_monotonic_reads_pair_successive_reads_of_one_reader_and_key() -> None:
    reads = [
        r(2, 0.1, 0.11, reader="a"),
        r(1, 0.2, 0.21, reader="a"),  # older than the 2 before it: violation
        r(3, 0.3, 0.31, reader="a"),
        r(1, 0.15, 0.16, reader="b"),
        r(None, 0.25, 0.26, reader="b"),  # saw nothing after seeing 1: violation
        r(0, 0.35, 0.36, reader="b", key="other"),  # another key: its own sequence
        r(3, 0.4, 0.41, reader="a", consistent=True),
        r(3, 0.5, 0.51, reader="a", consistent=True),
    ]
    # a: (2,1) (1,3); b: (1,None)
    assert monotonic_read_violations(reads) == {"pairs": 3, "violations": 2}
    assert monotonic_read_violations(reads, consistent=True) == {"pairs": 1, "violations": 0}
    with pytest.raises(ValueError, match="together"):
        monotonic_read_violations(reads, writes=[])


def test_successive_reads_in_the_window_after_one_write_fill_table_2() -> None:
    writes = [w(1, 0.0, 0.05), w(2, 1.0, 1.05)]
    reads = [
        r(1, 0.10, 0.12),  # fresh
        r(0, 0.20, 0.22),  # stale: (fresh, stale), a monotonic-read violation
        r(0, 0.30, 0.32),  # stale: (stale, stale)
        r(1, 0.40, 0.42),  # fresh: (stale, fresh)
        r(1, 0.60, 0.62),  # 550 ms after write 1: outside [0, 450), its pairs do not count
        r(2, 1.10, 1.12),  # pair (0.60, 1.10) straddles two writes: not counted
        r(2, 1.20, 1.22),  # (fresh, fresh)
    ]
    assert successive_reads(writes, reads) == {
        "pairs": 4,
        "stale_stale": 1,
        "stale_fresh": 1,
        "fresh_stale": 1,
        "fresh_fresh": 1,
    }
    assert monotonic_read_violations(reads, writes=writes, window_ms=(0, 450)) == {
        "pairs": 4,
        "violations": 1,
    }
    assert successive_reads(writes, reads, window_ms=(0, 1000))["pairs"] == 5


def test_read_your_writes_pairs_each_read_with_its_sessions_newest_completed_write() -> None:
    own = {"s": [w(5, 0.0, 0.05), w(6, 2.0, 2.05, key="x")]}
    reads = [
        r(4, 0.10, 0.11, reader="s"),  # older than its own 5: violation
        r(5, 0.20, 0.21, reader="s"),
        r(4, 0.20, 0.21, reader="t"),  # another session: not counted
        r(None, -1.0, -0.9, reader="s"),  # before its write: not counted
        r(None, 2.02, 2.03, reader="s", key="x"),  # while its write is in flight: not counted
        r(None, 2.10, 2.11, reader="s", key="x"),  # after it: violation
    ]
    assert read_your_writes_violations(own, reads) == {"pairs": 3, "violations": 2}


def test_stale_reads_counts_reads_older_than_a_completed_write_even_mid_write() -> None:
    writes = [w(1, 0.0, 0.05), w(2, 1.0, 1.05)]
    reads = [
        r(None, 0.01, 0.02),  # before any write completed: not counted
        r(0, 0.10, 0.11),  # stale
        r(1, 0.20, 0.21, consistent=True),
        r(1, 1.01, 1.02),  # during write 2, saw 1: not stale
        r(0, 1.02, 1.03),  # during write 2, saw 0: stale (1 had completed)
        r(2, 1.20, 1.21, consistent=True),
    ]
    assert stale_reads(writes, reads) == {"reads": 5, "stale": 2}
    assert stale_reads(writes, reads, consistent=True) == {"reads": 2, "stale": 0}
    assert stale_reads(writes, reads, consistent=False) == {"reads": 3, "stale": 2}


# Γ ---------------------------------------------------------------------------------------


def test_gamma_of_a_linearizable_history_is_zero() -> None:
    history: list[Write | Read] = [
        w(1, 0, 1),
        r(1, 2, 3),
        w(2, 4, 5),
        r(1, 4.5, 5.5),  # overlaps write 2, may see the old value
        r(2, 4.6, 5.6),  # or the new one
        r(2, 6, 7),
    ]
    assert gamma(history) == 0
    assert gamma([]) == 0


def test_gamma_of_a_stale_read_is_the_time_since_the_overwrite_ended() -> None:
    # 1 is overwritten by 2 (ends at 1.05); a read starting 300 ms later still returns 1.
    # Cluster 1: F = 0.05, S = 1.35; cluster 2: F = 1.05, S = 1.0.
    # min(S1 - F2, S2 - F1) = min(0.30, 0.95) = 0.30: widen by 0.15 each side and the stale
    # read may take effect at 1.20, the overwrite at 1.20 after it.
    history: list[Write | Read] = [w(1, 0.0, 0.05), w(2, 1.0, 1.05), r(1, 1.35, 1.37)]
    assert gamma(history) == pytest.approx(0.30)
    assert gamma_per_value(history) == pytest.approx({1: 0.30, 2: 0.30})


def test_gamma_of_reading_nothing_after_a_write() -> None:
    # the initial value is written at -inf: S_init - F_1 = 3 - 1
    assert gamma([w(1, 0, 1), r(None, 3, 4)]) == 2
    assert gamma([r(None, -2, -1), w(1, 0, 1)]) == 0


def test_gamma_of_crossing_forward_zones_is_their_overlap() -> None:
    # a: [F, S] = [1, 5]; b: [3, 7]; overlap [3, 5] = 2. With 2, i.e. 1 each side, w(b) ends
    # at 4 when r(a) starts at 4, so w(b), w(a), r(a)... fails but w(a), r(a), w(b), r(b) works.
    history: list[Write | Read] = [w(1, 0, 1), r(1, 5, 6), w(2, 2, 3), r(2, 7, 8)]
    assert gamma(history) == 2
    assert brute_gamma(history) == 2


def test_gamma_of_nested_forward_zones_exceeds_their_overlap() -> None:
    # a: [1, 10] contains b: [3, 4]. The overlap (1) is not enough: at 1, w(b) still precedes
    # r(a) and w(a) precedes r(b). Needed: min(S_a - F_b, S_b - F_a) = min(7, 3) = 3, when
    # w(b), r(b), w(a), r(a) becomes legal (w(a) widened to [-1.5, 2.5] no longer precedes
    # r(b) widened to [2.5, 6.5]).
    history: list[Write | Read] = [w(1, 0, 1), r(1, 10, 11), w(2, 2, 3), r(2, 4, 5)]
    assert gamma(history) == 3
    assert brute_gamma(history) == 3


def test_gamma_of_two_readers_disagreeing_on_concurrent_writes() -> None:
    # w(1) [0, 2] and w(2) [1, 3] overlap; one reader sees 2 at [4, 5], a later one sees 1 at
    # [4.5, 5.5]. Cluster 1: F = 2, S = 4.5; cluster 2: F = 3, S = 4 (nested).
    # min(4.5 - 3, 4 - 2) = 1.5: then w(1), r(1), w(2), r(2) is legal.
    history: list[Write | Read] = [w(1, 0, 2), w(2, 1, 3), r(2, 4, 5), r(1, 4.5, 5.5)]
    assert gamma(history) == 1.5
    assert brute_gamma(history) == 1.5


def test_gamma_of_a_read_that_ends_before_its_write_starts() -> None:
    # a read from the future (clock skew across machines): s(w) - f(r) = 3 - 1
    assert gamma([r(1, 0, 1), w(1, 3, 4)]) == 2


def test_gamma_per_value_blames_the_conflicting_values_only() -> None:
    # 1 is read 0.5 after 2 was written; 3 is clean.
    # Cluster 1: F = 1, S = 4.5; 2: F = 4, S = 6; 3: F = 9, S = 10.
    history: list[Write | Read] = [
        w(1, 0, 1),
        r(1, 1.5, 2),
        w(2, 3, 4),
        r(1, 4.5, 5),
        r(2, 6, 7),
        w(3, 8, 9),
        r(3, 10, 11),
    ]
    assert gamma_per_value(history) == {1: 0.5, 2: 0.5, 3: 0.0}
    assert gamma(history) == 0.5


def test_gamma_per_key_and_the_histories_gamma_refuses() -> None:
    # on x, 1 is read 2 after 2 was written, but the writes are only 1 apart: widened by 0.5
    # each side they become concurrent, 2 may take effect first, and 1 is the fresh value.
    # Cluster 1: F = 1, S = 5; cluster 2: F = 3, S = 2; min(5 - 3, 2 - 1) = 1.
    ops: list[Write | Read] = [
        w(1, 0, 1),
        r(1, 2, 3),
        w(1, 0, 1, key="x"),
        w(2, 2, 3, key="x"),
        r(1, 5, 6, key="x"),
    ]
    assert gamma_per_key(ops) == {"k": 0.0, "x": 1.0}
    assert brute_gamma([op for op in ops if op.key == "x"]) == 1
    with pytest.raises(ValueError, match="per key"):
        gamma(ops)
    with pytest.raises(ValueError, match="written twice"):
        gamma([w(1, 0, 1), w(1, 2, 3)])
    with pytest.raises(ValueError, match="no write"):
        gamma([w(1, 0, 1), r(2, 2, 3)])


# Γ against brute force -------------------------------------------------------------------


def linearizable_widened(ops: list[Write | Read], g: float) -> bool:
    """Search every legal order of ``ops`` widened by g/2 at each end.

    Widened, op i precedes op j iff s_j - f_i > g; a legal order puts each operation after
    all those preceding it, and each read right where its value is the newest written.
    """
    n = len(ops)
    before = [frozenset(i for i in range(n) if ops[j].start - ops[i].end > g) for j in range(n)]

    @functools.cache
    def extend(placed: frozenset[int], current: int | None) -> bool:
        if len(placed) == n:
            return True
        for j in range(n):
            if j in placed or not before[j] <= placed:
                continue
            op = ops[j]
            if isinstance(op, Write):
                if extend(placed | {j}, op.value):
                    return True
            elif op.value == current and extend(placed | {j}, current):
                return True
        return False

    return extend(frozenset(), None)


def brute_gamma(history: list[Write | Read]) -> float:
    """The least g making the history linearizable, tried at every value where it can change.

    Precedences only change at g = s_j - f_i, so Γ is 0 or one of those.
    """
    candidates = {0.0} | {b.start - a.end for a in history for b in history if b.start > a.end}
    for g in sorted(candidates):
        if linearizable_widened(history, g):
            return g
    raise AssertionError("widening by the whole span always linearizes")


@st.composite
def histories(draw: st.DrawFn) -> list[Write | Read]:
    times = st.integers(0, 12)
    durations = st.integers(0, 5)
    n_writes = draw(st.integers(1, 3))
    ops: list[Write | Read] = []
    for value in range(1, n_writes + 1):
        s, d = draw(times), draw(durations)
        ops.append(w(value, float(s), float(s + d)))
    for _ in range(draw(st.integers(0, 4))):
        s, d = draw(times), draw(durations)
        value = draw(st.sampled_from([None, *range(1, n_writes + 1)]))
        ops.append(r(value, float(s), float(s + d)))
    return ops


@settings(max_examples=400, deadline=None)
@given(histories())
@pytest.mark.slow
def test_gamma_matches_brute_force(history: list[Write | Read]) -> None:
    assert gamma(history) == brute_gamma(history)
    assert gamma(history) == max(gamma_per_value(history).values())


def test_brute_force_agrees_on_order_independence() -> None:
    # the zone algorithm must not depend on the order operations were recorded in
    history: list[Write | Read] = [
        w(1, 0, 2),
        w(2, 1, 3),
        r(2, 4, 5),
        r(1, 4.5, 5.5),
        r(None, 0.5, 0.7),
    ]
    scores = {gamma(list(p)) for p in itertools.permutations(history)}
    assert scores == {brute_gamma(history)}
