"""The worker: every process runs this same loop; there is no master.

A worker finds running jobs in the table, and runs up to ``map_slots`` map tasks and
``reduce_slots`` reduce tasks at once, taking whatever its jobs' queues hand it. Reduce
slots are separate from map slots so a reducer waiting for maps can never starve them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from cmr import taskprogress, wire
from cmr.backends.base import Backend, Received
from cmr.errors import BackendError, CmrError, QueueGone, Throttled, WireError
from cmr.mapper import run_map_task
from cmr.records import JOBS_PK, RUNNING_PK, JobSpec, JobState, job_pk
from cmr.reducer import run_reduce_task
from cmr.runtime import Hook, Runtime, WorkerCrashed
from cmr.settings import WorkerSettings

JOB_REFRESH_S = 5.0  # a worker serving one job checks it this often (sooner when its queues go)
PROGRESS_FOLD_S = 1.0  # how often live counters from user code reach the job record
FLEET_REFRESH_S = 5.0  # a fleet worker looks for new jobs this often (one query each)
T = TypeVar("T")


class Worker:
    def __init__(
        self,
        backend: Backend,
        settings: WorkerSettings,
        pool: Executor,
        *,
        only_job: str | None = None,
        hook: Hook | None = None,
    ) -> None:
        self.only_job = only_job
        spool = settings.spill_dir or tempfile.gettempdir()
        self.rt = Runtime(
            backend, settings, pool, tempfile.mkdtemp(prefix="cmr-", dir=spool), hook=hook
        )
        self.jobs: list[JobSpec] = []
        self._specs: dict[str, JobSpec] = {}
        self._turn = 0
        self.last_work = time.monotonic()
        self.busy = 0
        self.broken = False
        self.done = asyncio.Event()
        self._poke = asyncio.Event()  # refresh the jobs now, not at the next period

    async def refresh_jobs(self) -> None:
        table = self.rt.backend.table
        if self.only_job is not None:
            rows = [r for r in [await table.get(JOBS_PK, self.only_job)] if r is not None]
        else:
            rows = await table.query(RUNNING_PK, consistent=False)
        running = []
        for row in rows:
            job_id = str(row["sk"])
            if row.get("state") != JobState.RUNNING.value:
                self._specs.pop(job_id, None)
                continue
            spec = self._specs.get(job_id)
            if spec is None:
                item = await table.get(job_pk(job_id), "job")
                if item is None:
                    continue
                try:
                    spec = JobSpec.from_item(job_id, item)
                except WireError as exc:
                    self.rt.log.warning(
                        "skipping a malformed job record", job=job_id, error=str(exc)
                    )
                    continue
                self._specs[job_id] = spec
                self.last_work = time.monotonic()  # a new job is work to come, not idleness
            running.append(spec)
        self.jobs = running
        if self.only_job is not None and not running:
            self.done.set()

    def _next_job(self) -> JobSpec | None:
        if not self.jobs:
            return None
        self._turn += 1
        return self.jobs[self._turn % len(self.jobs)]

    async def _slot(
        self,
        queue_of: Callable[[JobSpec], str],
        handle: Callable[[JobSpec, Received], Awaitable[None]],
    ) -> None:
        queues = self.rt.backend.queues
        poll_s = self.rt.settings.poll_s
        # An idle slot long-polls longer after each empty receive, up to idle_wait_s: a
        # receive returns as soon as a message arrives, so the wait costs no latency, and an
        # idle slot makes one request per idle_wait_s instead of one per poll_s.
        wait_s = poll_s
        while not self.done.is_set():
            await self.rt.awake.wait()
            spec = self._next_job()
            if spec is None:
                await asyncio.sleep(poll_s / 2)
                continue
            try:
                got = await queues.receive(
                    queue_of(spec),
                    max_messages=1,
                    wait_s=wait_s,
                    visibility_s=spec.visibility_s,
                )
                if not got:
                    wait_s = min(self.rt.settings.idle_wait_s, wait_s * 2)
                    continue
                wait_s = poll_s
                self.busy += 1
                self.last_work = time.monotonic()
                try:
                    await handle(spec, got[0])
                finally:
                    self.busy -= 1
                    self.last_work = time.monotonic()
            except QueueGone:
                # The job ended and was cleaned up: stop polling its queues now (each try
                # costs a request) and let the watcher confirm it at once.
                self.jobs = [j for j in self.jobs if j.job_id != spec.job_id]
                self._poke.set()
                await asyncio.sleep(0.1)
            except Throttled:
                await asyncio.sleep(1.0)
            except BackendError as exc:
                self.rt.log.warning("backend error; carrying on", job=spec.job_id, error=str(exc))
                await asyncio.sleep(1.0)
            except WorkerCrashed:
                raise
            except BrokenProcessPool:
                # A pool process died (OOM killer, os._exit in user code): the pool is gone
                # for good. Stop, so the supervisor (systemd, the client) can restart us.
                self.broken = True
                self.done.set()
                return
            except Exception:
                # A bug or a record we cannot read must not take the worker down: the task's
                # lease lapses and another attempt runs. The traceback says what to fix.
                self.rt.log.exception(
                    "task failed unexpectedly; it will be retried", job=spec.job_id
                )
                await asyncio.sleep(1.0)

    async def _map(self, spec: JobSpec, m: Received) -> None:
        task = self._decode(spec, m, wire.MapTask)
        if task is not None and task.task < spec.maps:
            await run_map_task(self.rt, spec, m, task)
        else:
            await self._reject(spec, spec.queues()[0], m)

    async def _reduce(self, spec: JobSpec, m: Received) -> None:
        task = self._decode(spec, m, wire.ReduceTask)
        if task is not None and task.partition < spec.partitions:
            await run_reduce_task(self.rt, spec, m, task)
        else:
            await self._reject(spec, spec.queues()[1], m)

    async def _reject(self, spec: JobSpec, queue: str, m: Received) -> None:
        """A stranger's or a corrupt message: log it (in _decode), count it, drop it."""
        await self.rt.backend.queues.delete_messages(queue, [m.receipt])
        await self.rt.add_stats(spec.job_id, Counter(messages_rejected=1))

    def _decode(self, spec: JobSpec, m: Received, kind: type[T]) -> T | None:
        try:
            msg = wire.decode(m.body)
        except WireError as exc:
            self.rt.log.warning(
                "rejected a malformed task message", job=spec.job_id, error=str(exc)
            )
            return None
        if not isinstance(msg, kind) or getattr(msg, "job", None) != spec.job_id:
            self.rt.log.warning("rejected a foreign task message", job=spec.job_id)
            return None
        return msg

    async def _watch(self) -> None:
        idle_exit = self.rt.settings.idle_exit_s
        while not self.done.is_set():
            with contextlib.suppress(BackendError):
                await self.refresh_jobs()
            if (
                idle_exit is not None
                and self.busy == 0
                and time.monotonic() - self.last_work > idle_exit
            ):
                self.rt.log.info("idle; exiting", idle_s=idle_exit)
                self.done.set()
            await self._nap(JOB_REFRESH_S if self.only_job else FLEET_REFRESH_S)

    async def _nap(self, seconds: float) -> None:
        """Sleep until the next refresh: ``seconds``, or less when we stop or are poked."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self.done, self._poke)]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._poke.clear()

    async def _fold_progress(self) -> None:
        """Move live counters reported by user code (Job.progress) into the job records."""
        channel = getattr(self.rt.pool, "progress", None)
        if channel is None:
            return
        pending: dict[str, Counter[str]] = {}

        async def flush() -> None:
            while True:  # what is already queued, without waiting
                try:
                    job_id, counters = channel.get_nowait()
                except queue.Empty:
                    break
                pending.setdefault(job_id, Counter()).update(counters)
            for job_id, counters in pending.items():
                with contextlib.suppress(BackendError):
                    await self.rt.backend.table.update(
                        job_pk(job_id),
                        "job",
                        add={taskprogress.PREFIX + k: v for k, v in counters.items()},
                    )
            pending.clear()

        try:
            while True:
                await asyncio.sleep(PROGRESS_FOLD_S)
                await flush()
        except asyncio.CancelledError:
            await asyncio.shield(flush())  # the last window too, as the worker stops
            raise

    async def run(self) -> None:
        """Serve jobs until ``done`` is set (by the caller, idleness, or the only job ending)."""
        s = self.rt.settings
        await self.refresh_jobs()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch())
            folder = tg.create_task(self._fold_progress())
            slots = [
                tg.create_task(self._slot(lambda j: j.queues()[0], self._map))
                for _ in range(s.map_slots)
            ]
            slots += [
                tg.create_task(self._slot(lambda j: j.queues()[1], self._reduce))
                for _ in range(s.reduce_slots)
            ]
            try:
                await self.done.wait()
            finally:
                for t in [*slots, folder]:
                    t.cancel()
        # Only now: the slots (and the spool files they read) are all finished.
        await self.rt.close_stats()
        shutil.rmtree(self.rt.spool_dir, ignore_errors=True)
        if self.broken:
            raise CmrError(
                "a CPU pool process of this worker died (killed, out of memory, or the job's "
                "code exited its process); the worker stopped: restart it. Unfinished tasks "
                "return to the queues when their leases lapse."
            )
