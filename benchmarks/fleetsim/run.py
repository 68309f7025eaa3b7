"""One fleet run: N workers on one embedded backend, each through its own latency."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fleetsim.job import FleetJob, make_input
from benchmarks.fleetsim.latency import Latency, with_latency
from benchmarks.fleetsim.meter import Meter
from cmr import submit, watch
from cmr.api import job_ref
from cmr.backends.base import Queues
from cmr.backends.embedded import embedded_backend
from cmr.errors import QueueGone
from cmr.settings import WorkerSettings
from cmr.testing import diff_outputs, read_output, sequential
from cmr.worker import Worker


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
    queues: Queues, names: list[str], peak: list[int], stop: asyncio.Event
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
        base = embedded_backend(scratch)
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
        spec = await submit.submit(
            be,
            job_ref(FleetJob),
            str(data),
            str(out),
            submit.JobOptions(partitions=reducers, params={"work_ms": str(work_ms)}),
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
            asyncio.create_task(_in_flight_monitor(base.queues, spec.queues()[2], peak, stop)),
        ]
        tasks = [asyncio.create_task(w.run()) for w in fleet]
        try:
            async with asyncio.timeout(timeout_s):
                record = await watch.wait(be, spec, poll_s=0.05)
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
