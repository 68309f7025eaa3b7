"""Fleet scaling in simulation: N workers on one embedded backend with real service latencies.

    .venv/bin/python benchmarks/fleet_sim.py [--workers 1,2,4,8,16,32,64] [--tasks-per-worker 8]
        [--reducers 8] [--work-ms 1000] [--latency-scale 1.0] [--repeat 1] [--fleet 1000]
        [--extrapolate-work-ms 0] [--json out.json]

Every worker is a real ``cmr.worker.Worker`` (the loop ``cmr worker`` runs: 2 map slots,
2 reduce slots, its own CPU pool) serving jobs from the table as a fleet node does; all of
them share ONE embedded backend in this process, as ``cmr.testing.chaos_run`` does, but each
reaches it through a wrapper of its own that (1) sleeps an injected latency drawn per
service and operation before every call and (2) counts the calls it makes, by operation, by
queue, by table key, with the DynamoDB capacity units they would consume. The job is weak
scaled: ``tasks-per-worker x N`` map tasks of tiny input (so this 2-core machine's CPU is not
what is measured: the coordination protocol is), ``--reducers`` partitions. ``--work-ms``
models each map task's compute as a sleep in the pool thread (no CPU used), for realistic
task durations. Output is checked exactly against a sequential run.

Per N it prints wall time, map tasks/s and pairs/s, speed-up and efficiency against N=1,
requests by service and per second, the event loop's CPU use and lag (to tell a saturated
simulator from a protocol bottleneck) and where the workers' time goes. Then it multiplies
the measured per-worker rates out to a ``--fleet``-node fleet and prints them next to AWS's
published limits (``AWS_LIMITS``), per service, per operation and per hot key.

Latencies (``LATENCY_MS``: median and 99th percentile per operation, log-normal between
them), from published measurements:

* SQS. Amazon's own re-measurement of SQS for the Stony Brook "Cloud Performance Benchmark
  Series" (revised July 2012): "The time to send a 1KB message is reduced from the 400ms in
  the original measurement to 16ms" (https://paperzz.com/doc/8847683/cloud-performance-benchmark-series).
  SoftwareMill's 2017 benchmark (1-12 m4.2xlarge nodes, batches of 10) has tail latencies
  near 100 ms (https://softwaremill.com/amazon-sqs-performance-latency/). We take a median of
  20 ms and p99 of 80 ms for send/receive, 15/60 ms for delete and visibility changes.
* S3. AWS's performance guide: for small requests (under 512 KB) "median latencies are
  often in the tens of milliseconds range"
  (https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-practices/timeouts-and-retries-for-latency-sensitive-applications.html).
  GET 30/120 ms, PUT 50/200 ms.
* DynamoDB. AWS: "For most atomic operations, such as GetItem and PutItem, you can expect an
  average latency in single-digit milliseconds" (service side;
  https://repost.aws/knowledge-center/dynamodb-high-latency); client-measured 10-20 ms is
  also reported (https://dynobase.dev/dynamodb-performance-latency/). 7/25 ms per item
  operation, 9/30 ms per Query.
* The seeds (../shared/seeds/000, 002) measured SimpleDB, the 2009 store: reads 16-23 ms,
  writes 56-118 ms. DynamoDB replaced it; its figures above are lower.

Limits (``AWS_LIMITS``), each with its source URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cmr
import cmr.logs
from benchmarks.fleetsim.latency import Latency
from benchmarks.fleetsim.limits import AWS_LIMITS
from benchmarks.fleetsim.model import extrapolate, fleet_model
from benchmarks.fleetsim.report import (
    fleet_table,
    limits_table,
    ops_table,
    scaling_table,
    time_table,
)
from benchmarks.fleetsim.run import RunStats, scaling_point


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "?"


async def main_async(args: argparse.Namespace) -> int:
    latency = Latency(scale=args.latency_scale, seed=args.seed)
    counts = [int(x) for x in args.workers.split(",")]
    print(f"load average before: {load_average()}  (cores: {os.cpu_count()})")
    results: list[RunStats] = []
    with tempfile.TemporaryDirectory(prefix="cmr-fleet-sim-") as tmp:
        work = Path(tmp)
        for n in counts:
            trials = []
            for _ in range(args.repeat):
                r = await scaling_point(
                    n,
                    work,
                    tasks_per_worker=args.tasks_per_worker,
                    reducers=args.reducers,
                    latency=latency,
                    work_ms=args.work_ms,
                )
                trials.append(r)
                print(
                    f"N={n:3d}: maps done {r.map_seconds:6.2f} s ({r.map_rate:6.1f} tasks/s), "
                    f"job {r.seconds:6.2f} s, cleanup {r.cleanup_seconds:4.1f} s, "
                    f"sim CPU {r.cpu_ms_per_task:4.1f} ms/task  "
                    f"loop CPU {r.loop_cpu:.2f}  lag p99 {r.lag_ms_p99:.0f} ms  "
                    f"exact={'yes' if r.exact else 'NO ' + '; '.join(r.problems[:2])}",
                    flush=True,
                )
            results.append(min(trials, key=lambda r: r.seconds))
        extra: RunStats | None = None
        if args.extrapolate_work_ms is not None:
            extra = await scaling_point(
                counts[-1],
                work,
                tasks_per_worker=args.tasks_per_worker,
                reducers=args.reducers,
                latency=latency,
                work_ms=args.extrapolate_work_ms,
            )
            print(
                f"N={counts[-1]} with {args.extrapolate_work_ms:.0f} ms modelled compute per "
                f"task: {extra.seconds:.2f} s, {extra.tasks_per_s:.1f} tasks/s, "
                f"exact={'yes' if extra.exact else 'NO'}"
            )
    print(f"load average after: {load_average()}")
    print("\n## Scaling (weak: map tasks = tasks-per-worker x N)\n")
    print(scaling_table(results))
    print("\n## Mean ms per call seen by the workers (injected mean in brackets)\n")
    print(time_table(results, latency))
    print(f"\n## Requests by operation, N={results[-1].workers}\n")
    print(ops_table(results[-1]))
    for r in [results[-1], *([extra] if extra else [])]:
        print(
            f"\n## {args.fleet:,} workers, from N={r.workers} with {r.work_ms:.0f} ms modelled "
            f"compute per map task ({r.tasks_per_s / r.workers:.2f} map tasks/s per worker, "
            f"{r.reducers} partitions)\n"
        )
        print(fleet_table(extrapolate(r, args.fleet), args.fleet))
        for parts in args.fleet_reducers:
            print(
                f"\n### The same fleet with {parts:,} partitions "
                f"(modelled from the N={r.workers} run)\n"
            )
            print(fleet_table(fleet_model(r, args.fleet, parts, latency), args.fleet))
    print("\n## Published limits used\n")
    print(limits_table())
    if args.json:
        payload = {
            "load_average": load_average(),
            "latency_ms": latency.table,
            "latency_scale": latency.scale,
            "runs": [asdict(r) for r in results],
            "extrapolation_run": asdict(extra) if extra else None,
            "limits": AWS_LIMITS,
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0 if all(r.exact for r in [*results, *([extra] if extra else [])]) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--workers", default="1,2,4,8,16,32,64")
    p.add_argument("--tasks-per-worker", type=int, default=8)
    p.add_argument("--reducers", type=int, default=8)
    p.add_argument(
        "--work-ms", type=float, default=1000.0, help="modelled compute per map task (0: none)"
    )
    p.add_argument("--latency-scale", type=float, default=1.0, help="0: no injected latency")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1, help="trials per N; the fastest is kept")
    p.add_argument("--fleet", type=int, default=1000, help="workers to extrapolate to")
    p.add_argument(
        "--extrapolate-work-ms",
        type=float,
        default=None,
        help="also run the largest N with this much compute per task and extrapolate it",
    )
    p.add_argument(
        "--fleet-reducers",
        default="1000",
        help="partition counts to model for the fleet (comma list; 0: none)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.fleet_reducers = [int(x) for x in args.fleet_reducers.split(",") if int(x) > 0]
    cmr.logs.configure()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
