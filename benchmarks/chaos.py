"""Figures for the chaos suite and the cost of the duplicate protections.

    .venv/bin/python benchmarks/chaos.py [--runs 200] [--clientless-runs 200] [--size-mb 20]
        [--no-cost] [--json out.json]

1. Runs the seeded chaos suite (the same runs as tests/chaos/test_chaos_embedded.py, on its
   virtual clock; half of them through the blob shuffle, half through queues; seeds from
   1000 with nobody waiting) and totals: runs, faults injected by kind, crashes and pauses by
   step, duplicates handled by each of the three methods, and per kind of run the jobs that
   failed, parts differing from the sequential run and runs that left anything (all must be 0).
2. Word count MB/s on the embedded backend with no faults, then with 10% and 30% of
   deliveries and sends duplicated, all in the same sitting on the same corpus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmr import logs, virtualtime
from cmr.api import cpu_pool
from cmr.backends.faults import FaultPlan
from cmr.testing import chaos_run, chaos_shuffle, diff_outputs, read_output, sequential
from tests.engine.corpus import edge_cases

JOBS = ("examples/wordcount.py", "examples/invertedindex.py")


def corpus(path: Path, size_mb: float, seed: int = 5) -> Path:
    rnd = random.Random(seed)
    vocab = [f"w{i}" for i in range(20_000)]
    path.mkdir(parents=True, exist_ok=True)
    target = int(size_mb * 1e6 / 4)
    for i in range(4):
        lines, size = [], 0
        while size < target:
            line = " ".join(rnd.choices(vocab, k=12))
            lines.append(line)
            size += len(line) + 1
        (path / f"part{i}.txt").write_text("\n".join(lines) + "\n")
    return path


CLIENTLESS_FROM = 1000  # as in tests/chaos/test_chaos_embedded.py: seeds from here run clientless
CLIENTLESS_BEYOND = 1_000_000  # runs with a client past the suite's 1,000 take seeds from here


async def chaos_totals(runs: int, clientless_runs: int, pool: object) -> dict[str, object]:
    """The suite's runs, more of them: seeds 0.. with a watching client, seeds 1000.. with
    nobody waiting; half of each through the blob shuffle (chaos_shuffle). Totals per kind
    (client or clientless, queue or blob): runs, jobs that raised or did not succeed, parts
    differing from the sequential run, runs that left anything behind."""
    with tempfile.TemporaryDirectory() as tmp:
        data = edge_cases(Path(tmp) / "in")
        expected = {job: sequential(job, data, 3) for job in JOBS}
        totals: dict[str, Counter[str]] = {
            k: Counter() for k in ("injected", "crashes", "pauses", "duplicates")
        }
        kinds: dict[str, Counter[str]] = {}
        bad: list[str] = []

        async def one(seed: int, clientless: bool) -> None:
            job = JOBS[seed % 2]
            shuffle = chaos_shuffle(seed)
            kind = kinds.setdefault(
                f"{'clientless' if clientless else 'client'}/{shuffle}", Counter()
            )
            kind["runs"] += 1
            out = Path(tmp) / f"out-{seed}"
            try:
                r = await chaos_run(  # type: ignore[arg-type]
                    job, data, out, seed=seed, pool=pool, reducers=3, shuffle=shuffle,
                    clientless=clientless,
                )  # fmt: skip
            except Exception as exc:
                kind["jobs_failed"] += 1
                bad.append(f"seed {seed}: {type(exc).__name__}: {exc}")
                return
            differing = len(diff_outputs(expected[job], read_output(out, 3)))
            kind["parts_differing"] += differing
            if r.record.get("state") != "succeeded":
                kind["not_succeeded"] += 1
                bad.append(f"seed {seed}: job ended {r.record.get('state')}")
            if r.leftovers:
                kind["left_something"] += 1
                bad.append(f"seed {seed}: left {r.leftovers}")
            if differing:
                bad.append(f"seed {seed}: {differing} parts differ")
            totals["injected"].update(r.injected)
            totals["crashes"].update(r.crashes)
            totals["pauses"].update(r.pauses)
            totals["duplicates"].update(r.duplicates_handled)

        # The suite's seeds first (0.. with a client, 1000.. clientless); past them, seeds
        # of no one else's (a seed runs once: its output directory is its own).
        seeds = [(s if s < CLIENTLESS_FROM else CLIENTLESS_BEYOND + s, False) for s in range(runs)]
        seeds += [(CLIENTLESS_FROM + s, True) for s in range(clientless_runs)]
        started = time.monotonic()
        for b in range(0, len(seeds), 25):
            # On the virtual clock, as the suite runs them: lease waits cost nothing.
            await asyncio.gather(*(one(s, c) for s, c in seeds[b : b + 25]))
        return {
            "runs": len(seeds),
            "seconds": round(time.monotonic() - started, 1),
            "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(kinds.items())},
            "problems": bad,
            **{k: dict(sorted(v.items())) for k, v in totals.items()},
        }


async def protection_cost(size_mb: float, pool: object, repeat: int = 3) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(Path(tmp) / "in", size_mb)
        expected = sequential(JOBS[0], data, 4)
        for rate in (0.0, 0.1, 0.3):
            plan = FaultPlan(seed=1, duplicate_delivery=rate, duplicate_send=rate)
            best = None
            for attempt in range(repeat):  # best of N: the first also warms caches
                out = Path(tmp) / f"out-{rate}-{attempt}"
                started = time.monotonic()
                r = await chaos_run(
                    JOBS[0],
                    data,
                    out,
                    seed=1,
                    pool=pool,
                    plan=plan,  # type: ignore[arg-type]
                    hooks=[None, None],
                    workers=2,
                    reducers=4,
                    split_bytes=None,
                    visibility_s=30,
                )
                secs = time.monotonic() - started
                row = {
                    "duplicates": rate,
                    "seconds": round(secs, 2),
                    "mb_s": round(size_mb / secs, 2),
                    "exact": not diff_outputs(expected, read_output(out, 4)),
                    "injected": dict(r.injected),
                    "handled": r.duplicates_handled,
                }
                if best is None or secs < best["seconds"]:
                    best = row
            rows.append(best)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="seeded runs with a watching client")
    ap.add_argument("--clientless-runs", type=int, default=200, help="and with nobody waiting")
    ap.add_argument("--no-cost", action="store_true", help="skip the protection-cost runs")
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    logs.configure(logging.CRITICAL)

    async def chaos(pool: object) -> dict[str, object]:
        return await chaos_totals(args.runs, args.clientless_runs, pool)

    with cpu_pool(2) as pool:
        result: dict[str, object] = {"chaos": virtualtime.run(chaos(pool))}
        if not args.no_cost:  # on the real clock: it measures MB/s
            result["protection_cost"] = asyncio.run(protection_cost(args.size_mb, pool))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
