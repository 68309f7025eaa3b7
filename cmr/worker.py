"""The worker: every process runs this same loop; there is no master.

A worker finds jobs in the table's active index, and runs up to ``map_slots`` map tasks and
``reduce_slots`` reduce tasks at once, taking whatever its jobs' queues hand it. Reduce
slots are separate from map slots so a reducer waiting for maps can never starve them.
Besides tasks it performs the duties any worker may (``cmr.janitor``): cleaning up an ended
job whose cleaner is gone, and repairing a job that lost task messages. A worker serving one
job (``only_job``) stops once that job has ended *and* been cleaned up, so it never leaves
its own job's cleanup half-done.

Kept whole (past ~400 lines): the slots, the watcher and the duties share one worker's
state (its jobs, busy count, idle clock); apart, they would pass it all around.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from cmr import backup, clock, failures, janitor, taskprogress, usage, wire, workers
from cmr.admission import Admission
from cmr.aio import TaskGroup
from cmr.attempts import Kind
from cmr.backends.base import Backend, Item, Received, Update
from cmr.errors import (
    BackendError,
    CmrError,
    JobRefused,
    QueueGone,
    Throttled,
    UsageError,
    WireError,
)
from cmr.mapper import run_map_task
from cmr.records import ACTIVE_PK, JobSpec, JobState, job_pk
from cmr.reducer import run_claimed, run_reduce_task
from cmr.runtime import Hook, PoolRestarted, Runtime, WorkerCrashed
from cmr.settings import AwsSettings, WorkerSettings
from cmr.spool import Spool, sweep_once

JOB_REFRESH_S = 5.0  # a worker serving one job checks it this often (sooner when its queues go)
PROGRESS_FOLD_S = 1.0  # how often live counters from user code reach the job record
FLEET_REFRESH_S = 5.0  # a fleet worker looks for new jobs this often (one query each)
DUTY_GRACE_S = 60.0  # on stopping, how long duties under way may take to finish
FINISH_GRACE_S = 3.0  # once its job is cleaned up, how long a --job worker's late tasks get
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
        queue_prefix: str = AwsSettings.queue_prefix,
        job_refresh_s: float = JOB_REFRESH_S,
    ) -> None:
        """``queue_prefix``: the store's (its URL's ?prefix=): a job whose record names
        another is not served, as its queues are not this store's. ``job_refresh_s``: how
        often a worker serving one job looks at it (a test's, to tell a poke from a
        refresh)."""
        self.only_job = only_job
        self.job_refresh_s = job_refresh_s
        spool = settings.spill_dir or tempfile.gettempdir()
        if not os.path.isdir(spool):
            raise UsageError(f"spill directory {spool} does not exist: create it, or name another")
        self.admission = Admission.of(
            settings.jobs_from,
            settings.outputs_under,
            backend.scratch,
            settings.inputs_under,
            queue_prefix,
        )
        # Made last: nothing after it may fail and leave it behind (run() removes it).
        swept = sweep_once(spool)
        self.spool = Spool(spool)
        self.rt = Runtime(backend, settings, pool, self.spool.path, hook=hook)
        self.rt.on_job_ended = self._job_ended
        if swept:
            self.rt.log.info("removed dead workers' spill directories", count=len(swept))
        if not self.spool.locked:
            self.rt.log.warning(
                "the spill directory cannot lock files (flock): if this worker is killed, "
                "no later worker will remove its spill files",
                spill_dir=spool,
            )
        self._refused: set[str] = set()  # jobs not ours to serve (said once, then ignored)
        self.jobs: list[JobSpec] = []
        self._specs: dict[str, JobSpec] = {}
        self._turn = 0
        self.last_work = clock.monotonic()
        self.busy = 0
        self.tasks_done = 0  # messages handled (for the worker's row: cmr.workers)
        self.broken = False
        self.refused = ""  # why this worker's only job was refused
        self._finished = False
        self._idle = asyncio.Event()  # set while no slot runs a task
        self._idle.set()
        self.done = asyncio.Event()
        self._poke = asyncio.Event()  # refresh the jobs now, not at the next period
        self._group: asyncio.TaskGroup | None = None
        self._duties: dict[str, asyncio.Task[None]] = {}  # by job id: one duty a job at once
        self._next_duty: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}
        self._watched: dict[str, tuple[janitor.Seen, float]] = {}  # cleaners we watch
        self._last_task: dict[str, float] = {}  # when a slot last got a message of the job
        # Per job: the last repair check, and the repairs count it saw if its queues were empty.
        self._repaired: dict[str, tuple[float, int | None]] = {}
        self._backups_next: dict[tuple[str, str], float] = {}  # when we may look again
        # When a running task of the job may become a straggler (our clock): an idle slot's
        # long poll ends by then, not after its idle backoff (up to idle_wait_s).
        self._backups_due: dict[tuple[str, str], float] = {}
        # The cost of every job (cmr.usage): this worker's time, and the jobs it has worked
        # for, whose usage rows it writes (the ones it stopped serving: at once).
        self.clock = usage.WorkerClock()
        self.usage_jobs: set[str] = set()
        self._usage_due: set[str] = set()

    async def _spec(self, job_id: str) -> JobSpec | None:
        spec = self._specs.get(job_id)
        if spec is None:
            if job_id in self._refused:
                return None
            item = await self.rt.backend.table.get(job_pk(job_id), "job")
            if item is None:
                return None
            try:
                spec = JobSpec.from_item(job_id, item)
            except WireError as exc:
                self._refuse(job_id, str(exc)[:300])
                return None
            reason = self.admission.refusal(spec)
            if reason is not None:
                self._refuse(job_id, reason)
                return None
            self._specs[job_id] = spec
            self._last_task.setdefault(job_id, clock.monotonic())
            self.last_work = clock.monotonic()  # a new job is work to come, not idleness
        return spec

    def _refuse(self, job_id: str, reason: str) -> None:
        """A job this worker will not serve: say why, once. A worker told to serve only this
        job (or its pipeline, whose later steps are its own) has nothing else to do, so it
        stops with the reason: nobody would otherwise say why the job never ends."""
        self._refused.add(job_id)
        self.rt.log.warning("not serving a job", job=job_id[:80], reason=reason)
        if self.only_job is not None and (
            job_id == self.only_job or job_id.startswith(self.only_job + "-s")
        ):
            self.refused = f"job {job_id}: not serving it: {reason}"
            self.done.set()

    async def refresh_jobs(self) -> None:
        table = self.rt.backend.table
        if self.only_job is not None:
            # The job and, if it is a pipeline, its later steps (ids it prefixes).
            rows = [
                r
                for r in await table.query(ACTIVE_PK, prefix=self.only_job)
                if str(r["sk"]) == self.only_job or str(r["sk"]).startswith(self.only_job + "-s")
            ]
        else:
            rows = await table.query(ACTIVE_PK, consistent=False)
        running = []
        for row in rows:
            job_id = str(row["sk"])
            spec = await self._spec(job_id)
            if spec is None:
                continue
            if row.get("state") == JobState.RUNNING.value:
                running.append(spec)
                self._consider_repair(spec)
            else:
                self._consider_cleanup(spec, row)
        listed = {str(r["sk"]) for r in rows}
        self._refused &= listed
        for job_id in list(self._specs):
            if job_id not in listed:  # cleaned up: nothing left to do for it
                self._forget(job_id)
        self.jobs = running
        if self.only_job is not None and not rows:
            self._finished = True  # our job is cleaned up: stop, letting late tasks see it
            self.done.set()

    def _forget(self, job_id: str) -> None:
        self._usage_due.add(job_id)  # its usage row, now: we stop serving it
        self._specs.pop(job_id, None)
        for kind in ("m", "r"):
            self._backups_next.pop((job_id, kind), None)
            self._backups_due.pop((job_id, kind), None)
        self._watched.pop(job_id, None)
        self._last_task.pop(job_id, None)
        self._repaired.pop(job_id, None)
        self.rt.forget_job(job_id)

    def _duty(self, spec: JobSpec, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a duty in the worker's task group (a crash in it is the worker's crash), one
        per job at a time."""
        if self._group is None:
            return
        if spec.job_id in self._duties:
            self._next_duty.setdefault(spec.job_id, work)  # after the one under way
            return

        async def run() -> None:
            try:
                self.usage_jobs.add(spec.job_id)
                with usage.working_for(spec.job_id, self.clock):
                    await work()
            except (WorkerCrashed, BrokenProcessPool):
                raise
            except Exception:
                # Duties are idempotent and watched by every worker: a failed one is taken up
                # again (by us at the next refresh, or by another worker).
                self.rt.log.exception(
                    "a job duty failed; it will be taken up again", job=spec.job_id
                )
            finally:
                self._duties.pop(spec.job_id, None)
                follow = self._next_duty.pop(spec.job_id, None)
                if follow is not None and not self.done.is_set():
                    self._duty(spec, follow)
                self._poke.set()

        self._duties[spec.job_id] = self._group.create_task(run())

    def _job_ended(self, spec: JobSpec) -> None:
        """One of our tasks ended the job: its cleanup is ours to do, now."""
        self.jobs = [j for j in self.jobs if j.job_id != spec.job_id]
        self._duty(spec, lambda: janitor.clean(self.rt, spec, None))

    def _consider_cleanup(self, spec: JobSpec, row: Item) -> None:
        """An ended job still listed: clean it up if nobody does, or watch its cleaner and
        take over if it stays silent for one and a half leases on our own clock."""
        if spec.job_id in self._duties:
            return
        seen = janitor.cleaner_of(row)
        if seen[0] is None:
            # Nobody has taken the cleanup (the job was cancelled, or its ender died at
            # once): take it now; of the workers that try, the conditional write picks one.
            self._duty(spec, lambda: janitor.clean(self.rt, spec, None))
            return
        now = clock.monotonic()
        watched = self._watched.get(spec.job_id)
        if watched is None or watched[0] != seen:
            self._watched[spec.job_id] = (seen, now)
            return
        if now - watched[1] >= janitor.WATCH_LEASES * spec.visibility_s:
            self._watched.pop(spec.job_id, None)
            self._duty(spec, lambda: janitor.clean(self.rt, spec, seen))

    def _consider_repair(self, spec: JobSpec) -> None:
        """A running job none of our slots got a message of for a while: check that its task
        messages still exist (and whether it is due to be finalized)."""
        every = self.rt.settings.janitor_s
        now = clock.monotonic()
        checked, before = self._repaired.get(spec.job_id, (0.0, None))
        if now - self._last_task.get(spec.job_id, now) < every or now - checked < every:
            return

        async def check() -> None:
            seen = await janitor.repair(self.rt, spec, before)
            self._repaired[spec.job_id] = (clock.monotonic(), seen)

        self._repaired[spec.job_id] = (now, before)
        self._duty(spec, check)

    def job_ids(self) -> list[str]:
        """The running jobs this worker serves (its row says them: cmr.workers)."""
        return [j.job_id for j in self.jobs]

    def _next_job(self) -> JobSpec | None:
        if not self.jobs:
            return None
        self._turn += 1
        return self.jobs[self._turn % len(self.jobs)]

    async def _slot(
        self,
        queue_of: Callable[[JobSpec], str],
        handle: Callable[[JobSpec, Received], Awaitable[None]],
        kind: Kind,
    ) -> None:
        queues = self.rt.backend.queues
        poll_s = self.rt.settings.poll_s
        # An idle slot long-polls longer after each empty receive, up to idle_wait_s: a
        # receive returns as soon as a message arrives, so the wait costs no latency, and an
        # idle slot makes one request per idle_wait_s instead of one per poll_s.
        wait_s = poll_s
        me = asyncio.current_task()
        last = "nothing yet"
        while not self.done.is_set():
            if me is not None and me.cancelling():
                # Told to stop, yet still here: something below swallowed our cancellation.
                # Stop all the same, or the worker never would.
                self.rt.log.error("a slot's cancellation was swallowed", after=last)
                raise asyncio.CancelledError
            await self.rt.awake.wait()
            spec = self._next_job()
            if spec is None:
                await asyncio.sleep(poll_s / 2)
                continue
            due = self._backups_due.get((spec.job_id, kind))
            wait = wait_s if due is None else min(wait_s, max(poll_s / 4, due - clock.monotonic()))
            self.usage_jobs.add(spec.job_id)
            try:
                with usage.working_for(spec.job_id):  # polling its queue: a request of the job
                    got = await queues.receive(
                        queue_of(spec),
                        max_messages=1,
                        wait_s=wait,
                        visibility_s=spec.visibility_s,
                    )
                if not got:
                    wait_s = min(self.rt.settings.idle_wait_s, wait_s * 2)
                    if await self._back_up(spec, kind):
                        wait_s = poll_s
                    continue
                wait_s = poll_s
                self.busy += 1
                self._idle.clear()
                self.last_work = self._last_task[spec.job_id] = clock.monotonic()
                last = f"a message of job {spec.job_id} via {handle.__name__}"
                try:
                    with usage.working_for(spec.job_id, self.clock):
                        await handle(spec, got[0])
                finally:
                    self.tasks_done += 1
                    self.busy -= 1
                    if not self.busy:
                        self._idle.set()
                    self.last_work = clock.monotonic()
            except QueueGone:
                # The job ended and its queues were cleaned up: stop polling them now (each
                # try costs a request) and let the watcher confirm it at once.
                self.jobs = [j for j in self.jobs if j.job_id != spec.job_id]
                self._poke.set()
                await asyncio.sleep(0.1)
            except Throttled:
                await asyncio.sleep(1.0)
            except PoolRestarted:
                pass  # the task returns when its lease lapses, and did nothing wrong
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
                # Counting the failure itself failed (a task's own failures are counted in
                # failures.guarded): the task's lease lapses and it comes back, bounded by
                # its restarts. The traceback says what to fix.
                self.rt.log.exception(
                    "task failed unexpectedly; it will be retried", job=spec.job_id
                )
                await asyncio.sleep(1.0)

    async def _back_up(self, spec: JobSpec, kind: Kind) -> bool:
        """An idle slot: run a backup attempt of the job's worst straggler of this kind, if
        it has one worth it (cmr.backup); whether one ran."""
        if not self.rt.settings.backups:
            return False
        key = (spec.job_id, kind)
        now = clock.monotonic()
        if now < self._backups_next.get(key, 0.0):
            return False
        with usage.working_for(spec.job_id):
            verdict = await backup.find(self.rt, spec, kind)
            self._backups_next[key] = now + verdict.check_every_s
            if verdict.due_in is not None:
                self._backups_due[key] = now + verdict.due_in
            else:
                self._backups_due.pop(key, None)
            found = verdict.straggler
            if found is None or not await backup.reserve(self.rt, spec, found):
                return False
        what = "map task" if kind == "m" else "partition"
        self.rt.log.info(
            f"backing up a straggling {what}",
            job=spec.job_id,
            task=found.attempt.task,
            straggler=found.attempt.worker,
            running_s=round(found.age_s, 1),
            peers_s=round(found.peers_s, 1),
        )
        self.busy += 1
        self._idle.clear()
        try:
            with usage.working_for(spec.job_id, self.clock):
                if kind == "m":
                    task = wire.MapTask(spec.job_id, found.attempt.task)
                    await run_map_task(self.rt, spec, None, task)
                else:
                    held = await backup.take_over(self.rt, spec, found)
                    if held is not None:
                        await run_claimed(self.rt, spec, held, None)
        finally:
            self.tasks_done += 1
            self.busy -= 1
            if not self.busy:
                self._idle.set()
            self.last_work = self._last_task[spec.job_id] = clock.monotonic()
        return True

    async def _map(self, spec: JobSpec, m: Received) -> None:
        in_q = spec.queues()[0]
        task = await self._accept(spec, in_q, m, wire.MapTask, lambda t: t.task, spec.maps)
        if task is not None:
            work = run_map_task(self.rt, spec, m, task)
            await failures.guarded(self.rt, spec, failures.TaskRef.map(task.task), in_q, m, work)

    async def _reduce(self, spec: JobSpec, m: Received) -> None:
        reduce_q = spec.queues()[1]
        task = await self._accept(
            spec, reduce_q, m, wire.ReduceTask, lambda t: t.partition, spec.partitions
        )
        if task is not None:
            ref = failures.TaskRef.reduce(task.partition)
            work = run_reduce_task(self.rt, spec, m, task)
            await failures.guarded(self.rt, spec, ref, reduce_q, m, work)

    async def _accept(
        self,
        spec: JobSpec,
        queue: str,
        m: Received,
        kind: type[T],
        index: Callable[[T], int],
        count: int,
    ) -> T | None:
        """The task a message carries, or None once a stranger's, corrupt or out-of-plan
        message is rejected (task messages are pointers into the plan: nothing else runs)."""
        task = await self._decode(spec, m, kind)
        if task is None or index(task) >= count:
            await self._reject(spec, queue, m)
            return None
        return task

    async def _reject(self, spec: JobSpec, queue: str, m: Received) -> None:
        """A stranger's or a corrupt message: log it (in _decode), count it, drop it."""
        await self.rt.backend.queues.delete_messages(queue, [m.receipt])
        await self.rt.add_stats(spec.job_id, Counter(messages_rejected=1))

    async def _decode(self, spec: JobSpec, m: Received, kind: type[T]) -> T | None:
        try:
            msg = await wire.decode_async(m.body)
        except Exception as exc:  # whatever a stranger's bytes make the decoder raise
            self.rt.log.warning(
                "rejected a malformed task message", job=spec.job_id, error=str(exc)[:200]
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
            nap = self.job_refresh_s if self.only_job else FLEET_REFRESH_S
            if idle_exit is not None and self.busy == 0 and not self._duties:
                left = idle_exit - (clock.monotonic() - self.last_work)
                if left < 0:
                    self.rt.log.info("idle; exiting", idle_s=idle_exit)
                    self.done.set()
                # Looked at again when the idle time would run out, not at the next refresh
                # only (--idle-exit 0.5 took 5.5 s); work come meanwhile moves it on (a
                # task or a duty under way is not idleness: the usual period then).
                # Not under 0.5 s: tasks that keep coming just apart would otherwise have
                # it query the table up to 20 times a second.
                nap = min(nap, max(left + 0.05, 0.5))
            if self._watched:
                # A cleaner we watch is judged on our clock: look often enough to see it.
                nap = min(nap, min(self._specs[j].visibility_s for j in self._watched) / 2)
            await self._nap(nap)

    def poke(self) -> None:
        """Refresh the jobs now rather than at the next period (JOB_REFRESH_S): a job we
        serve may have ended (``cmr run``'s workers are told when one of them stopped)."""
        self._poke.set()

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
                with contextlib.suppress(BackendError), usage.working_for(job_id):
                    await self.rt.backend.table.update(
                        Update(
                            job_pk(job_id),
                            "job",
                            add={taskprogress.PREFIX + k: v for k, v in counters.items()},
                        ),
                    )
            pending.clear()

        try:
            while True:
                await asyncio.sleep(PROGRESS_FOLD_S)
                await flush()
        except asyncio.CancelledError:
            await asyncio.shield(flush())  # the last window too, as the worker stops
            raise

    async def _write_usage(self) -> None:
        """Write the usage rows of the jobs we work for (cmr.usage): a job we stopped
        serving at once, the others at most every FLUSH_S while their totals change."""
        while True:
            await asyncio.sleep(1.0)
            due, self._usage_due = self._usage_due, set()
            with contextlib.suppress(BackendError):
                await usage.flush(self.rt.backend, sorted(due))
                # Jobs we no longer serve leave the list a fleet worker checks every second
                # (a slot that serves one again puts it back).
                self.usage_jobs -= due
                await usage.flush(self.rt.backend, sorted(self.usage_jobs), due=False)

    async def run(self) -> None:
        """Serve jobs until ``done`` is set (by the caller, idleness, or the only job ending
        and being cleaned up); duties under way get DUTY_GRACE_S to finish."""
        try:
            await self._serve()
        finally:
            # However the worker stops (a crash, a cancellation), its spool goes: the slots
            # that read it were all finished by the task group.
            self.spool.close()
        if self.refused:
            raise JobRefused(self.refused)
        if self.broken:
            raise CmrError(
                "a CPU pool process of this worker died (killed, out of memory, or the job's "
                "code exited its process); the worker stopped: restart it. Unfinished tasks "
                "return to the queues when their leases lapse."
            )

    async def _serve(self) -> None:
        s = self.rt.settings
        async with TaskGroup() as tg:
            self._group = tg
            await self.refresh_jobs()
            tg.create_task(self._watch())
            folder = tg.create_task(self._fold_progress())
            beat = workers.Beat(self.rt.backend, self.rt.worker_id, s.map_slots, s.reduce_slots)
            beating = tg.create_task(beat.loop(self))
            billing = tg.create_task(self._write_usage())
            slots = [
                tg.create_task(self._slot(lambda j: j.queues()[0], self._map, "m"))
                for _ in range(s.map_slots)
            ]
            slots += [
                tg.create_task(self._slot(lambda j: j.queues()[1], self._reduce, "r"))
                for _ in range(s.reduce_slots)
            ]
            try:
                await self.done.wait()
                if self._finished and self.busy:
                    # Tasks still running belong to a job that is gone: they learn it at their
                    # next call (a queue gone, a write refused) and remove what they made.
                    with contextlib.suppress(TimeoutError):
                        # Not wait_for: 3.11's loses a cancellation that comes as we go idle.
                        async with asyncio.timeout(FINISH_GRACE_S):
                            await self._idle.wait()
            finally:
                for t in [*slots, folder, beating, billing]:
                    t.cancel()
            duties = list(self._duties.values())
            if duties:
                _, late = await asyncio.wait(duties, timeout=DUTY_GRACE_S)
                for t in late:
                    t.cancel()
        self._group = None
        # Stopping: every job's row, this worker's last counts and seconds.
        with contextlib.suppress(Exception):
            await asyncio.shield(usage.flush(self.rt.backend, sorted(self.usage_jobs)))
        await self.rt.close_stats()
