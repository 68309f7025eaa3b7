"""What a worker's tasks share: the backend, the CPU pool, local disk, its identity."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from cmr.backends.base import Backend
from cmr.errors import BackendError
from cmr.records import STATS, job_pk
from cmr.settings import WorkerSettings

T = TypeVar("T")

# A worker folds its tasks' counters into a job's record at most this often. One write per
# task put every task of a fleet on ONE item, and one item takes at most 1,000 writes/s:
# a 1,000-node fleet of 1-2 s tasks would write it 1,000-2,000 times a second (see
# benchmarks/RESULTS.md, fleet scaling). Coalesced, it is about nodes / STATS_FLUSH_S.
STATS_FLUSH_S = 2.0

# The protocol steps at which tests (and chaos runs) may crash or pause a worker.
STEPS = (
    "map.partly_sent",  # some batches are sent, the attempt is not committed
    "map.committed",  # the attempt's commit record is written, the task message not deleted
    "reduce.draining",  # part of the partition has been received
    "reduce.output_written",  # the partition's output is uploaded, not committed
    "reduce.committed",  # the partition is committed, its task message not deleted
)

Hook = Callable[["Runtime", str, dict[str, Any]], Awaitable[None]]


class WorkerCrashed(Exception):
    """Raised by a test hook to stop a worker dead at a step: nothing after it runs."""


@dataclass
class Runtime:
    backend: Backend
    settings: WorkerSettings
    pool: Executor
    spool_dir: str
    # The pid makes an owner in the table traceable to a process (ops, SIGSTOP tests).
    worker_id: str = field(default_factory=lambda: f"w{os.getpid()}-{secrets.token_hex(3)}")
    log: Any = field(default_factory=lambda: structlog.get_logger("cmr.worker"))
    hook: Hook | None = None
    awake: asyncio.Event = field(default_factory=asyncio.Event)
    _pending_stats: dict[str, Counter[str]] = field(default_factory=dict)
    _stats_flusher: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.awake.set()

    async def step(self, name: str, **context: Any) -> None:
        """A named point of the protocol; a hook may crash or pause the worker here."""
        if self.hook is not None:
            await self.hook(self, name, context)
        await self.awake.wait()

    async def pause(self, seconds: float) -> None:
        """Freeze this worker as SIGSTOP would: no receives, no lease renewals."""
        self.awake.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.awake.set()

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn in the process pool, so the event loop keeps moving bytes."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def add_stats(self, job_id: str, stats: Counter[str]) -> None:
        """Fold a task's counters into the job record, coalesced with this worker's other
        tasks' for up to STATS_FLUSH_S. Counters are for watching (progress, duplicates
        handled); nothing decides on them: commits and claims are the job's state."""
        add = {k: v for k, v in stats.items() if v and k in STATS}
        if not add:
            return
        self._pending_stats.setdefault(job_id, Counter()).update(add)
        if self._stats_flusher is None or self._stats_flusher.done():
            self._stats_flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(STATS_FLUSH_S)
        await self.flush_stats()

    async def flush_stats(self) -> None:
        """Write every pending counter now (before a job is finalized, and at worker exit);
        what a failed write could not deliver waits for the next flush."""
        pending, self._pending_stats = self._pending_stats, {}
        for job_id, add in pending.items():
            try:
                await self.backend.table.update(job_pk(job_id), "job", add=dict(add))
            except BackendError:
                self._pending_stats.setdefault(job_id, Counter()).update(add)
                if self._stats_flusher is None or self._stats_flusher.done():
                    self._stats_flusher = asyncio.create_task(self._flush_later())

    async def close_stats(self) -> None:
        """Stop the timer and write what is pending (a worker's last act)."""
        if self._stats_flusher is not None and not self._stats_flusher.done():
            self._stats_flusher.cancel()
        await self.flush_stats()  # a write that fails is dropped: counters only
        if self._stats_flusher is not None and not self._stats_flusher.done():
            self._stats_flusher.cancel()
