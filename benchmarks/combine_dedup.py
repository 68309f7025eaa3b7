"""combine's cost when it does not shrink a key's values: one map task and one reduce task
over VALUES values of one key, with a combiner that drops duplicates (DISTINCT of them).

    PYTHONPATH=. .venv/bin/python benchmarks/combine_dedup.py [--values 200000] [--distinct 1000]

Runs cmr.cpu's map and reduce halves in this process (no backend, no queues): the time
is the combining's. Before combine was made linear (issue 13) a key past 64 values was
re-combined for every value added, so this took time quadratic in --values.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import msgpack

from cmr.cpu.mapping import run_map
from cmr.cpu.reducing import run_reduce
from cmr.cpu.specs import MapSpec, ReduceSpec
from cmr.job import JobRef
from tests.engine.test_combine_linear import DEDUP as JOB  # the test's job, one copy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", type=int, default=200_000)
    ap.add_argument("--distinct", type=int, default=1_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        job = Path(d, "distinct.py")
        job.write_text(JOB.format(distinct=args.distinct))
        ref = JobRef.parse(str(job))
        data = "".join(f"{i}\n" for i in range(args.values)).encode()
        spec = MapSpec("20260101-000000-00000000000000cc", 0, "a1", 1, 256 * 1024, d)
        t = time.perf_counter()
        mapped = run_map(ref, {}, [("in.txt", data)], spec)
        map_s = time.perf_counter() - t
        assert not mapped.error, mapped.error
        os.unlink(mapped.spool)
        spool = Path(d, "spool")
        packer = msgpack.Packer(use_bin_type=True)
        spool.write_bytes(
            b"".join(packer.pack(("k", i % args.distinct)) for i in range(args.values))
        )
        t = time.perf_counter()
        reduced = run_reduce(
            ref, {}, [str(spool)], ReduceSpec(spec.job, str(Path(d, "out")), 1 << 30, d)
        )
        reduce_s = time.perf_counter() - t
        assert not reduced.error, reduced.error
        print(
            f"values={args.values} distinct={args.distinct}  map {map_s:.2f} s  "
            f"reduce {reduce_s:.2f} s"
        )


if __name__ == "__main__":
    main()
