"""Testing helpers shipped with cmr: a sequential reference run, and chaos runs.

``sequential(job, input, reducers)`` computes what a job's output *must* be, in plain
Python, with no queues. ``chaos_run(...)`` runs the job on the embedded backend under a
seeded :class:`~cmr.backends.faults.FaultPlan` (duplicates, lost leases, delays, empty
receives, throttling, 5xx before and after writes, stale reads) while seeded hooks crash or
pause workers at the protocol's named steps; a supervisor replaces crashed workers, as a
fleet's autoscaler would. Compare the two with ``diff_outputs``: the invariant is that they
are byte-for-byte equal, whatever the seed.

Use them on your own jobs::

    expected = sequential("jobs/sessions.py", "logs/", reducers=4)
    result = await chaos_run("jobs/sessions.py", "logs/", out_dir, seed=7, pool=pool)
    assert diff_outputs(expected, read_output(out_dir, 4)) == []
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmr import client
from cmr.api import job_ref
from cmr.backends.base import Backend
from cmr.backends.embedded import EmbeddedBlobs, EmbeddedQueues, EmbeddedTable, file_url
from cmr.backends.faults import FaultPlan, inject
from cmr.backends.retry import with_retries
from cmr.compute import job_instance, sort_key
from cmr.job import Job
from cmr.runtime import STEPS, Hook, Runtime, WorkerCrashed
from cmr.settings import WorkerSettings
from cmr.worker import Worker


def _inputs(root: Path) -> list[tuple[str, Path]]:
    if root.is_file():
        return [(root.name, root)]
    return [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*")) if p.is_file()]


def sequential(
    job: str | type[Job], input: str | Path, reducers: int, params: dict[str, str] | None = None
) -> list[str]:
    """The job's output computed sequentially: one string per part, as cmr writes it."""
    ref = job_ref(job)
    inst = job_instance(ref, dict(params or {}))
    groups: list[dict[Any, list[Any]]] = [defaultdict(list) for _ in range(reducers)]
    for name, path in _inputs(Path(input)):
        data = path.read_bytes()
        if not data:
            continue
        for key, value in inst.map_chunk(name, data[:-1] if data.endswith(b"\n") else data):
            groups[inst.partition(key, reducers)][key].append(value)
    parts = []
    for group in groups:
        lines = []
        for key in sorted(group, key=sort_key):
            for k, v in inst.reduce(key, iter(group[key])):
                lines.append(inst.format(k, v) + "\n")
        parts.append("".join(lines))
    return parts


def read_output(out: str | Path, reducers: int) -> list[str]:
    return [
        (Path(out) / f"part-{p:05d}").read_text(encoding="utf-8")
        if (Path(out) / f"part-{p:05d}").exists()
        else "<missing>"
        for p in range(reducers)
    ]


def diff_outputs(expected: list[str], got: list[str]) -> list[str]:
    """Human-readable differences (empty when equal)."""
    problems = []
    for p, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want != have:
            w, h = set(want.splitlines()), set(have.splitlines())
            problems.append(
                f"part-{p:05d}: {len(w - h)} lines missing, {len(h - w)} unexpected "
                f"(e.g. missing {sorted(w - h)[:3]}, unexpected {sorted(h - w)[:3]})"
            )
    return problems


@dataclass
class ChaosResult:
    job_id: str
    record: dict[str, Any]
    injected: Counter[str]
    crashes: Counter[str] = field(default_factory=Counter)  # by step
    pauses: Counter[str] = field(default_factory=Counter)  # by step
    workers_started: int = 0

    @property
    def duplicates_handled(self) -> dict[str, int]:
        r = self.record
        return {
            "method1_map_attempts_filtered": int(r.get("map_attempts_filtered", 0)),
            "method1_duplicate_tasks_skipped": int(r.get("map_duplicates_skipped", 0)),
            "method1_batches_of_losers_filtered": int(r.get("batches_filtered", 0)),
            "method2_repeated_batches_dropped": int(r.get("batches_dropped", 0)),
            "method3_reduce_conflicts_resolved": int(r.get("reduce_conflicts", 0)),
        }


@dataclass(frozen=True)
class StepChaos:
    """How often a worker crashes or pauses at each named step (seeded per worker)."""

    crash: float = 0.0
    pause: float = 0.0
    pause_s: float = 3.0  # longer than the lease, so the paused worker loses it
    max_crashes: int = 4  # after this many, replacements no longer crash: the job must end


def chaos_hook(
    rng: random.Random, chaos: StepChaos, result: ChaosResult, allow_crash: bool
) -> Hook:
    async def hook(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        roll = rng.random()
        if allow_crash and roll < chaos.crash:
            result.crashes[step] += 1
            raise WorkerCrashed(step)
        if roll < chaos.crash + chaos.pause:
            result.pauses[step] += 1
            await rt.pause(chaos.pause_s * (0.8 + 0.4 * rng.random()))

    return hook


async def chaos_run(
    job: str | type[Job],
    input: str | Path,
    output: str | Path,
    *,
    seed: int,
    pool: Executor,
    plan: FaultPlan | None = None,
    steps: StepChaos | None = None,
    workers: int = 3,
    reducers: int = 3,
    visibility_s: int = 2,
    split_bytes: int | None = 2048,
    params: dict[str, str] | None = None,
    hooks: list[Hook | None] | None = None,
    timeout_s: float = 180.0,
) -> ChaosResult:
    """Run a job on a fresh embedded backend under faults, keeping ``workers`` alive.

    ``plan`` defaults to ``FaultPlan.random(seed)``; ``steps`` to occasional crashes and
    pauses. ``hooks`` (one per initial worker) replace the seeded step chaos, for targeted
    tests. Raises TimeoutError if the job does not end within ``timeout_s``.
    """
    plan = plan if plan is not None else FaultPlan.random(seed)
    steps = (
        steps
        if steps is not None
        else StepChaos(crash=0.02, pause=0.02, pause_s=visibility_s * 1.5 + 0.5)
    )
    rng = random.Random(seed * 7919 + 1)
    with tempfile.TemporaryDirectory(prefix="cmr-chaos-") as scratch:
        base = Backend(
            "embedded", EmbeddedQueues(), EmbeddedBlobs(), EmbeddedTable(), file_url(scratch)
        )
        async with inject(base, plan) as faulty:
            be = with_retries(faulty, attempts=12)
            ref = job_ref(job)
            spec = await client.submit(
                be,
                ref,
                str(input),
                str(output),
                partitions=reducers,
                params=dict(params or {}),
                visibility_s=visibility_s,
                queue_prefix="cmr-",
                parallelism=workers,
                split_bytes=split_bytes,
            )
            result = ChaosResult(spec.job_id, {}, faulty.injected)
            ws = WorkerSettings(
                map_slots=2, reduce_slots=2, processes=1, visibility_s=visibility_s, memory_mb=1
            )

            def start(i: int) -> tuple[Worker, asyncio.Task[None]]:
                if hooks is not None and i < len(hooks):
                    hook = hooks[i]
                else:
                    hook = chaos_hook(
                        random.Random(rng.random()),
                        steps,
                        result,
                        allow_crash=sum(result.crashes.values()) < steps.max_crashes,
                    )
                w = Worker(be, ws, pool, only_job=spec.job_id, hook=hook)
                result.workers_started += 1
                return w, asyncio.create_task(w.run())

            fleet = [start(i) for i in range(workers)]
            waiter = asyncio.create_task(client.wait(be, spec, poll_s=0.2))
            try:
                async with asyncio.timeout(timeout_s):
                    while not waiter.done():
                        await asyncio.wait(
                            [waiter, *(t for _, t in fleet)], return_when=asyncio.FIRST_COMPLETED
                        )
                        for i, (_, t) in enumerate(fleet):
                            if t.done() and not waiter.done():
                                _crashed_or_raise(t)
                                fleet[i] = start(len(fleet) + result.workers_started)
                result.record = waiter.result()
            finally:
                waiter.cancel()
                for worker, _ in fleet:
                    worker.done.set()
                await asyncio.gather(*(t for _, t in fleet), waiter, return_exceptions=True)
    return result


def _crashed_or_raise(task: asyncio.Task[None]) -> None:
    """A worker ended: fine if a hook crashed it (or its job ended), else a real bug."""
    exc = task.exception()
    if exc is None:
        return
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split((WorkerCrashed, asyncio.CancelledError))
        if rest is None:
            return
        raise rest
    if not isinstance(exc, WorkerCrashed):
        raise exc


__all__ = [
    "STEPS",
    "ChaosResult",
    "FaultPlan",
    "StepChaos",
    "WorkerCrashed",
    "chaos_hook",
    "chaos_run",
    "diff_outputs",
    "read_output",
    "sequential",
]
