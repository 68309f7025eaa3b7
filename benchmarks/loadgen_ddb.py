"""Load generator benchmark: ops/s one cmr worker process sustains against the local stack's
DynamoDB (moto's server, an emulator: its figures are never DynamoDB's), next to a plain
100-thread boto3 driver (the seeds' method), measured in the same run.

    scripts/setup.sh loadgen                # the load generator's extra (dev has it too)
    eval "$(scripts/stack.sh env)"
    .venv/bin/python benchmarks/loadgen_ddb.py [--duration 15] [--repeat 3] [--items 1000]
        [--threads 100] [--json out.json]

Each round runs, one after the other (interleaved, so drift in the machine or in the
server hits both sides alike):

- **plain**: a fresh Python process with ``threads`` OS threads sharing one boto3 DynamoDB
  client (``max_pool_connections=threads``, retries off): half call GetItem, half PutItem, on
  random keys of ``items``, closed loop, for ``duration`` seconds. Ops/s = completed
  operations / wall seconds of the load phase; CPU per op = ``time.process_time()`` of that
  process over the load phase / operations.
- **cmr**: ``cmr loadgen jam --target dynamodb --tasks 1 --readers R --writers W --items K
  --duration D --workers 1`` (embedded engine; the one map task runs in the job's one pool
  process, with R + W asyncio operators on aiobotocore). Ops/s = ok operations /
  ``duration_s`` of its JSON; CPU per op = its ``client_cpu.cpu_per_op_us`` (the pool
  process's ``process_time`` over the load phase). Also recorded: the whole command's wall
  time and CPU (start-up, engine, table create/delete included).

Both sides use their own fresh table (on-demand) with no items in it at the start, so early
gets find nothing, alike on both sides. The DynamoDB server's own CPU over each run is read
from ``/proc`` when its process can be found (it runs on the same machine and is part of the load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CMR = str(Path(sys.executable).with_name("cmr"))


@dataclass
class Row:
    side: str  # "plain" or "cmr"
    round: int
    ops: int
    errors: int
    load_s: float
    ops_s: float
    cpu_ms_per_op: float
    server_cpu_s: float | None
    command_wall_s: float
    command_cpu_s: float  # every process of the command, start-up and teardown included
    command_cpu_ms_per_op: float
    loadavg_1m: float  # before the run: other work on the machine competes for the cores
    warnings: list[str]


# --------------------------------------------------------------------------- plain driver


def _client(threads: int) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        max_pool_connections=threads,
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=5,
        read_timeout=30,
    )
    return boto3.session.Session().client("dynamodb", config=config)


def plain(duration: float, threads: int, items: int) -> dict[str, Any]:
    """The plain driver, run in its own process (``--plain`` below); returns its counts."""
    client = _client(threads)
    table = f"cmr-bench-plain-{uuid.uuid4().hex[:10]}"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table)
    keys = [f"item-{i}" for i in range(items)]
    counts = [[0, 0] for _ in range(threads)]  # [ok, errors] per thread
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def worker(n: int) -> None:
        rng = random.Random(n)
        getter = n % 2 == 0
        value = 0
        start.wait()
        end = stop_at[0]
        while time.perf_counter() < end:
            key = {"k": {"S": rng.choice(keys)}}
            try:
                if getter:
                    client.get_item(TableName=table, Key=key)
                else:
                    value += 1
                    client.put_item(TableName=table, Item={**key, "v": {"N": str(value)}})
                counts[n][0] += 1
            except Exception:  # counted, never hidden: errors are reported
                counts[n][1] += 1

    pool = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
    for t in pool:
        t.start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    stop_at[0] = wall0 + duration
    start.wait()
    for t in pool:
        t.join()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    client.delete_table(TableName=table)
    ok, errors = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return {"ops": ok, "errors": errors, "load_s": wall, "cpu_s": cpu}


# --------------------------------------------------------------------------- measurement


def _server_pid() -> int | None:
    """The stack's DynamoDB server (scripts/dynamodb_server.py), found by its command line
    (read-only use of /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"dynamodb_server.py" in cmdline:
            return int(entry.name)
    return None


def _proc_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    cpu0, wall0 = _children_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc, time.perf_counter() - wall0, _children_cpu_s() - cpu0


def run_plain(n: int, args: argparse.Namespace, ddb: int | None) -> Row:
    cmd = [sys.executable, __file__, "--plain", "--duration", str(args.duration),
           "--threads", str(args.threads), "--items", str(args.items)]  # fmt: skip
    load, d0 = os.getloadavg()[0], _proc_cpu_s(ddb)
    proc, wall, cpu = _run(cmd)
    d1 = _proc_cpu_s(ddb)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Row(
        side="plain",
        round=n,
        ops=out["ops"],
        errors=out["errors"],
        load_s=out["load_s"],
        ops_s=out["ops"] / out["load_s"],
        cpu_ms_per_op=1000 * out["cpu_s"] / max(out["ops"], 1),
        server_cpu_s=None if d0 is None or d1 is None else d1 - d0,
        command_wall_s=wall,
        command_cpu_s=cpu,
        command_cpu_ms_per_op=1000 * cpu / max(out["ops"], 1),
        loadavg_1m=load,
        warnings=[],
    )


def cmr_command(args: argparse.Namespace, json_path: str) -> list[str]:
    readers = args.threads - args.threads // 2
    return [CMR, "loadgen", "jam", "--target", "dynamodb", "--tasks", "1",
            "--readers", str(readers), "--writers", str(args.threads // 2),
            "--items", str(args.items), "--duration", str(args.duration), "--workers", "1",
            "--no-progress", "--json", json_path]  # fmt: skip


def run_cmr(n: int, args: argparse.Namespace, ddb: int | None) -> Row:
    with tempfile.TemporaryDirectory(prefix="cmr-bench-") as tmp:
        path = str(Path(tmp) / "jam.json")
        load, d0 = os.getloadavg()[0], _proc_cpu_s(ddb)
        _, wall, cpu = _run(cmr_command(args, path))
        d1 = _proc_cpu_s(ddb)
        data = json.loads(Path(path).read_text())
    ok = sum(int(o["ok"]) for o in data["ops"])
    errors = sum(int(o["count"]) - int(o["ok"]) for o in data["ops"])
    return Row(
        side="cmr",
        round=n,
        ops=ok,
        errors=errors,
        load_s=float(data["duration_s"]),
        ops_s=ok / float(data["duration_s"]),
        cpu_ms_per_op=float(data["client_cpu"]["cpu_per_op_us"]) / 1000,
        server_cpu_s=None if d0 is None or d1 is None else d1 - d0,
        command_wall_s=wall,
        command_cpu_s=cpu,
        command_cpu_ms_per_op=1000 * cpu / max(ok, 1),
        loadavg_1m=load,
        warnings=list(data.get("warnings") or []),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load per run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (plain, then cmr, each)")
    ap.add_argument("--threads", type=int, default=100, help="plain threads = cmr operators")
    ap.add_argument("--items", type=int, default=1000, help="distinct keys")
    ap.add_argument("--json", type=Path, help="also write every row here")
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain:
        print(json.dumps(plain(args.duration, args.threads, args.items)))
        return
    if not os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
        sys.exit('no AWS_ENDPOINT_URL_DYNAMODB: run eval "$(scripts/stack.sh env)" first')
    ddb = _server_pid()
    rows: list[Row] = []
    for n in range(1, args.repeat + 1):
        for run in (run_plain, run_cmr):
            row = run(n, args, ddb)
            rows.append(row)
            print(
                f"round {n} {row.side:5}: {row.ops_s:8.0f} ops/s  {row.cpu_ms_per_op:6.3f} "
                f"ms CPU/op  errors {row.errors}  server CPU "
                f"{row.server_cpu_s if row.server_cpu_s is not None else float('nan'):.1f}"
                f" s  command {row.command_wall_s:.1f} s wall, {row.command_cpu_s:.1f} s CPU"
                f" ({row.command_cpu_ms_per_op:.3f} ms/op)  load avg {row.loadavg_1m:.2f}"
                + "".join(f"\n    warning: {w}" for w in row.warnings),
                flush=True,
            )
    print("\nbest of", args.repeat, "(highest ops/s):")
    for side in ("plain", "cmr"):
        best = max((r for r in rows if r.side == side), key=lambda r: r.ops_s)
        print(f"  {side:5}: {best.ops_s:8.0f} ops/s  {best.cpu_ms_per_op:.3f} ms CPU/op")
    if args.json:
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.platform()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "dynamodb": "moto 5.2.5 (scripts/dynamodb_server.py): an emulator's figures",
            "cmr_command": " ".join(cmr_command(args, "JSON")),
            "args": {k: v for k, v in vars(args).items() if k not in ("json", "plain")},
        }
        args.json.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
