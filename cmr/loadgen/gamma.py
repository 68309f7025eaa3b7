"""Golab et al.'s Γ (Gamma) score of recorded histories, exact (pure: no I/O, no clock).

Γ is the least widening of every operation's interval that makes one key's history
linearizable; the definition and the zone algorithm are in the notes below. The histories are
:mod:`cmr.loadgen.consistency`'s ``Write`` and ``Read`` records.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from cmr.loadgen.consistency import Read, Write

__all__ = ["gamma", "gamma_per_key", "gamma_per_value"]


# Γ (Gamma)
#
# Definition (Golab, Rahman, AuYoung, Keeton, Gupta, "Client-centric benchmarking of eventual
# consistency for cloud storage systems", ICDCS 2014; seed 003 reference [13]): a history H of
# one register is Γ-atomic when it becomes linearizable after every operation's interval
# [s, f] is widened to [s - Γ/2, f + Γ/2]; Γ(H) is the smallest Γ >= 0 for which it is.
# Seed 003 glosses a score t as "each operation takes effect between its start time minus t
# and its finish time plus t"; that gloss widens by t at each end, i.e. it is our Γ/2.
#
# Algorithm: zones (Gibbons & Korach 1997; Golab, Li & Shah, "Analyzing consistency properties
# for fun and profit", PODC 2011). The cluster of value a is its write and the reads that
# returned a; F_a is the earliest finish and S_a the latest start in it. With unique values and
# no read preceding its own write, a history is linearizable iff no two clusters conflict, and
# widening only removes real-time precedences, so Γ is the largest of the per-pair and
# per-cluster thresholds:
#   pair (a, b):  chi = max(0, min(S_a - F_b, S_b - F_a))
#     (one of the clusters must go entirely first; "a first" needs no op of b to precede an op
#     of a, i.e. S_a - F_b <= Γ). This equals Golab et al.'s chi for crossing forward zones
#     (their overlap) and for a backward zone inside a forward one; for one forward zone nested
#     in another the overlap would understate it, so we use the pairwise form everywhere.
#   cluster a:    max(0, max over reads r of a of s(w_a) - f(r))   (a read ending before its
#     own write began).
# min(S_a - F_b, S_b - F_a) is S_a - F_b exactly when S_a + F_a <= S_b + F_b, so after sorting
# clusters by S + F one prefix maximum of S and one suffix minimum of F give every cluster's
# score in O(n log n). Reads of None belong to the initial value's cluster, written at -inf.


@dataclass(frozen=True, slots=True)
class _Cluster:
    value: int | None
    earliest_finish: float  # F
    latest_start: float  # S
    own: float  # the read-before-its-write threshold


def _clusters(history: Iterable[Write | Read]) -> list[_Cluster]:
    written: dict[int, Write] = {}
    reads: dict[int | None, list[Read]] = defaultdict(list)
    key: str | None = None
    for op in history:
        if key is not None and op.key != key:
            raise ValueError(
                f"Γ is per key; this history has {key!r} and {op.key!r}: use gamma_per_key"
            )
        key = op.key
        if isinstance(op, Write):
            if op.value in written:
                raise ValueError(
                    f"value {op.value!r} written twice to {key!r}: Γ needs unique values"
                )
            written[op.value] = op
        else:
            reads[op.value].append(op)
    missing = [v for v in reads if v is not None and v not in written]
    if missing:
        raise ValueError(f"reads returned values no write in the history wrote: {missing[:5]!r}")
    clusters = []
    for value, w in written.items():
        rs = reads.get(value, [])
        clusters.append(
            _Cluster(
                value,
                min([w.end, *(r.end for r in rs)]),
                max([w.start, *(r.start for r in rs)]),
                max([0.0, *(w.start - r.end for r in rs)]),
            )
        )
    if reads.get(None):
        clusters.append(_Cluster(None, -math.inf, max(r.start for r in reads[None]), 0.0))
    return clusters


def gamma_per_value(history: Iterable[Write | Read]) -> dict[int | None, float]:
    """Per-value Γ scores of one key's history (seed 003 reports the share that is positive).

    A value's score is the largest threshold among the pairs and the cluster it takes part in,
    so ``gamma(history) == max(gamma_per_value(history).values())``; a positive score bounds
    how stale the reads of that value (or of a value it conflicts with) were. Times in, scores
    out, in the same unit (seconds). Raises ValueError for histories Γ is not defined on: a
    value written twice, a read of a value no write in the history wrote, or more than one key.
    """
    order = sorted(_clusters(history), key=lambda c: c.latest_start + c.earliest_finish)
    n = len(order)
    best_s_before = [-math.inf] * n
    for i in range(1, n):
        best_s_before[i] = max(best_s_before[i - 1], order[i - 1].latest_start)
    least_f_after = [math.inf] * n
    for i in range(n - 2, -1, -1):
        least_f_after[i] = min(least_f_after[i + 1], order[i + 1].earliest_finish)
    scores: dict[int | None, float] = {}
    for c, s_before, f_after in zip(order, best_s_before, least_f_after, strict=True):
        # as the later of a pair (partner has the larger S) and as the earlier one
        scores[c.value] = max(0.0, c.own, s_before - c.earliest_finish, c.latest_start - f_after)
    return scores


def gamma(history: Iterable[Write | Read]) -> float:
    """Γ of one key's history: the least Γ >= 0 making it linearizable (0: it already is).

    Every operation is widened to [start - Γ/2, end + Γ/2] (Golab et al., ICDCS 2014); see
    the notes above ``gamma_per_value`` for the exact zone algorithm, O(n log n).
    """
    return max(gamma_per_value(history).values(), default=0.0)


def gamma_per_key(ops: Iterable[Write | Read]) -> dict[str, float]:
    """Γ of each key's history in a trace that mixes keys."""
    by_key: dict[str, list[Write | Read]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    return {key: gamma(history) for key, history in by_key.items()}
