"""Figures for the chaos suite and the cost of the duplicate protections.

    .venv/bin/python benchmarks/chaos.py [--runs 200] [--size-mb 20] [--json out.json]

1. Runs the seeded chaos suite (the same runs as tests/chaos/test_chaos_embedded.py) and
   totals: runs, faults injected by kind, crashes and pauses by step, duplicates handled by
   each of the three methods, and differences from the sequential run (must be 0).
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

from cmr import logs
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


async def chaos_totals(runs: int, pool: object) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        data = edge_cases(Path(tmp) / "in")
        expected = {job: sequential(job, data, 3) for job in JOBS}
        totals: dict[str, Counter[str]] = {
            k: Counter() for k in ("injected", "crashes", "pauses", "duplicates")
        }
        differences = failures = 0

        async def one(seed: int) -> None:
            nonlocal differences, failures
            job = JOBS[seed % 2]
            out = Path(tmp) / f"out-{seed}"
            try:
                r = await chaos_run(  # type: ignore[arg-type]
                    job, data, out, seed=seed, pool=pool, reducers=3, shuffle=chaos_shuffle(seed)
                )
            except Exception:
                failures += 1
                return
            differences += len(diff_outputs(expected[job], read_output(out, 3)))
            totals["injected"].update(r.injected)
            totals["crashes"].update(r.crashes)
            totals["pauses"].update(r.pauses)
            totals["duplicates"].update(r.duplicates_handled)

        started = time.monotonic()
        for b in range(0, runs, 25):
            await asyncio.gather(*(one(s) for s in range(b, min(runs, b + 25))))
        return {
            "runs": runs,
            "seconds": round(time.monotonic() - started, 1),
            "jobs_failed": failures,
            "parts_differing": differences,
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
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    logs.configure(logging.CRITICAL)

    async def go() -> dict[str, object]:
        with cpu_pool(2) as pool:
            return {
                "chaos": await chaos_totals(args.runs, pool),
                "protection_cost": await protection_cost(args.size_mb, pool),
            }

    result = asyncio.run(go())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
