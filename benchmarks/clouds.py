"""The same word count on the three backends in one sitting: embedded, the AWS stack
(LocalStack and moto's DynamoDB) and Azure (Azurite). Emulators' figures: what a run costs
in requests is the service's own; its seconds are this machine's, not a cloud's.

    scripts/stack.sh start
    .venv/bin/python benchmarks/clouds.py [--mb 20] [--repeats 2] [--workers 2]
        [--json F] [--markdown F]

Each run is ``cmr run examples/wordcount.py --store STORE --workers N`` in a process of its
own, the backends interleaved (a machine's speed drifts within a sitting). On the two
clouds every HTTP request of the run (the client's and its ``cmr worker`` processes')
goes through a counting proxy in this process (benchmarks/shuffle_wire.py's), named by
the service's operation: for Azure, Azure's REST operation names, as
:mod:`cmr.backends.azure.clients` names them. The input is the first ``--mb`` MB of the
real-text corpus (benchmarks/realtext.py); every run's output must equal a sequential
count of the same text.

Issue 30: after each run on a cloud, ``cmr status JOB --json`` (outside the proxies) reads
the job's cost (cmr.cost): its usage rows priced at the shipped table. The figures set the
dollars per GB beside the requests the proxies counted; the cost counts the job's requests,
the proxies every request of the processes (the fleet's own too: its polls of the active
index, its worker rows, the opening's probes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.shuffle_wire import Proxy, Tally, proxies, serving  # noqa: E402

GB = 1_000_000_000
AZURE_SERVICES = ("blob", "queue", "table")


def azure_name(service: str) -> Any:
    from cmr.backends.azure.clients import _operation

    def name(method: str, path: str, query: str, headers: Any, body: bytes) -> str:
        url = f"http://127.0.0.1{path}" + (f"?{query}" if query else "")
        return f"{service}.{_operation(service, method, url, headers)}"

    return name


@contextlib.contextmanager
def azure_proxies(conn: str) -> Iterator[tuple[Tally, str]]:
    """One counting proxy per Azure service, and the connection string that points at
    them (the account's path kept: Azurite's endpoints are http://host:port/ACCOUNT)."""
    from cmr.backends.azure.opening import endpoints

    tally = Tally()
    upstream = {s: urlsplit(u) for s, u in endpoints(conn).items()}
    made = [
        Proxy(f"{upstream[s].scheme}://{upstream[s].netloc}", tally, name=azure_name(s))
        for s in AZURE_SERVICES
    ]
    with serving(made):
        pairs = [p for p in conn.split(";") if not p.split("=", 1)[0].endswith("Endpoint")]
        for service, proxy in zip(AZURE_SERVICES, made, strict=True):
            path = upstream[service].path
            pairs.append(f"{service.capitalize()}Endpoint=http://127.0.0.1:{proxy.port}{path}")
        yield tally, ";".join(pairs)


@dataclass
class Run:
    backend: str
    seconds: float
    ok: bool
    requests: dict[str, int]
    by_service: dict[str, int]
    per_gb: dict[str, int]
    cost_usd: float = 0.0  # the job's cost as `cmr status` prices it (issue 30)
    cost_per_gb_usd: float = 0.0
    cost_requests: int = 0  # the requests the job's usage rows count
    cost_by_service_usd: dict[str, float] | None = None
    worker_seconds: float = 0.0
    workers_usd: float = 0.0


def first_mb(src: Path, mb: float, dst: Path) -> Path:
    """The first ``mb`` MB of the corpus's files, whole lines, into ``dst``."""
    if dst.exists():
        return dst
    dst.mkdir(parents=True)
    left = int(mb * 1_000_000)
    for f in sorted(src.iterdir()):
        if left <= 0:
            break
        with f.open("rb") as fin, (dst / f.name).open("wb") as fout:
            chunk = fin.read(left)
            chunk += fin.readline()  # to the end of the line
            fout.write(chunk)
            left -= len(chunk)
    return dst


def sequential_count(data: Path) -> dict[str, str]:
    """The words of examples/wordcount.py (lines decoded with errors replaced, then
    ``str.split()``), counted in this process: the answer every run must give."""
    counts: Counter[str] = Counter()
    for f in sorted(data.iterdir()):
        counts.update(f.read_bytes().decode("utf-8", "replace").split())
    return {k: str(n) for k, n in counts.items()}


def output_of(out: Path) -> dict[str, str]:
    got: dict[str, str] = {}
    for part in sorted(out.glob("part-*")):
        for line in part.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            key, _, value = line.rpartition("\t")
            got[key] = value
    return got


def one_run(backend: str, data: Path, workers: int, scratch: Path, tag: str) -> tuple[Run, Path]:
    out = scratch / f"out-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    argv = [
        sys.executable, "-m", "cmr", "run", str(REPO / "examples" / "wordcount.py"),
        "--input", str(data), "--output", str(out), "--no-progress",
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        tallies: list[Tally] = []
        if backend == "aws":
            aws, ddb, aws_port, ddb_port = stack.enter_context(
                proxies(
                    env.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
                    env.get("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000"),
                )
            )
            env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{aws_port}"
            env["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://127.0.0.1:{ddb_port}"
            tallies = [aws, ddb]
            argv += ["--store", f"aws://cmr-clouds-{tag}/cmr-clouds-{tag}?prefix=cmrc{tag}-"]
        elif backend == "azure":
            tally, conn = stack.enter_context(azure_proxies(env["AZURE_STORAGE_CONNECTION_STRING"]))
            env["AZURE_STORAGE_CONNECTION_STRING"] = conn
            tallies = [tally]
            argv += ["--store", f"azure:///cmr-clouds-{tag}/cmrclouds{tag}?prefix=cmrc{tag}-"]
        if backend != "embedded":
            argv += ["--workers", str(workers)]
        started = time.monotonic()
        done = subprocess.run(
            argv, check=False, env=env, capture_output=True, text=True, timeout=3600
        )
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{backend}: cmr run failed:\n{done.stderr[-3000:]}")
        cost = job_cost(done.stderr, argv) if backend != "embedded" else {}
        requests: Counter[str] = Counter()
        for t in tallies:
            requests.update(t.requests)
    size = sum(f.stat().st_size for f in data.iterdir())
    by_service: Counter[str] = Counter()
    for op, n in requests.items():
        by_service[op.split(".", 1)[0]] += n
    per_gb = {s: round(n * GB / size) for s, n in sorted(by_service.items())}
    run = Run(
        backend, round(seconds, 2), True, dict(sorted(requests.items())), dict(by_service), per_gb
    )
    if cost:
        run.cost_usd = cost["total_usd"]
        run.cost_per_gb_usd = cost["total_usd"] * GB / size
        run.cost_requests = cost["requests"]
        run.cost_by_service_usd = {s: v["usd"] * GB / size for s, v in cost["services"].items()}
        run.worker_seconds = cost["worker_seconds"]
        run.workers_usd = cost["workers_usd"]
    return run, out


def job_cost(stderr: str, argv: list[str]) -> dict[str, Any]:
    """The run's job's cost, as `cmr status JOB --json` reads it (not through the proxies)."""
    job = stderr.split("submitted job ", 1)[1].split(maxsplit=1)[0]
    store = argv[argv.index("--store") + 1]
    done = subprocess.run(
        [sys.executable, "-m", "cmr", "status", job, "--json", "--store", store],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    cost: dict[str, Any] = json.loads(done.stdout)["cost"]
    return cost


def remove(tag: str) -> None:
    """What the runs made on the two stacks (their jobs cleaned up after themselves; the
    bucket, table and container stay, as a user's store does)."""
    sys.path.insert(0, str(REPO))
    from tests.stack import remove_azure_test_resources, remove_test_resources

    with contextlib.suppress(Exception):
        remove_test_resources(f"cmr-clouds-{tag}", f"cmr-clouds-{tag}", f"cmrc{tag}-")
    with contextlib.suppress(Exception):
        remove_azure_test_resources(f"cmr-clouds-{tag}", f"cmrc{tag}-", f"cmrclouds{tag}")


def markdown(runs: list[Run], mb: float) -> str:
    rows = [
        "| backend | seconds (each run) | requests per GB of input, by service (first run) |",
        "|---|---|---|",
    ]
    for backend in ("embedded", "aws", "azure"):
        mine = [r for r in runs if r.backend == backend]
        if not mine:
            continue
        secs = " / ".join(f"{r.seconds:.2f}" for r in mine)
        per_gb = ", ".join(f"{s} {n:,}" for s, n in mine[0].per_gb.items()) or "none: in-process"
        rows.append(f"| {backend} | {secs} | {per_gb} |")
    rows += [
        "",
        "| backend | requests the proxies counted | requests in the job's cost | $ per GB: "
        "requests, by service | worker-seconds per GB | $ per GB in all |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.cost_by_service_usd is None:
            continue
        size_gb = r.cost_usd / r.cost_per_gb_usd if r.cost_per_gb_usd else 0
        services = ", ".join(f"{s} {v:.4f}" for s, v in sorted(r.cost_by_service_usd.items()))
        rows.append(
            f"| {r.backend} | {sum(r.requests.values()):,} | {r.cost_requests:,} | {services} | "
            f"{r.worker_seconds / size_gb if size_gb else 0:,.0f} | {r.cost_per_gb_usd:.4f} |"
        )
    return f"Word count, {mb:g} MB of real text:\n\n" + "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--backends", default="embedded,aws,azure")
    ap.add_argument("--data", type=Path, default=HERE / "data" / "realtext-200mb-seed1")
    ap.add_argument("--scratch", type=Path, default=HERE / "out" / "clouds")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"no corpus at {args.data}: make it with benchmarks/realtext.py")
    args.scratch.mkdir(parents=True, exist_ok=True)
    data = first_mb(args.data, args.mb, args.scratch / f"input-{args.mb:g}mb")
    tag = f"{os.getpid():x}"
    runs: list[Run] = []
    reference = sequential_count(data)
    try:
        for _ in range(args.repeats):
            for backend in args.backends.split(","):
                run, out = one_run(backend, data, args.workers, args.scratch, tag)
                run.ok = output_of(out) == reference
                runs.append(run)
                print(json.dumps(asdict(run)), flush=True)
    finally:
        remove(tag)
    table = markdown(runs, args.mb)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        doc = {
            "mb": args.mb,
            "runs": [asdict(r) for r in runs],
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
