"""What a worker's tasks share: the backend, the CPU pool, local disk, its identity."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cmr import logs, sidefiles
from cmr.backends.base import Backend, Update
from cmr.errors import BackendError, CmrError
from cmr.plan import Plan, load_plan
from cmr.records import STATS, JobSpec, job_pk
from cmr.settings import WorkerSettings
from cmr.timelimit import forgiven, hard_limit

T = TypeVar("T")

# A worker folds its tasks' counters into a job's record at most this often. One write per
# task put every task of a fleet on ONE item, and one item takes at most 1,000 writes/s:
# a 1,000-node fleet of 1-2 s tasks would write it 1,000-2,000 times a second (see
# benchmarks/RESULTS.md, fleet scaling). Coalesced, it is about nodes / STATS_FLUSH_S.
STATS_FLUSH_S = 2.0

# The protocol steps at which tests (and chaos runs) may crash or pause a worker.
STEPS = (
    "map.partly_sent",  # some batches are sent, the attempt is not committed
    "map.shuffle_written",  # the blob shuffle: the attempt's object is stored, not committed
    "map.committed",  # the attempt's commit record is written, the task message not deleted
    "reduce.draining",  # part of the partition has been received
    "reduce.output_written",  # the partition's output is uploaded, not committed
    "reduce.committed",  # the partition is committed, its task message not deleted
    "finalize.begin",  # every partition is committed; nothing published yet
    "publish.marked",  # the job is marked publishing; no part copied
    "pipeline.next_made",  # a step's next step has its plan, queues and tasks; no record
    "pipeline.handed_over",  # the next step's record stands; this step still says running
    "publish.copied",  # every part is copied into the output place; no manifest
    "publish.manifest_written",  # the manifest stands; the job still says running
    "finalize.succeeded",  # the job says succeeded; replaced parts and scratch remain
    "cleanup.output",  # replaced (or own unpublished) parts removed; queues remain
    "cleanup.queues",  # queues deleted; scratch blobs remain
    "cleanup.scratch",  # scratch deleted; task records remain
    "cleanup.records",  # task records deleted; the job still in the active index
    "cleanup.done",  # the job left the active index
)

Hook = Callable[["Runtime", str, dict[str, Any]], Awaitable[None]]


class WorkerCrashed(Exception):
    """Raised by a test hook to stop a worker dead at a step: nothing after it runs."""


class PoolRestarted(CmrError):
    """The worker restarted its CPU pool (a task overran its time limit) while this task ran
    in it: the task did nothing wrong and is simply tried again."""


class TaskTimedOut(CmrError):
    """A task's code kept running past its time limit and ignored the signal sent to stop it:
    the worker stopped the process it ran in."""


@dataclass
class Runtime:
    backend: Backend
    settings: WorkerSettings
    pool: Executor
    spool_dir: str
    # The pid makes an owner in the table traceable to a process (ops, SIGSTOP tests).
    worker_id: str = field(default_factory=lambda: f"w{os.getpid()}-{secrets.token_hex(3)}")
    log: Any = field(default_factory=lambda: logs.get_logger("cmr.worker"))
    hook: Hook | None = None
    awake: asyncio.Event = field(default_factory=asyncio.Event)
    # Called when a task of ours ended a job (failed it, or finalized it): its cleanup is the
    # duty that follows, which the worker takes on.
    on_job_ended: Callable[[JobSpec], None] | None = None
    _pending_stats: dict[str, Counter[str]] = field(default_factory=dict)
    _stats_flusher: asyncio.Task[None] | None = None
    # Each job's plan, read once however many tasks ask for it at the same time (a 4,000
    # file plan takes ~0.06 s to check and build, on the event loop).
    _plans: dict[str, asyncio.Future[Plan]] = field(default_factory=dict)
    # Jobs' side files this worker fetched (or is fetching), by job (cmr.sidefiles).
    side_files: dict[str, asyncio.Future[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.awake.set()

    async def step(self, name: str, **context: Any) -> None:
        """A named point of the protocol; a hook may crash or pause the worker here."""
        if self.hook is not None:
            await self.hook(self, name, context)
        await self.awake.wait()

    async def hook_step(self, name: str, context: dict[str, Any]) -> None:
        """``step`` in the shape lifecycle and janitor code takes (cmr.lifecycle.Step)."""
        await self.step(name, **context)

    def job_ended(self, spec: JobSpec) -> None:
        if self.on_job_ended is not None:
            self.on_job_ended(spec)

    async def plan(self, spec: JobSpec, job_scratch: str) -> Plan:
        """The job's plan, read once per worker (it never changes); a read that failed is
        tried again by the next task that asks."""
        loading = self._plans.get(spec.job_id)
        if loading is None or (loading.done() and not _succeeded(loading)):
            blobs = self.backend.blobs
            loading = asyncio.ensure_future(
                load_plan(blobs, job_scratch, spec.plan_digest, spec.partitions)
            )
            self._plans[spec.job_id] = loading
        # Shielded: a task cancelled while it waits leaves the read to the others (and
        # the shield takes the read's exception if none of them is left to).
        return await asyncio.shield(loading)

    def forget_job(self, job_id: str) -> None:
        self._plans.pop(job_id, None)
        sidefiles.forget(self.side_files, self.spool_dir, job_id)

    async def pause(self, seconds: float) -> None:
        """Freeze this worker as SIGSTOP would: no receives, no lease renewals."""
        self.awake.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.awake.set()

    async def cpu(
        self,
        fn: Callable[..., T],
        *args: Any,
        limit_s: float = 0.0,
        stalled: Callable[[], float] | None = None,
    ) -> T:
        """Run fn in the process pool, so the event loop keeps moving bytes. With a time
        limit (which fn enforces itself, by SIGALRM), stop waiting past the hard limit:
        restart the pool, which kills the stuck process, and raise TaskTimedOut.
        ``stalled``: the seconds fn has so far spent waiting for us (its output's pipe full
        and unread while the store was slow), by which the hard limit moves on, up to as
        much as fn's own limit forgives (cmr.timelimit.paused)."""
        loop = asyncio.get_running_loop()
        generation = getattr(self.pool, "generation", 0)
        started = loop.time()
        future = loop.run_in_executor(self.pool, fn, *args)
        # If we stop waiting (cancelled, or past the limit), its outcome is nobody's: take it,
        # or asyncio reports an exception "never retrieved".
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

        def deadline() -> float:
            waited = forgiven(limit_s, stalled()) if stalled is not None else 0.0
            return started + hard_limit(limit_s) + waited

        try:
            if limit_s <= 0:
                return await future
            try:
                while True:
                    at = deadline()
                    try:
                        # Not wait_for: 3.11's loses a cancellation that comes as the
                        # result does.
                        async with asyncio.timeout_at(at):
                            return await asyncio.shield(future)
                    except TimeoutError:
                        if future.done():  # as the limit struck
                            return future.result()
                        if deadline() <= at:  # not moved on meanwhile
                            raise
            except TimeoutError:
                restart = getattr(self.pool, "restart", None)
                if restart is None:
                    raise TaskTimedOut(
                        f"a task overran its time limit of {limit_s:.0f} s and did not stop; "
                        "this pool cannot be restarted"
                    ) from None
                self.log.warning("a task ignored its time limit; restarting the CPU pool")
                # On this thread: pool processes die with the thread that started them
                # (PR_SET_PDEATHSIG), and a helper thread would soon end.
                restart()
                raise TaskTimedOut(
                    f"the task ran past its time limit of {limit_s:.0f} s and did not stop "
                    "when told to (stuck in code that does not return to Python?); its process "
                    "was killed. Give the job more time with --task-timeout SECONDS if it "
                    "needs it"
                ) from None
        except BrokenProcessPool:
            if getattr(self.pool, "generation", 0) != generation:
                raise PoolRestarted("the CPU pool was restarted under this task") from None
            raise

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
                await self.backend.table.update(Update(job_pk(job_id), "job", add=dict(add)))
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


def _succeeded(done: asyncio.Future[Any]) -> bool:
    """Whether a finished future holds a result (its exception, if any, is retrieved)."""
    return not done.cancelled() and done.exception() is None
