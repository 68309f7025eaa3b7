"""Service latencies injected into every call: the model and its middleware."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.fleetsim.meter import (
    Meter,
    item_bytes,
    key_kind,
    queue_kind,
    read_units,
    write_units,
)
from cmr.backends.base import (
    Backend,
    Item,
    Put,
    TxWrite,
    Update,
)
from cmr.backends.middleware import Call, Middleware, Proceed, wrap
from cmr.errors import QueueGone

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


def injected_mean_ms(op: str, latency: Latency) -> float:
    """The mean of the log-normal latency drawn for op, in ms."""
    median, p99 = latency.table.get(op, (0.0, 0.0))
    if median <= 0:
        return 0.0
    sigma = math.log(max(p99, median) / median) / Z99
    return latency.scale * median * math.exp(sigma * sigma / 2)


FINAL_STATES = ("succeeded", "failed", "cancelled")


def blob_area(url: str) -> str:
    for marker, area in (("/spill/", "spilled values"), ("/out/", "reduce outputs")):
        if marker in url:
            return area
    return "input and published output"


@dataclass
class Latent(Middleware):
    """One fleet node's view of the services: every call sleeps an injected latency first
    and is counted in ``meter``. ``on_final`` is called when a job record reaches a final
    state through it."""

    latency: Latency
    meter: Meter
    on_final: Callable[[], None] | None = None

    async def around(self, call: Call, proceed: Proceed) -> Any:
        if call.service == "queues":
            return await self._queues(call, proceed)
        if call.service == "blobs":
            self.meter.prefixes[f"{blob_area(call.target)}|{call.op}"] += 1
            return await self._timed(call, proceed)
        return await self._table(call, proceed)

    async def _timed(self, call: Call, proceed: Proceed) -> Any:
        # A batch call (10 messages a request) is sent concurrently: one latency for the lot.
        op, n = call.op, call.requests
        started = time.monotonic()
        self.meter.calls[op] += n
        try:
            pause = self.latency.draw(op)
            if pause:
                await asyncio.sleep(pause)
            return await proceed(call)
        except QueueGone:
            # A slot polling a job that just ended (until its next job refresh): counted
            # apart, these are not the job's traffic.
            self.meter.calls[op] -= n
            self.meter.gone[op] += n
            raise
        finally:
            self.meter.busy_s[op] += time.monotonic() - started

    def _count(self, name: str, op: str, n: int = 1) -> None:
        self.meter.queues[f"{queue_kind(name)}|{op}"] += n

    async def _queues(self, call: Call, proceed: Proceed) -> Any:
        name = call.target
        if call.method != "list":
            self._count(name, call.op, call.requests)
        if call.method == "send":
            self._count(name, "messages sent", len(call.args[1]))
        got = await self._timed(call, proceed)
        if call.method == "receive" and not got:
            self._count(name, "empty receives")
        return got

    def _read(self, kind: str, size: int, consistent: bool) -> None:
        k = self.meter.keys
        k[f"{kind}|reads"] += 1
        k[f"{kind}|rcu"] += read_units(size, consistent)

    def _write(self, kind: str, size: int) -> None:
        k = self.meter.keys
        k[f"{kind}|writes"] += 1
        k[f"{kind}|wcu"] += write_units(size)

    def _committed(self) -> None:
        self.meter.commit_times.append(time.time())  # a map commit (cmr.mapper)
        self.meter.commit_cpu.append(time.process_time())

    async def _table(self, call: Call, proceed: Proceed) -> Any:
        match call.method:
            case "put":
                pk, sk, item = call.args
                self._write(key_kind(pk, sk), item_bytes(item))
                await self._timed(call, proceed)
                if sk.startswith("map#"):
                    self._committed()
                return None
            case "get":
                pk, sk = call.args
                found = await self._timed(call, proceed)
                self._read(key_kind(pk, sk), item_bytes(found), call.kwargs["consistent"])
                return found
            case "query":
                (pk,) = call.args
                prefix = call.kwargs["prefix"]
                items = await self._timed(call, proceed)
                kind = key_kind(pk, prefix + "#" if prefix and "#" not in prefix else prefix)
                self._read(kind, sum(item_bytes(i) for i in items), call.kwargs["consistent"])
                self.meter.keys[f"{kind}|queries"] += 1
                return items
            case "update":
                return await self._update(call, proceed)
            case "delete":
                self._write(key_kind(*call.args), 0)
                return await self._timed(call, proceed)
            case "transact":
                return await self._transact(call, proceed)
        raise AssertionError(f"not a table call: {call.method}")

    async def _update(self, call: Call, proceed: Proceed) -> Any:
        write: Update = call.args[0]
        pk, sk = write.pk, write.sk
        new: Item | None = None
        try:
            new = await self._timed(call, proceed)
            if (
                self.on_final is not None
                and pk.startswith("job#")
                and sk == "job"
                and (write.set_ or {}).get("state") in FINAL_STATES
            ):
                self.on_final()
            return new
        finally:
            self._write(key_kind(pk, sk), item_bytes(new))  # a refused write is charged too

    async def _transact(self, call: Call, proceed: Proceed) -> None:
        writes: Sequence[TxWrite] = call.args[0]
        for w in writes:
            # DynamoDB charges a transaction twice the units of its writes.
            if isinstance(w, Put):
                size = item_bytes(w.item)
            else:
                size = item_bytes(w.set_ or {}) if isinstance(w, Update) else 0
            self._write(key_kind(w.pk, w.sk), size)
            self._write(key_kind(w.pk, w.sk), size)
        await self._timed(call, proceed)
        if any(isinstance(w, Put) and w.sk.startswith("map#") for w in writes):
            self._committed()
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
    return wrap(backend, Latent(latency, meter, on_final))
