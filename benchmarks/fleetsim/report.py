"""The tables fleet_sim prints."""

from __future__ import annotations

from benchmarks.fleetsim.latency import Latency, injected_mean_ms
from benchmarks.fleetsim.limits import AWS_LIMITS
from benchmarks.fleetsim.model import FleetRow
from benchmarks.fleetsim.run import RunStats


def _service_calls(calls: dict[str, int], service: str) -> int:
    return sum(v for k, v in calls.items() if k.startswith(service + "."))


def scaling_table(rows: list[RunStats]) -> str:
    base = rows[0]
    lines = [
        "| N | map tasks | maps done (s) | map tasks/s | pairs/s | speed-up | efficiency | "
        "job (s) | job tasks/s | sqs | s3 | dynamodb | req/s | sim CPU ms/task | "
        "sim cores | lag p99 ms | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        speed = r.map_rate / base.map_rate
        c = r.fleet["calls"]
        sqs, s3, ddb = (_service_calls(c, s) for s in ("sqs", "s3", "dynamodb"))
        lines.append(
            f"| {r.workers} | {r.maps} | {r.map_seconds:.2f} | {r.map_rate:.1f} | "
            f"{r.pairs_per_s:,.0f} | {speed:.2f} | {speed / (r.workers / base.workers):.0%} | "
            f"{r.seconds:.2f} | {r.tasks_per_s:.1f} | "
            f"{sqs:,} | {s3:,} | {ddb:,} | {(sqs + s3 + ddb) / r.seconds:,.0f} | "
            f"{r.cpu_ms_per_task:.1f} | {r.loop_cpu:.2f} | {r.lag_ms_p99:.0f} | "
            f"{'yes' if r.exact else 'NO'} |"
        )
    return "\n".join(lines)


INFLATION_OPS = (
    "sqs.SendMessageBatch",
    "sqs.DeleteMessageBatch",
    "s3.GetObject",
    "dynamodb.GetItem",
    "dynamodb.PutItem",
    "dynamodb.UpdateItem",
)


def time_table(rows: list[RunStats], latency: Latency) -> str:
    """Mean time per call as the workers saw it, against the injected mean: a ratio well
    above 1 means calls waited for this process's event loop, i.e. the simulator (one
    process for all N nodes), not the protocol, is what slows down."""
    head = " | ".join(
        f"{op.split('.', 1)[1]} ({injected_mean_ms(op, latency):.0f})" for op in INFLATION_OPS
    )
    lines = [
        f"| N | {head} | reduce tail (s) |",
        "|---:|" + "---:|" * (len(INFLATION_OPS) + 1),
    ]
    for r in rows:
        cells = []
        for op in INFLATION_OPS:
            n = r.fleet["calls"].get(op, 0)
            cells.append(f"{r.fleet['busy_s'].get(op, 0) * 1000 / n:.0f}" if n else "-")
        lines.append(
            f"| {r.workers} | " + " | ".join(cells) + f" | {r.seconds - r.map_seconds:.2f} |"
        )
    return "\n".join(lines)


def ops_table(r: RunStats) -> str:
    calls = r.fleet["calls"]
    lines = ["| operation | requests | per map task | per worker per s |", "|---|---:|---:|---:|"]
    for op, v in sorted(calls.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {op} | {v:,} | {v / r.maps:.2f} | {v / r.workers / r.seconds:.2f} |")
    return "\n".join(lines)


def fleet_table(rows: list[FleetRow], nodes: int) -> str:
    lines = [
        f"| what | per worker /s | {nodes:,} workers /s | published limit | headroom | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        limit = (
            "nearly unlimited"
            if row.limit is None and row.limit_key == "sqs.standard.api_tps"
            else ("-" if row.limit is None else f"{row.limit:,.0f}")
        )
        head = row.headroom
        room = "-" if head is None else (f"**{head:.2g}x**" if head < 1 else f"{head:,.1f}x")
        per = f"{row.per_worker:,.2f}" if row.per_worker else "-"
        lines.append(f"| {row.what} | {per} | {row.fleet:,.0f} | {limit} | {room} | {row.note} |")
    return "\n".join(lines)


def limits_table() -> str:
    lines = ["| limit | value | source |", "|---|---:|---|"]
    for lim in AWS_LIMITS.values():
        v = lim["limit"]
        lines.append(f"| {lim['what']} | {'-' if v is None else f'{v:,}'} | {lim['source']} |")
    return "\n".join(lines)
