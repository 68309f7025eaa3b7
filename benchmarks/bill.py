"""Requests and dollars per input GB: word count with cmr's defaults and a 2009-style shuffle.

    eval "$(scripts/stack.sh env)"; scripts/stack.sh start        # for the aws rows
    .venv/bin/python benchmarks/bill.py [--sizes 20,100] [--backends embedded,aws]
        [--configs cmr,2009] [--workers 1] [--json F] [--markdown F]

Runs examples/wordcount.py over the seeded corpus of benchmarks/wordcount.py on the aws
backend (LocalStack + moto's DynamoDB, the workers inside this process so every request is
counted) and on the embedded backend, checks every output exactly against the baseline
count, and reports each run's requests by service and operation, SQS requests as billed
(64 KiB chunks), estimated DynamoDB request units, dollars at the list prices of
benchmarks/aws_prices.json, and the fixed (per job) and per-GB parts fitted from two sizes.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import itertools
import json
import math
import os
import platform
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
import wordcount as wc

import cmr
import cmr.logs
from cmr.api import cpu_pool, open_backend, run_on
from cmr.backends.base import Backend, Item, Put, Received, TxWrite, Update
from cmr.backends.embedded import SQS_BODY_LIMIT
from cmr.errors import BlobMissing, ConditionFailed
from cmr.records import ACTIVE_PK, JOBS_PK
from cmr.settings import AwsSettings, WorkerSettings
from cmr.worker import Worker

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PRICES = HERE / "aws_prices.json"
GB = 1_000_000_000  # input GB: 10^9 bytes
CHUNK = 64 * 1024  # SQS bills each 64 KiB of a request's payload as one request
PART_QUEUE = re.compile(r"-p\d{5}$")  # records.queue_names: one queue per partition
# Our own bucket, table and queue prefix: a fleet worker serving the default table would
# take our tasks, and its requests would escape the count.
AWS = AwsSettings(bucket="cmr-bill-bench", table="cmr-bill-bench", queue_prefix="cmrbill-")


# Who makes a request: the submitting client, or a worker (set in the workers' tasks).
ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("role", default="client")


class Sleepy(cmr.Job):
    """Word count whose map tasks first sleep ``--param sleep=SECONDS``: a job that keeps its
    workers waiting, to measure the requests made while nothing happens (idle polling)."""

    reducers = 4

    def map(self, key: str, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    def map_chunk(self, source: str, data: bytes) -> Iterable[tuple[str, int]]:
        time.sleep(float(self.params.get("sleep", "0")))
        return Counter(data.decode("utf-8", "replace").split()).items()

    def reduce(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)


class WordCount2009(cmr.Job):
    """examples/wordcount.py as the 2009 implementation ran it: map emits (word, 1) for every
    word (the same words), nothing is counted before the shuffle. Its combine is the
    example's; the 2009 configuration switches it off (``use_combiner=False``)."""

    reducers = 4

    def map(self, key: str, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    def map_chunk(self, source: str, data: bytes) -> Iterable[tuple[str, int]]:
        return zip(data.decode("utf-8", "replace").split(), itertools.repeat(1))

    def combine(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)

    def reduce(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)


@dataclass(frozen=True)
class Config:
    name: str
    job: str
    knobs: dict[str, Any]
    about: str


CONFIGS = {
    "cmr": Config(
        "cmr",
        f"{REPO / 'examples' / 'wordcount.py'}:WordCount",
        {},
        "defaults: zstd batches near the 256 KiB SQS limit, combiner on",
    ),
    "2009": Config(
        "2009",
        f"{Path(__file__).resolve()}:WordCount2009",
        {"message_bytes": 7 * 1024, "compress": False, "use_combiner": False},
        "7 KB plain msgpack batches, no combiner, one (word, 1) pair per word",
    ),
    # The same engine knobs on examples/wordcount.py, whose map_chunk already counts each
    # split with a Counter: isolates what the message size and compression alone cost.
    "2009-knobs": Config(
        "2009-knobs",
        f"{REPO / 'examples' / 'wordcount.py'}:WordCount",
        {"message_bytes": 7 * 1024, "compress": False, "use_combiner": False},
        "7 KB plain batches, no combiner, but examples/wordcount.py's per-split Counter",
    ),
}


# ------------------------------------------------------------------- what a job costs


def item_size(value: Any) -> int:
    """DynamoDB's size of a value: UTF-8 names and strings, about a byte per two digits."""
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode()) + 1 + item_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 3 + sum(1 + item_size(v) for v in value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 1
    digits = len(repr(value).lstrip("-").replace(".", "").lstrip("0")) or 1
    return (digits + 1) // 2 + 1


def top_size(item: Item) -> int:
    return sum(len(k.encode()) + item_size(v) for k, v in item.items())


def b64_len(n: int) -> int:
    return 4 * math.ceil(n / 3) if n else 1  # the aws backend sends bodies as base64


def sqs_batches(sizes: Sequence[int]) -> list[int]:
    """Payload bytes of each SendMessageBatch the aws backend makes (10 entries, 256 KiB)."""
    out: list[int] = []
    count = 0
    for s in sizes:
        if not out or count == 10 or out[-1] + s > SQS_BODY_LIMIT:
            out.append(0)
            count = 0
        out[-1] += s
        count += 1
    return out


@dataclass
class Meter:
    """What the request counts alone do not say: billed SQS chunks, request units, polls."""

    sqs_extra_chunks: int = 0  # 64 KiB chunks billed beyond one per call
    empty_receives: int = 0
    poll_reads: int = 0  # table reads that repeat with time: job record, progress, commits
    rru: float = 0.0
    wru: float = 0.0
    shuffle_messages: int = 0
    shuffle_bytes: int = 0
    largest_shuffle_message: int = 0
    by_role: dict[str, int] = field(default_factory=dict)  # "worker.receive": n, ...

    def copy(self) -> Meter:
        return Meter(**asdict(self))

    def note(self, method: str) -> None:
        key = f"{ROLE.get()}.{method}"
        self.by_role[key] = self.by_role.get(key, 0) + 1


class MeteredQueues:
    def __init__(self, inner: Any, meter: Meter) -> None:
        self._inner, self._meter = inner, meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        await self._inner.send(name, bodies)
        m = self._meter
        m.note("send")
        if PART_QUEUE.search(name):
            m.shuffle_messages += len(bodies)
            m.shuffle_bytes += sum(map(len, bodies))
            m.largest_shuffle_message = max([m.largest_shuffle_message, *map(len, bodies)])
        for payload in sqs_batches([b64_len(len(b)) for b in bodies]):
            m.sqs_extra_chunks += max(1, math.ceil(payload / CHUNK)) - 1

    async def receive(self, name: str, **kwargs: Any) -> list[Received]:
        got: list[Received] = await self._inner.receive(name, **kwargs)
        self._meter.note("receive" if got else "receive_empty")
        if not got:
            self._meter.empty_receives += 1
        payload = sum(b64_len(len(r.body)) for r in got)
        self._meter.sqs_extra_chunks += max(1, math.ceil(payload / CHUNK)) - 1
        return got


class MeteredTable:
    """Request units estimated from the items we read and write (DynamoDB's rules: a write
    costs 1 WRU per KB of the item, a strongly consistent read 1 RRU per 4 KB, an eventual
    one half that, a query its items' total; a miss or a failed condition still costs the
    minimum). A deleted item's size is unknown here: 1 WRU is assumed."""

    def __init__(self, inner: Any, meter: Meter) -> None:
        self._inner, self._meter = inner, meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _read(self, size: int, consistent: bool, poll: bool) -> None:
        units = max(1, math.ceil(size / 4096))
        self._meter.rru += units if consistent else units / 2
        self._meter.poll_reads += poll

    def _write(self, size: int) -> None:
        self._meter.wru += max(1, math.ceil(size / 1024))

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        got: Item | None = await self._inner.get(pk, sk, consistent=consistent)
        self._meter.note("get_job" if sk == "job" else "get")
        # The job record (client, finalize) and the jobs index (a worker's refresh).
        self._read(top_size(got) if got else 0, consistent, poll=sk == "job" or pk == JOBS_PK)
        return got

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        got: list[Item] = await self._inner.query(
            pk, prefix=prefix, start=start, consistent=consistent
        )
        self._meter.note(f"query_{prefix.rstrip('#') or 'jobs'}")
        poll = pk == ACTIVE_PK or prefix in ("map#", "reduce#")
        self._read(sum(map(top_size, got)), consistent, poll)
        return got

    async def put(self, pk: str, sk: str, item: Item, **kwargs: Any) -> None:
        self._write(top_size({**item, "pk": pk, "sk": sk}))
        await self._inner.put(pk, sk, item, **kwargs)

    async def update(self, write: Update) -> Item:
        try:
            got: Item = await self._inner.update(write)
        except ConditionFailed:
            self._write(0)
            raise
        self._write(top_size(got))
        return got

    async def delete(self, pk: str, sk: str, **kwargs: Any) -> None:
        self._write(0)
        await self._inner.delete(pk, sk, **kwargs)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        self._meter.note("transact")
        for w in writes:
            # DynamoDB bills each item of a transaction (a condition check too) twice the
            # units of a plain write of it.
            body = w.item if isinstance(w, Put) else w.set_ or {} if isinstance(w, Update) else {}
            size = top_size({**body, "pk": w.pk, "sk": w.sk})
            self._meter.wru += 2 * max(1, math.ceil(size / 1024))
        await self._inner.transact(writes, token=token)


def metered(be: Backend) -> tuple[Backend, Meter]:
    meter = Meter()
    q, t = MeteredQueues(be.queues, meter), MeteredTable(be.table, meter)
    out = Backend(be.name, q, be.blobs, t, be.scratch, local_blobs=be.local_blobs)  # type: ignore[arg-type]
    return out, meter


# --------------------------------------------------------------------------- prices


def load_prices() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PRICES.read_text())
    return doc


def dollars(calls: dict[str, int], meter: Meter, prices: dict[str, Any]) -> dict[str, float]:
    """$ by service at list prices; storage and data transfer are not included."""
    p = {k: v["usd"] / v["per"] for k, v in prices["prices"].items()}
    ops = prices["s3_operations"]
    sqs = sum(n for op, n in calls.items() if op.startswith("sqs."))
    s3 = {"put": 0, "get": 0}
    for op, n in calls.items():
        if not op.startswith("s3."):
            continue
        name = op.split(".", 1)[1]
        if name in ops["free"]:
            continue
        s3["put" if name in ops["put_copy_post_list"] else "get"] += n
    return {
        "sqs": (sqs + meter.sqs_extra_chunks) * p["sqs_standard_request"],
        "s3": s3["put"] * p["s3_standard_put_copy_post_list"]
        + s3["get"] * p["s3_standard_get_and_other"],
        "dynamodb": meter.wru * p["dynamodb_on_demand_write_request_unit"]
        + meter.rru * p["dynamodb_on_demand_read_request_unit"],
    }


# ----------------------------------------------------------------------------- runs


@dataclass
class Row:
    backend: str
    config: str
    size_mb: float
    input_bytes: int = 0
    seconds: float | None = None
    calls: dict[str, int] = field(default_factory=dict)  # API requests by operation
    meter: dict[str, Any] = field(default_factory=dict)
    requests: int = 0  # API requests, data plane and control plane
    billed_sqs: int = 0  # SQS requests as billed (64 KiB chunks)
    idle: int = 0  # empty receives + repeated table polls: these grow with time, not GB
    usd: dict[str, float] = field(default_factory=dict)
    maps: int = 0
    exact: bool | None = None
    note: str = ""

    @property
    def gb(self) -> float:
        return self.input_bytes / GB

    @property
    def usd_total(self) -> float:
        return sum(self.usd.values())


def worker_settings(backend: str, config: Config) -> WorkerSettings:
    # As cmr.run sets them: in-process queues cost nothing to poll, SQS long-polls 1 s.
    return WorkerSettings(poll_s=0.1 if backend == "embedded" else 1.0, **config.knobs)


async def run_embedded(config: Config, src: Path, out: Path) -> tuple[cmr.RunResult, Meter]:
    async with open_backend("embedded", AwsSettings()) as raw:
        be, meter = metered(raw)
        result = await run_on(
            be,
            config.job,
            str(src),
            str(out),
            overwrite=True,
            worker_settings=worker_settings("embedded", config),
        )
        return result, meter.copy()


async def stage(be: Backend, src: Path) -> tuple[str, Counter[str]]:
    """Upload the corpus to S3 (as `cmr run` stages local input); the requests it took."""
    root = f"s3://{AWS.bucket}/bench-input/{src.name}/"
    before = be.calls()
    await be.blobs.delete_prefix(root)
    for p in sorted(src.iterdir()):
        await be.blobs.upload_file(str(p), root + p.name)
    return root, be.calls() - before


async def run_aws(
    config: Config,
    src: Path,
    out: Path,
    workers: int,
    staged: dict[str, Any],
    **options: Any,
) -> tuple[cmr.RunResult, Meter]:
    ws = worker_settings("aws", config)
    async with open_backend("aws", AWS) as raw:
        if src.name not in staged:
            root, calls = await stage(raw, src)
            staged[src.name] = {"root": root, "calls": dict(calls)}
        be, meter = metered(raw)
        output = f"s3://{AWS.bucket}/bench-output/{config.name}-{time.time_ns()}/"
        with cpu_pool(ws.processes) as pool:
            fleet: list[Worker] = []
            tasks: list[asyncio.Task[None]] = []

            def start(job_id: str) -> None:
                fleet.extend(Worker(be, ws, pool, only_job=job_id) for _ in range(workers))
                ctx = contextvars.copy_context()
                ctx.run(ROLE.set, "worker")
                tasks.extend(asyncio.create_task(w.run(), context=ctx.copy()) for w in fleet)

            try:
                result = await run_on(
                    be,
                    config.job,
                    staged[src.name]["root"],
                    output,
                    aws=AWS,
                    workers=0,
                    worker_settings=ws,
                    on_submit=start,
                    **options,
                )
            finally:
                for w in fleet:
                    w.done.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        snapshot = meter.copy()
        # Bring the parts home for the exact check (not part of the job: not counted).
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("part-*"):
            old.unlink()
        local = []
        for url in result.parts:
            path = out / url.rsplit("/", 1)[-1]
            try:
                await raw.blobs.download_file(url, str(path))
            except BlobMissing:
                continue
            local.append(str(path))
        await raw.blobs.delete_prefix(output)
        result.parts = local
        return result, snapshot


def one_run(
    backend: str,
    config: Config,
    src: Path,
    want: Counter[str],
    prices: dict[str, Any],
    workers: int,
    staged: dict[str, Any],
    timeout: float,
) -> Row:
    size = sum(p.stat().st_size for p in src.iterdir())
    row = Row(backend, config.name, size / wc.MB, size)
    out = HERE / "out" / f"bill-{src.name}-{backend}-{config.name}"
    started = time.perf_counter()
    try:
        job = (
            run_embedded(config, src, out)
            if backend == "embedded"
            else run_aws(config, src, out, workers, staged)
        )
        result, meter = asyncio.run(asyncio.wait_for(job, timeout))
    except TimeoutError:
        row.note = f"failed: no result after {timeout:g}s"
        return row
    except Exception as e:
        row.note = f"failed: {type(e).__name__}: {e}"
        return row
    row.seconds = time.perf_counter() - started
    row.calls = dict(sorted(result.calls.items()))
    row.meter = asdict(meter)
    row.requests = sum(result.calls.values())
    row.billed_sqs = (
        sum(n for op, n in result.calls.items() if op.startswith("sqs.")) + meter.sqs_extra_chunks
    )
    row.idle = meter.empty_receives + meter.poll_reads
    row.usd = dollars(row.calls, meter, prices)
    row.maps = int(result.record.get("maps", 0))
    diff = wc.differences(want, wc.read_parts(result.parts))
    row.exact = not diff
    if diff:
        wc.console.print(f"[bold red]MISMATCH {backend} {config.name}:[/]\n" + "\n".join(diff))
    return row


def idle_probe(seconds: float, worker_counts: list[int], seed: int) -> list[dict[str, Any]]:
    """Requests per second while a job's two map tasks sleep: the same job with sleep=0 and
    sleep=seconds, the difference divided by the seconds, by who made them."""
    root = HERE / "out" / "bill-idle-input"
    root.mkdir(parents=True, exist_ok=True)
    one = sorted(wc.corpus(5, seed).iterdir())[0]
    shutil.copyfile(one, root / one.name)
    config = Config("sleepy", f"{Path(__file__).resolve()}:Sleepy", {}, "map tasks sleep")
    staged: dict[str, Any] = {}
    out = HERE / "out" / "bill-idle"
    found = []
    for workers in worker_counts:
        runs = {}
        for sleep in (0.0, seconds):
            job = run_aws(
                config,
                root,
                out,
                workers,
                staged,
                params={"sleep": str(sleep)},
                split_bytes=one.stat().st_size // 2 + 1,  # two map tasks, one range each
            )
            started = time.perf_counter()
            result, meter = asyncio.run(job)
            runs[sleep] = (result, meter, time.perf_counter() - started)
        (r0, m0, t0), (r1, m1, t1) = runs[0.0], runs[seconds]
        extra = t1 - t0  # the time the sleeping added
        by_role = Counter(m1.by_role)
        by_role.subtract(Counter(m0.by_role))
        total = sum(r1.calls.values()) - sum(r0.calls.values())
        found.append(
            {
                "workers": workers,
                "sleep_s": seconds,
                "extra_s": extra,
                "requests_per_s": total / extra,
                "by_role_per_s": {k: v / extra for k, v in sorted(by_role.items()) if v},
            }
        )
        wc.console.print(f"idle probe w={workers}: {total / extra:.2f} requests/s")
    return found


def idle_markdown(probes: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "Idle polling: requests per second while a job's two map tasks sleep (aws backend, "
        "in-process workers; the same job without the sleep subtracted):",
        "",
        "| workers | requests/s | client | workers | of which (per s) |",
        "|---:|---:|---:|---:|---|",
    ]
    for p in probes:
        roles = p["by_role_per_s"]
        client = sum(v for k, v in roles.items() if k.startswith("client."))
        worker = sum(v for k, v in roles.items() if k.startswith("worker."))
        parts = ", ".join(f"{k} {v:.2f}" for k, v in roles.items() if abs(v) >= 0.05)
        lines.append(
            f"| {p['workers']} | {p['requests_per_s']:.2f} | {client:.2f} | {worker:.2f} "
            f"| {parts} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- report


@dataclass
class Fit:
    """value = fixed + per_gb * GB, through the smallest and largest size."""

    fixed: float
    per_gb: float


def fit(rows: list[Row], value: Any) -> Fit | None:
    done = sorted((r for r in rows if r.exact), key=lambda r: r.gb)
    if len(done) < 2 or done[-1].gb == done[0].gb:
        return None
    a, b = done[0], done[-1]
    slope = (value(b) - value(a)) / (b.gb - a.gb)
    return Fit(value(a) - slope * a.gb, slope)


def service_totals(calls: dict[str, int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for op, n in calls.items():
        out[op.split(".")[0]] += n
    return dict(out)


def markdown(rows: list[Row], staged: dict[str, Any], prices: dict[str, Any]) -> str:
    lines = [
        "| backend | config | input MB | maps | seconds | sqs | s3 | dynamodb | requests "
        "| of which idle | requests/GB | SQS billed | WRU | RRU | $/GB | exact |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.seconds is None:
            lines.append(
                f"| {r.backend} | {r.config} | {r.size_mb:g} | | | | | | | | | | | | | {r.note} |"
            )
            continue
        s = service_totals(r.calls)
        lines.append(
            f"| {r.backend} | {r.config} | {r.size_mb:.0f} | {r.maps} | {r.seconds:.1f} "
            f"| {s.get('sqs', 0):,} | {s.get('s3', 0):,} | {s.get('dynamodb', 0):,} "
            f"| {r.requests:,} | {r.idle:,} | {r.requests / r.gb:,.0f} | {r.billed_sqs:,} "
            f"| {r.meter['wru']:,.0f} | {r.meter['rru']:,.1f} | {r.usd_total / r.gb:.4f} "
            f"| {'yes' if r.exact else 'NO'} |"
        )
    lines += [
        "",
        "Fixed per job and per GB, fitted through the smallest and largest size "
        "(requests = fixed + per GB x GB):",
        "",
        "| backend | config | requests: fixed | requests: per GB | without idle: per GB "
        "| SQS billed: per GB | $: fixed | $: per GB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.backend, r.config), []).append(r)
    for (backend, config), rs in groups.items():
        req = fit(rs, lambda r: r.requests)
        work = fit(rs, lambda r: r.requests - r.idle)
        billed = fit(rs, lambda r: r.requests + r.meter["sqs_extra_chunks"])
        usd = fit(rs, lambda r: r.usd_total)
        if not (req and work and billed and usd):
            lines.append(f"| {backend} | {config} | (needs two sizes that ran) | | | | | |")
            continue
        lines.append(
            f"| {backend} | {config} | {req.fixed:,.0f} | {req.per_gb:,.0f} | {work.per_gb:,.0f} "
            f"| {billed.per_gb:,.0f} | {usd.fixed:.5f} | {usd.per_gb:.4f} |"
        )
    big = {(r.backend, r.config): r for r in rows if r.seconds is not None}
    if big:
        lines += ["", "Requests by operation, largest size of each row:", ""]
        keys = sorted(big)
        lines.append("| operation | " + " | ".join(f"{b} {c}" for b, c in keys) + " |")
        lines.append("|---|" + "---:|" * len(keys))
        ops = sorted({op for r in big.values() for op in r.calls})
        for op in ops:
            cells = " | ".join(f"{big[k].calls.get(op, 0):,}" for k in keys)
            lines.append(f"| {op} | {cells} |")
        cells = " | ".join(f"{big[k].meter['empty_receives']:,}" for k in keys)
        lines.append(f"| (of ReceiveMessage: empty) | {cells} |")
        cells = " | ".join(f"{big[k].meter['shuffle_messages']:,}" for k in keys)
        lines.append(f"| (shuffle messages sent) | {cells} |")
        cells = " | ".join(f"{big[k].meter['largest_shuffle_message']:,}" for k in keys)
        lines.append(f"| (largest shuffle message, bytes) | {cells} |")
    for name, s in staged.items():
        calls = s["calls"]
        usd = dollars(calls, Meter(), prices)["s3"]
        lines.append(
            f"\nStaging {name} from local disk to S3 (not part of the job; a job whose input "
            f"is already in S3 skips it): {sum(calls.values())} requests "
            f"({', '.join(f'{k} {v}' for k, v in sorted(calls.items()))}), ${usd:.5f}."
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20,100", help="corpus sizes in MB (10^6 bytes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default="embedded,aws")
    ap.add_argument("--configs", default="cmr,2009", help=f"any of {', '.join(CONFIGS)}")
    ap.add_argument("--workers", type=int, default=1, help="in-process workers on aws")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path, help="also write the tables to this file")
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=0,
        help="also measure idle polling on aws: map tasks that sleep this long",
    )
    ap.add_argument("--idle-workers", default="1,3", help="worker counts for --idle-seconds")
    args = ap.parse_args()
    if not structlog.is_configured():
        cmr.logs.configure()

    prices = load_prices()
    backends = args.backends.split(",")
    problem = wc.stack_problem() if "aws" in backends else None
    staged: dict[str, Any] = {}
    rows: list[Row] = []
    load = os.getloadavg()
    for size in (float(s) for s in args.sizes.split(",") if s):
        src = wc.corpus(size, args.seed)
        want = wc.baseline(sorted(src.iterdir()))
        for backend in backends:
            for name in args.configs.split(","):
                config = CONFIGS[name]
                if backend == "aws" and problem:
                    rows.append(Row(backend, name, size, note=f"not run: {problem}"))
                    continue
                row = one_run(
                    backend, config, src, want, prices, args.workers, staged, args.timeout
                )
                rows.append(row)
                wc.console.print(
                    f"{backend:8} {name:10} {size:6g} MB  {row.seconds or 0:6.1f}s  "
                    f"{row.requests:7,} requests  exact={row.exact}  {row.note}"
                )
    probes = []
    if args.idle_seconds and "aws" in backends and not problem:
        counts = [int(w) for w in args.idle_workers.split(",")]
        probes = idle_probe(args.idle_seconds, counts, args.seed)
    for p in HERE.glob("out/requests-*"):
        shutil.rmtree(p, ignore_errors=True)
    text = markdown(rows, staged, prices) if rows else ""
    if probes:
        text += idle_markdown(probes)
    header = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average at start "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + f"; prices: {prices['region']}, recorded {prices['recorded']}\n\n"
    )
    wc.console.print(header + text, markup=False, highlight=False)
    if args.markdown:
        args.markdown.write_text(header + text)
    if args.json:
        wc.write_results(
            args.json,
            {
                "load_average_start": load,
                "configs": {k: asdict(v) for k, v in CONFIGS.items()},
                "staging": staged,
                "rows": [asdict(r) for r in rows],
                "idle": probes,
            },
            date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        )
    if any(r.exact is False for r in rows):
        return 1
    return 2 if any(r.note.startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
