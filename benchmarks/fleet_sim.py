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
import builtins
import contextlib
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cmr
import cmr.logs
from cmr import client
from cmr.api import job_ref
from cmr.backends.base import (
    Backend,
    BlobInfo,
    Blobs,
    Condition,
    Item,
    Put,
    Queues,
    Received,
    Table,
    TxWrite,
    Update,
)
from cmr.backends.embedded import EmbeddedBlobs, EmbeddedQueues, EmbeddedTable, file_url
from cmr.errors import QueueGone
from cmr.records import ACTIVE_PK, MapCommit
from cmr.settings import WorkerSettings
from cmr.testing import diff_outputs, read_output, sequential
from cmr.worker import Worker

T = TypeVar("T")

# ------------------------------------------------------------------ latency model

# (median ms, p99 ms) per operation; sources in the module docstring.
LATENCY_MS: dict[str, tuple[float, float]] = {
    "sqs.SendMessageBatch": (20, 80),
    "sqs.ReceiveMessage": (20, 80),
    "sqs.DeleteMessageBatch": (15, 60),
    "sqs.ChangeMessageVisibilityBatch": (15, 60),
    "sqs.GetQueueAttributes": (15, 60),
    "sqs.CreateQueue": (50, 200),
    "sqs.DeleteQueue": (50, 200),
    "sqs.ListQueues": (30, 100),
    "s3.GetObject": (30, 120),
    "s3.PutObject": (50, 200),
    "s3.HeadObject": (20, 80),
    "s3.ListObjectsV2": (40, 150),
    "s3.DeleteObjects": (50, 200),
    "dynamodb.GetItem": (7, 25),
    "dynamodb.PutItem": (7, 25),
    "dynamodb.UpdateItem": (7, 25),
    "dynamodb.DeleteItem": (7, 25),
    "dynamodb.Query": (9, 30),
}
Z99 = 2.3263  # the standard normal's 99th percentile


class Latency:
    """Seeded log-normal latencies per operation: the median and p99 of ``LATENCY_MS``."""

    def __init__(
        self,
        table: dict[str, tuple[float, float]] | None = None,
        *,
        scale: float = 1.0,
        seed: int = 1,
    ) -> None:
        self.table = dict(LATENCY_MS if table is None else table)
        self.scale = scale
        self.rng = random.Random(seed)

    def draw(self, op: str) -> float:
        """Seconds to wait before the call; 0 for an operation without a figure."""
        median, p99 = self.table.get(op, (0.0, 0.0))
        if median <= 0 or self.scale <= 0:
            return 0.0
        sigma = math.log(max(p99, median) / median) / Z99
        return self.scale * median * math.exp(self.rng.gauss(0.0, sigma)) / 1000


# ------------------------------------------------------------------ metering

QUEUE_KINDS = (("-in", "input queue"), ("-reduce", "reduce queue"))
PART_QUEUE = re.compile(r"-p\d{5}$")


def queue_kind(name: str) -> str:
    if PART_QUEUE.search(name):
        return "partition queues"
    for suffix, kind in QUEUE_KINDS:
        if name.endswith(suffix):
            return kind
    return "other queue"


def key_kind(pk: str, sk: str = "") -> str:
    """The table's keys by role (cmr/records.py): every worker hits the same few."""
    if pk.startswith("job#"):
        if sk == "job":
            return "job#<id> / job (the job record)"
        role = sk.split("#", 1)[0] if sk else "*"
        return f"job#<id> / {role}#*"
    return f"{pk} / <id>" if pk in ("jobs", ACTIVE_PK) and sk else f"{pk} / *"


def item_bytes(item: Item | None) -> int:
    """DynamoDB's item size, approximately (names + values, as msgpack encodes them)."""
    if not item:
        return 0
    return len(msgpack.packb(item, use_bin_type=True, default=str))


def read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / 4096))
    return float(units) if consistent else units / 2


def write_units(size: int) -> float:
    return float(max(1, math.ceil(size / 1024)))


@dataclass
class Meter:
    """What one worker (or the client) asked of the services."""

    calls: Counter[str] = field(default_factory=Counter)
    busy_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    queues: Counter[str] = field(default_factory=Counter)  # "kind|op"
    keys: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    prefixes: Counter[str] = field(default_factory=Counter)  # "area|op"
    commit_times: list[float] = field(default_factory=list)  # map commits written, time.time()
    commit_cpu: list[float] = field(default_factory=list)  # process CPU at each map commit
    gone: Counter[str] = field(default_factory=Counter)  # calls on queues already deleted

    def copy(self) -> Meter:
        out = Meter()
        out.add(self)
        return out

    def add(self, other: Meter) -> None:
        self.gone.update(other.gone)
        self.calls.update(other.calls)
        for k, v in other.busy_s.items():
            self.busy_s[k] += v
        self.queues.update(other.queues)
        for k, v in other.keys.items():
            self.keys[k] += v
        self.prefixes.update(other.prefixes)
        self.commit_times.extend(other.commit_times)
        self.commit_cpu.extend(other.commit_cpu)


class _Latent:
    def __init__(self, latency: Latency, meter: Meter) -> None:
        self.latency = latency
        self.meter = meter
        self.calls: Counter[str] = meter.calls

    async def _timed(self, op: str, run: Callable[[], Awaitable[T]], n: int = 1) -> T:
        started = time.monotonic()
        self.meter.calls[op] += n
        try:
            pause = self.latency.draw(op)
            if pause:
                await asyncio.sleep(pause)
            return await run()
        except QueueGone:
            # A slot polling a job that just ended (until its next job refresh): counted
            # apart, these are not the job's traffic.
            self.meter.calls[op] -= n
            self.meter.gone[op] += n
            raise
        finally:
            self.meter.busy_s[op] += time.monotonic() - started


class LatentQueues(_Latent):
    def __init__(self, inner: Queues, latency: Latency, meter: Meter) -> None:
        super().__init__(latency, meter)
        self.inner = inner

    @property
    def max_message_bytes(self) -> int:
        return self.inner.max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None:
        self.inner.max_message_bytes = value

    def _count(self, name: str, op: str, n: int = 1) -> None:
        self.meter.queues[f"{queue_kind(name)}|{op}"] += n

    async def create(self, name: str, *, visibility_s: int) -> None:
        self._count(name, "sqs.CreateQueue")
        await self._timed(
            "sqs.CreateQueue", lambda: self.inner.create(name, visibility_s=visibility_s)
        )

    async def delete(self, name: str) -> None:
        self._count(name, "sqs.DeleteQueue")
        await self._timed("sqs.DeleteQueue", lambda: self.inner.delete(name))

    async def list(self, prefix: str) -> builtins.list[str]:
        return await self._timed("sqs.ListQueues", lambda: self.inner.list(prefix))

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        # One SendMessageBatch per 10 bodies, sent concurrently: one latency for the lot.
        n = (len(bodies) + 9) // 10
        self._count(name, "sqs.SendMessageBatch", n)
        self._count(name, "messages sent", len(bodies))
        await self._timed("sqs.SendMessageBatch", lambda: self.inner.send(name, bodies), n)

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        self._count(name, "sqs.ReceiveMessage")
        got = await self._timed(
            "sqs.ReceiveMessage",
            lambda: self.inner.receive(
                name, max_messages=max_messages, wait_s=wait_s, visibility_s=visibility_s
            ),
        )
        if not got:
            self._count(name, "empty receives")
        return got

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        n = (len(receipts) + 9) // 10
        self._count(name, "sqs.DeleteMessageBatch", n)
        await self._timed(
            "sqs.DeleteMessageBatch", lambda: self.inner.delete_messages(name, receipts), n
        )

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        n = (len(receipts) + 9) // 10
        self._count(name, "sqs.ChangeMessageVisibilityBatch", n)
        await self._timed(
            "sqs.ChangeMessageVisibilityBatch",
            lambda: self.inner.change_visibility(name, receipts, seconds),
            n,
        )

    async def counts(self, name: str) -> tuple[int, int]:
        self._count(name, "sqs.GetQueueAttributes")
        return await self._timed("sqs.GetQueueAttributes", lambda: self.inner.counts(name))


def blob_area(url: str) -> str:
    for marker, area in (("/spill/", "spilled values"), ("/out/", "reduce outputs")):
        if marker in url:
            return area
    return "input and published output"


class LatentBlobs(_Latent):
    def __init__(self, inner: Blobs, latency: Latency, meter: Meter) -> None:
        super().__init__(latency, meter)
        self.inner = inner

    def _count(self, url: str, op: str) -> None:
        self.meter.prefixes[f"{blob_area(url)}|{op}"] += 1

    async def put(self, url: str, data: bytes) -> None:
        self._count(url, "s3.PutObject")
        await self._timed("s3.PutObject", lambda: self.inner.put(url, data))

    async def get(self, url: str) -> bytes:
        self._count(url, "s3.GetObject")
        return await self._timed("s3.GetObject", lambda: self.inner.get(url))

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        self._count(url, "s3.GetObject")
        return await self._timed("s3.GetObject", lambda: self.inner.get_range(url, start, end))

    async def size(self, url: str) -> int:
        self._count(url, "s3.HeadObject")
        return await self._timed("s3.HeadObject", lambda: self.inner.size(url))

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        self._count(prefix, "s3.ListObjectsV2")
        return await self._timed("s3.ListObjectsV2", lambda: self.inner.list(prefix))

    async def delete_prefix(self, prefix: str) -> int:
        self._count(prefix, "s3.DeleteObjects")
        return await self._timed("s3.DeleteObjects", lambda: self.inner.delete_prefix(prefix))

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        self._count(url, "s3.PutObject")
        return await self._timed("s3.PutObject", lambda: self.inner.put_if(url, data, etag=etag))

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        self._count(url, "s3.GetObject")
        return await self._timed("s3.GetObject", lambda: self.inner.get_with_etag(url))

    async def copy(self, src: str, dst: str) -> None:
        self._count(dst, "s3.CopyObject")
        await self._timed("s3.CopyObject", lambda: self.inner.copy(src, dst))

    async def delete(self, urls: Sequence[str]) -> None:
        n = (len(urls) + 999) // 1000
        self._count(urls[0] if urls else "", "s3.DeleteObjects")
        await self._timed("s3.DeleteObjects", lambda: self.inner.delete(urls), n)

    async def upload_file(self, path: str, url: str) -> None:
        self._count(url, "s3.PutObject")
        await self._timed("s3.PutObject", lambda: self.inner.upload_file(path, url))

    async def download_file(self, url: str, path: str) -> None:
        self._count(url, "s3.GetObject")
        await self._timed("s3.GetObject", lambda: self.inner.download_file(url, path))


FINAL_STATES = ("succeeded", "failed", "cancelled")


class LatentTable(_Latent):
    def __init__(
        self,
        inner: Table,
        latency: Latency,
        meter: Meter,
        on_final: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(latency, meter)
        self.inner = inner
        self.on_final = on_final  # called when a job record reaches a final state

    def _read(self, kind: str, size: int, consistent: bool) -> None:
        k = self.meter.keys
        k[f"{kind}|reads"] += 1
        k[f"{kind}|rcu"] += read_units(size, consistent)

    def _write(self, kind: str, size: int) -> None:
        k = self.meter.keys
        k[f"{kind}|writes"] += 1
        k[f"{kind}|wcu"] += write_units(size)

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        self._write(key_kind(pk, sk), item_bytes(item))
        await self._timed(
            "dynamodb.PutItem", lambda: self.inner.put(pk, sk, item, condition=condition)
        )
        if sk.startswith("map#"):
            self.meter.commit_times.append(time.time())
            self.meter.commit_cpu.append(time.process_time())

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        found = await self._timed(
            "dynamodb.GetItem", lambda: self.inner.get(pk, sk, consistent=consistent)
        )
        self._read(key_kind(pk, sk), item_bytes(found), consistent)
        return found

    async def query(self, pk: str, *, prefix: str = "", consistent: bool = True) -> list[Item]:
        items = await self._timed(
            "dynamodb.Query", lambda: self.inner.query(pk, prefix=prefix, consistent=consistent)
        )
        kind = key_kind(pk, prefix + "#" if prefix and "#" not in prefix else prefix)
        self._read(kind, sum(item_bytes(i) for i in items), consistent)
        self.meter.keys[f"{kind}|queries"] += 1
        return items

    async def update(
        self,
        pk: str,
        sk: str,
        *,
        set_: Item | None = None,
        add: dict[str, int] | None = None,
        condition: Condition | None = None,
    ) -> Item:
        new: Item | None = None
        try:
            new = await self._timed(
                "dynamodb.UpdateItem",
                lambda: self.inner.update(pk, sk, set_=set_, add=add, condition=condition),
            )
            if (
                self.on_final is not None
                and pk.startswith("job#")
                and sk == "job"
                and (set_ or {}).get("state") in FINAL_STATES
            ):
                self.on_final()
            return new
        finally:
            self._write(key_kind(pk, sk), item_bytes(new))  # a refused write is charged too

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        self._write(key_kind(pk, sk), 0)
        await self._timed(
            "dynamodb.DeleteItem", lambda: self.inner.delete(pk, sk, condition=condition)
        )

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        for w in writes:
            # DynamoDB charges a transaction twice the units of its writes.
            if isinstance(w, Put):
                size = item_bytes(w.item)
            else:
                size = item_bytes(w.set_ or {}) if isinstance(w, Update) else 0
            self._write(key_kind(w.pk, w.sk), size)
            self._write(key_kind(w.pk, w.sk), size)
        await self._timed(
            "dynamodb.TransactWriteItems", lambda: self.inner.transact(writes, token=token)
        )
        if any(isinstance(w, Put) and w.sk.startswith("map#") for w in writes):
            self.meter.commit_times.append(time.time())  # a map commit (cmr.mapper)
            self.meter.commit_cpu.append(time.process_time())
        final = any(
            isinstance(w, Update)
            and w.pk.startswith("job#")
            and w.sk == "job"
            and (w.set_ or {}).get("state") in FINAL_STATES
            for w in writes
        )
        if final and self.on_final is not None:
            self.on_final()


def with_latency(
    backend: Backend,
    latency: Latency,
    meter: Meter,
    on_final: Callable[[], None] | None = None,
) -> Backend:
    """The backend as one fleet node sees it: every call delayed, counted in ``meter``.
    ``on_final`` is called when a job's record is moved to a final state through it."""
    return Backend(
        backend.name,
        LatentQueues(backend.queues, latency, meter),
        LatentBlobs(backend.blobs, latency, meter),
        LatentTable(backend.table, latency, meter, on_final),
        backend.scratch,
    )


# ------------------------------------------------------------------ the job


class FleetJob(cmr.Job):
    """Count the words of many tiny files; ``work_ms`` models each task's compute."""

    reducers = 8

    def map_chunk(self, source: str, data: bytes) -> Iterator[tuple[str, int]]:
        work_s = float(self.params.get("work_ms", "0")) / 1000
        if work_s > 0:
            time.sleep(work_s)  # a pool thread sleeps: task time without CPU
        for word in data.split():
            yield word.decode(), 1

    def map(self, key: str, value: str) -> Iterator[tuple[str, int]]:
        for word in value.split():
            yield word, 1

    def combine(self, word: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)

    def reduce(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)


def make_input(root: Path, files: int, words: int = 200, vocab: int = 2000, seed: int = 1) -> int:
    """``files`` files of ``words`` words each (one map task per file); returns bytes per file."""
    rng = random.Random(seed)
    names = [f"w{i:04d}" for i in range(vocab)]
    root.mkdir(parents=True, exist_ok=True)
    size = 0
    for f in range(files):
        lines = [" ".join(rng.choices(names, k=10)) for _ in range(words // 10)]
        data = ("\n".join(lines) + "\n").encode()
        (root / f"f{f:05d}.txt").write_bytes(data)
        size = max(size, len(data))
    return size


# ------------------------------------------------------------------ one run


@dataclass
class RunStats:
    workers: int
    maps: int
    reducers: int
    work_ms: float
    seconds: float  # submit to published output (the job record's "finished")
    map_seconds: float  # submit to the last map commit
    cleanup_seconds: float  # published output to queues, scratch and records deleted
    pairs: int
    input_bytes: int
    exact: bool
    loop_cpu: float  # this process's CPU seconds / wall seconds, until the last map commit
    lag_ms_mean: float
    lag_ms_p99: float
    max_in_flight: int  # most messages in flight in one partition queue
    cpu_ms_per_task: float  # this process's CPU (all simulated nodes) per map task
    fleet: dict[str, Any]  # the workers' meters, summed, until the job ended
    fleet_after_end: dict[str, Any]  # the same, including cleanup and idle polling after it
    client: dict[str, Any]  # the submitting client's meter
    problems: list[str] = field(default_factory=list)

    @property
    def tasks_per_s(self) -> float:
        """Map tasks per second of the whole job (submit to published output)."""
        return self.maps / self.seconds

    @property
    def map_rate(self) -> float:
        """Map tasks per second until the last map commit: what N workers scale."""
        return self.maps / self.map_seconds

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.map_seconds


def _meter_dict(m: Meter) -> dict[str, Any]:
    return {
        "calls": dict(m.calls),
        "busy_s": {k: round(v, 3) for k, v in m.busy_s.items()},
        "queues": dict(m.queues),
        "keys": {k: round(v, 2) for k, v in m.keys.items()},
        "prefixes": dict(m.prefixes),
        "queue_gone": dict(m.gone),
    }


async def _lag_monitor(samples: list[float], stop: asyncio.Event, every: float = 0.02) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(every)
        samples.append(max(0.0, loop.time() - t - every))


async def _in_flight_monitor(
    queues: EmbeddedQueues, names: list[str], peak: list[int], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        for name in names[:2]:  # every partition queue sees the same traffic; two suffice
            with contextlib.suppress(QueueGone):
                _, flight = await queues.counts(name)
                peak[0] = max(peak[0], flight)
        await asyncio.sleep(0.5)


async def run_fleet(
    n_workers: int,
    data: Path,
    out: Path,
    *,
    maps: int,
    split_bytes: int,
    reducers: int,
    latency: Latency,
    work_ms: float = 0.0,
    pairs_per_task: int = 200,
    map_slots: int = 2,
    reduce_slots: int = 2,
    expected: list[str] | None = None,
    timeout_s: float = 600.0,
) -> RunStats:
    """Submit the job on a fresh embedded backend and run it with ``n_workers`` workers."""
    loop = asyncio.get_running_loop()
    # Blob reads and batch decoding hop to the default executor: give it room for 64 nodes.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=64))
    with tempfile.TemporaryDirectory(prefix="cmr-fleet-") as scratch:
        queues = EmbeddedQueues()
        base = Backend("embedded", queues, EmbeddedBlobs(), EmbeddedTable(), file_url(scratch))
        meters = [Meter() for _ in range(n_workers)]
        at_end: list[Meter] = []

        def snapshot() -> None:
            # The job's traffic is what the fleet did until the job ended; later calls
            # (cleanup, slots polling until their next job refresh) are another matter.
            if not at_end:
                at_end.extend(m.copy() for m in meters)

        client_meter = Meter()
        be = with_latency(base, latency, client_meter, snapshot)
        cpu0, t0 = time.process_time(), time.time()
        spec = await client.submit(
            be,
            job_ref(FleetJob),
            str(data),
            str(out),
            client.JobOptions(partitions=reducers, params={"work_ms": str(work_ms)}),
            queue_prefix="cmr-",
            parallelism=n_workers * map_slots,
            split_bytes=split_bytes,
        )
        if spec.maps != maps:
            raise RuntimeError(f"planned {spec.maps} map tasks, expected {maps}")
        ws = WorkerSettings(
            map_slots=map_slots,
            reduce_slots=reduce_slots,
            processes=map_slots,
            poll_s=1.0,  # as on SQS (whole seconds), not the embedded backend's 0.1 s
            memory_mb=64,
        )
        pools = [ThreadPoolExecutor(max_workers=map_slots + reduce_slots) for _ in meters]
        fleet = [
            # A fleet node: serves every running job, as `cmr worker` does.
            Worker(with_latency(base, latency, m, snapshot), ws, pool)
            for m, pool in zip(meters, pools, strict=True)
        ]
        stop = asyncio.Event()
        lags: list[float] = []
        peak = [0]
        monitors = [
            asyncio.create_task(_lag_monitor(lags, stop)),
            asyncio.create_task(_in_flight_monitor(queues, spec.queues()[2], peak, stop)),
        ]
        tasks = [asyncio.create_task(w.run()) for w in fleet]
        try:
            async with asyncio.timeout(timeout_s):
                record = await client.wait(be, spec, poll_s=0.05)
            ended = time.time()
            cpu = time.process_time() - cpu0
        finally:
            stop.set()
            for w in fleet:
                w.done.set()
            await asyncio.gather(*tasks, *monitors, return_exceptions=True)
            for pool in pools:
                pool.shutdown(wait=False)
        total, after = Meter(), Meter()
        for m in at_end or meters:
            total.add(m)
        for m in meters:
            after.add(m)
        commits = sorted(after.commit_times)
        got = read_output(out, reducers)
        problems = diff_outputs(expected, got) if expected is not None else []
        lag_ms = sorted(x * 1000 for x in lags) or [0.0]
        finished = float(record["finished"])  # the job succeeded: its output is published
        seconds = finished - t0
        return RunStats(
            workers=n_workers,
            maps=spec.maps,
            reducers=reducers,
            work_ms=work_ms,
            seconds=seconds,
            map_seconds=(commits[-1] - t0) if commits else seconds,
            cleanup_seconds=ended - finished,
            pairs=spec.maps * pairs_per_task,
            input_bytes=int(record.get("bytes_in", 0)),
            exact=expected is not None and not problems,
            loop_cpu=((max(after.commit_cpu) - cpu0) / (commits[-1] - t0))
            if commits
            else cpu / (ended - t0),
            lag_ms_mean=statistics.fmean(lag_ms),
            lag_ms_p99=lag_ms[min(len(lag_ms) - 1, int(len(lag_ms) * 0.99))],
            max_in_flight=peak[0],
            cpu_ms_per_task=cpu * 1000 / spec.maps,
            fleet=_meter_dict(total),
            fleet_after_end=_meter_dict(after),
            client=_meter_dict(client_meter),
            problems=problems,
        )


async def scaling_point(
    n_workers: int,
    workdir: Path,
    *,
    tasks_per_worker: int,
    reducers: int,
    latency: Latency,
    work_ms: float,
    words: int = 200,
) -> RunStats:
    """Weak scaling: ``tasks_per_worker * n_workers`` map tasks, checked exactly."""
    maps = tasks_per_worker * n_workers
    data = workdir / f"in-{maps}-{words}"
    if not data.exists():
        split = make_input(data, maps, words=words)
        (data.parent / f"{data.name}.split").write_text(str(split))
    split_bytes = int((data.parent / f"{data.name}.split").read_text())
    expected = sequential(FleetJob, data, reducers)
    out = workdir / f"out-{n_workers}-{time.monotonic_ns()}"
    return await run_fleet(
        n_workers,
        data,
        out,
        maps=maps,
        split_bytes=split_bytes,
        reducers=reducers,
        latency=latency,
        work_ms=work_ms,
        pairs_per_task=words,
        expected=expected,
    )


# ------------------------------------------------------------------ AWS limits

# Published limits, each with its source. Rates per second unless said otherwise.
AWS_LIMITS: dict[str, dict[str, Any]] = {
    "sqs.standard.api_tps": {
        "limit": None,  # "nearly unlimited"
        "what": "SendMessage/ReceiveMessage/DeleteMessage calls per second, standard queue",
        "text": "Standard queues support a nearly unlimited number of API calls per second, "
        "per API action",
        "source": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html",
    },
    "sqs.standard.in_flight": {
        "limit": 120_000,
        "what": "messages in flight (received, not deleted) per standard queue",
        "text": "a maximum of approximately 120,000 in flight messages",
        "source": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html",
    },
    "s3.prefix.write": {
        "limit": 3_500,
        "what": "PUT/COPY/POST/DELETE per second per partitioned prefix",
        "text": "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD requests per second "
        "per partitioned Amazon S3 prefix; S3 scales by partitioning prefixes (30-60 min)",
        "source": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html",
    },
    "s3.prefix.read": {
        "limit": 5_500,
        "what": "GET/HEAD per second per partitioned prefix",
        "text": "see s3.prefix.write",
        "source": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html",
    },
    "dynamodb.partition.rcu": {
        "limit": 3_000,
        "what": "read units per second per partition (a hot key or item collection)",
        "text": "Each partition on the table can serve up to 3,000 read request units or "
        "1,000 write request units, or a linear combination of both",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
    "dynamodb.partition.wcu": {
        "limit": 1_000,
        "what": "write units per second per partition",
        "text": "see dynamodb.partition.rcu",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
    "dynamodb.table.rru": {
        "limit": 40_000,
        "what": "read request units per second per on-demand table (default quota, raisable)",
        "text": "Per table: 40,000 read request units and 40,000 write request units",
        "source": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html",
    },
    "dynamodb.table.wru": {
        "limit": 40_000,
        "what": "write request units per second per on-demand table (default quota, raisable)",
        "text": "see dynamodb.table.rru",
        "source": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html",
    },
    "dynamodb.ondemand.ramp": {
        "limit": None,
        "what": "on-demand ramp: a new table serves 4,000 WRU / 12,000 RRU at once; beyond, "
        "up to double the previous peak within 30 minutes",
        "text": "If you exceed double your previous traffic's peak within 30 minutes, then you "
        "might experience throttling. For new on-demand tables, you can immediately drive up "
        "to 4,000 write request units or 12,000 read request units",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
}


# ------------------------------------------------------------------ extrapolation


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


# ------------------------------------------------------------------ reporting


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


def injected_mean_ms(op: str, latency: Latency) -> float:
    median, p99 = latency.table.get(op, (0.0, 0.0))
    if median <= 0:
        return 0.0
    sigma = math.log(max(p99, median) / median) / Z99
    return latency.scale * median * math.exp(sigma * sigma / 2)


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


# ------------------------------------------------------------------ main


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
