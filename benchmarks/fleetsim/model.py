"""Measured per-worker rates multiplied out to a fleet, next to AWS's limits."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.fleetsim.latency import Latency, injected_mean_ms
from benchmarks.fleetsim.limits import AWS_LIMITS
from benchmarks.fleetsim.meter import item_bytes, read_units, write_units
from benchmarks.fleetsim.run import RunStats
from cmr.records import MapCommit


@dataclass
class FleetRow:
    what: str
    per_worker: float  # per second
    fleet: float  # per second, for the whole fleet
    limit: float | None
    limit_key: str
    note: str = ""

    @property
    def headroom(self) -> float | None:
        if self.limit is None or self.fleet <= 0:
            return None
        return self.limit / self.fleet


def extrapolate(stats: RunStats, fleet_nodes: int) -> list[FleetRow]:
    """Per-worker rates of one measured run, times ``fleet_nodes``, next to the limits.

    Rates a whole fleet puts on *one job's* keys and queues: every worker serves the same
    job, as a fleet on one big job does. The job shape (tasks per worker, partitions,
    task duration) is the measured run's.
    """
    n, secs = stats.workers, stats.seconds
    per = 1.0 / (n * secs)  # per worker per second
    f = stats.fleet
    calls, keys, queues, prefixes = f["calls"], f["keys"], f["queues"], f["prefixes"]
    rows: list[FleetRow] = []

    def lim(key: str) -> float | None:
        v = AWS_LIMITS[key]["limit"]
        return None if v is None else float(v)

    for service in ("sqs", "s3", "dynamodb"):
        ops = {k: v for k, v in calls.items() if k.startswith(service + ".")}
        total = sum(ops.values())
        key = "sqs.standard.api_tps" if service == "sqs" else ""
        rows.append(
            FleetRow(
                f"{service}: all requests",
                total * per,
                total * per * fleet_nodes,
                lim(key) if key else None,
                key,
                ", ".join(
                    f"{op.split('.', 1)[1]} {v * per * fleet_nodes:,.0f}/s"
                    for op, v in sorted(ops.items(), key=lambda kv: -kv[1])[:4]
                ),
            )
        )
    # SQS: per queue. A partition queue's traffic is that of one of stats.reducers queues.
    for kind in ("input queue", "reduce queue", "partition queues"):
        mine = {k.split("|")[1]: v for k, v in queues.items() if k.startswith(kind + "|")}
        reqs = sum(v for k, v in mine.items() if k.startswith("sqs."))
        share = stats.reducers if kind == "partition queues" else 1
        label = "one partition queue" if kind == "partition queues" else kind
        empty = mine.get("empty receives", 0) * 100 / max(1, mine.get("sqs.ReceiveMessage", 0))
        rows.append(
            FleetRow(
                f"sqs: {label}, requests",
                reqs * per / share,
                reqs * per * fleet_nodes / share,
                None,
                "sqs.standard.api_tps",
                f"{empty:.0f}% of receives empty",
            )
        )
    rows.append(
        FleetRow(
            "sqs: messages in flight, one partition queue (peak, this job)",
            0.0,
            float(stats.max_in_flight) * fleet_nodes / n,
            lim("sqs.standard.in_flight"),
            "sqs.standard.in_flight",
            "batches are held in flight until the reducer commits; grows with map tasks "
            "(weak scaling: with the fleet)",
        )
    )
    # S3 by area: each area is one prefix tree; writes and reads separately.
    for area in sorted({k.split("|")[0] for k in prefixes}):
        reads = sum(
            v
            for k, v in prefixes.items()
            if k.startswith(area + "|") and k.split("|")[1] in ("s3.GetObject", "s3.HeadObject")
        )
        writes = sum(
            v
            for k, v in prefixes.items()
            if k.startswith(area + "|") and k.split("|")[1] in ("s3.PutObject", "s3.DeleteObjects")
        )
        if reads:
            rows.append(
                FleetRow(
                    f"s3: {area}, GET/HEAD",
                    reads * per,
                    reads * per * fleet_nodes,
                    lim("s3.prefix.read"),
                    "s3.prefix.read",
                    "one prefix before S3 partitions it further",
                )
            )
        if writes:
            rows.append(
                FleetRow(
                    f"s3: {area}, PUT/DELETE",
                    writes * per,
                    writes * per * fleet_nodes,
                    lim("s3.prefix.write"),
                    "s3.prefix.write",
                    "one prefix before S3 partitions it further",
                )
            )
    # DynamoDB: per key kind (all job#<id> kinds share one partition key), and the table.
    kinds = sorted({k.rsplit("|", 1)[0] for k in keys})
    job_pk_rcu = job_pk_wcu = 0.0
    for kind in kinds:
        rcu, wcu = keys.get(f"{kind}|rcu", 0.0), keys.get(f"{kind}|wcu", 0.0)
        if kind.startswith("job#"):
            job_pk_rcu += rcu
            job_pk_wcu += wcu
        for units, label, key in ((rcu, "RCU", "partition.rcu"), (wcu, "WCU", "partition.wcu")):
            if units:
                ops = keys.get(f"{kind}|{'reads' if label == 'RCU' else 'writes'}", 0)
                rows.append(
                    FleetRow(
                        f"dynamodb: {kind}, {label}",
                        units * per,
                        units * per * fleet_nodes,
                        lim("dynamodb." + key),
                        "dynamodb." + key,
                        f"{ops * per * fleet_nodes:,.0f} requests/s",
                    )
                )
    for units, label, key in (
        (job_pk_rcu, "RCU", "partition.rcu"),
        (job_pk_wcu, "WCU", "partition.wcu"),
    ):
        rows.append(
            FleetRow(
                f"dynamodb: partition key job#<id> (all of one job's records), {label}",
                units * per,
                units * per * fleet_nodes,
                lim("dynamodb." + key),
                "dynamodb." + key,
                "one item collection; DynamoDB may split it by sort key, never below one item",
            )
        )
    rcu_all = sum(v for k, v in keys.items() if k.endswith("|rcu"))
    wcu_all = sum(v for k, v in keys.items() if k.endswith("|wcu"))
    rows.append(
        FleetRow(
            "dynamodb: whole table, RCU",
            rcu_all * per,
            rcu_all * per * fleet_nodes,
            lim("dynamodb.table.rru"),
            "dynamodb.table.rru",
        )
    )
    rows.append(
        FleetRow(
            "dynamodb: whole table, WCU",
            wcu_all * per,
            wcu_all * per * fleet_nodes,
            lim("dynamodb.table.wru"),
            "dynamodb.table.wru",
        )
    )
    return rows


def commit_item_bytes(partitions: int) -> int:
    """Size of one map commit record when the task's output reaches every partition."""
    commit = MapCommit(
        "0" * 12, dict.fromkeys(range(partitions), 1), dict.fromkeys(range(partitions), 100)
    )
    return item_bytes({**commit.to_item(), "pk": "job#20261121-000000-abcdef", "sk": "map#0000000"})


def fleet_model(stats: RunStats, nodes: int, partitions: int, latency: Latency) -> list[FleetRow]:
    """The same fleet, but with the job's partition count scaled too (``partitions``).

    Per map task the protocol sends at least one batch to every partition and writes one
    commit record listing its batch count for each; every reducer reads every commit
    (its winner polling re-reads the whole map# prefix). Those costs grow with the
    partition count, which the measured run (``stats.reducers`` partitions) cannot show by
    multiplication. Measured inputs: map tasks per second per worker, job-record writes per
    task, winner-polling queries per reducer per second, map tasks per worker.
    """
    n, secs = stats.workers, stats.seconds
    keys = stats.fleet["keys"]
    tasks_s = stats.map_rate * nodes / n  # fleet map tasks per second, at the map phase's pace
    maps = stats.maps * nodes // n  # map tasks of the weak-scaled job
    job_wcu_per_task = keys.get("job#<id> / job (the job record)|wcu", 0.0) / stats.maps
    queries_per_reducer_s = keys.get("job#<id> / map#*|queries", 0.0) / (stats.reducers * secs)
    commit = commit_item_bytes(partitions)
    commit_wcu = write_units(commit)
    query_rcu = read_units(maps * commit, consistent=True)
    drain_per_s = 10 / (injected_mean_ms("sqs.ReceiveMessage", latency) / 1000)
    sqs_lim = AWS_LIMITS["sqs.standard.in_flight"]["limit"]
    wcu_lim = float(AWS_LIMITS["dynamodb.partition.wcu"]["limit"])
    rcu_lim = float(AWS_LIMITS["dynamodb.partition.rcu"]["limit"])
    table_lim = float(AWS_LIMITS["dynamodb.table.rru"]["limit"])
    return [
        FleetRow(
            "map tasks per second (fleet)",
            tasks_s / nodes,
            tasks_s,
            None,
            "",
            f"{maps:,} map tasks per job, {partitions:,} partitions",
        ),
        FleetRow(
            "sqs: SendMessageBatch (>= 1 batch per partition per map task)",
            tasks_s * partitions / nodes,
            tasks_s * partitions,
            None,
            "sqs.standard.api_tps",
            f"${tasks_s * partitions * 3600 * 0.40 / 1e6:,.0f}/hour at $0.40 per million",
        ),
        FleetRow(
            "sqs: batches arriving at one partition queue per second",
            0.0,
            tasks_s,
            drain_per_s,
            "",
            f"one reader drains <= 10 per ReceiveMessage: ~{drain_per_s:,.0f}/s at the "
            "injected latency",
        ),
        FleetRow(
            "sqs: messages in flight in one partition queue (held until its reducer commits)",
            0.0,
            float(maps),
            None if sqs_lim is None else float(sqs_lim),
            "sqs.standard.in_flight",
            "one batch per map task at least",
        ),
        FleetRow(
            "dynamodb: job record item, WCU (counters, ~1 write per task)",
            tasks_s * job_wcu_per_task / nodes,
            tasks_s * job_wcu_per_task,
            wcu_lim,
            "dynamodb.partition.wcu",
            "one item: no split can spread it",
        ),
        FleetRow(
            f"dynamodb: map commits, WCU ({commit:,} B each)",
            tasks_s * commit_wcu / nodes,
            tasks_s * commit_wcu,
            wcu_lim,
            "dynamodb.partition.wcu",
            "items of one partition key; adaptive capacity may isolate items",
        ),
        FleetRow(
            "dynamodb: reducers re-reading all map commits, RCU",
            0.0,
            partitions * queries_per_reducer_s * query_rcu,
            table_lim,
            "dynamodb.table.rru",
            f"{query_rcu:,.0f} RCU per full read ({maps:,} x {commit:,} B), "
            f"{queries_per_reducer_s:.2f} reads per reducer per s (measured); per partition "
            f"limit {rcu_lim:,.0f}",
        ),
    ]
