"""Every way a task can fail, counted and bounded, so that every job ends.

* A task that raises — the job's code, reading its input, the disk, the store, a bug of ours —
  counts one failure in its ``fail#`` record; after ``max_task_failures`` (``--max-task-attempts``:
  runs of one task that raise) the job fails with the last error and its traceback. Its
  message is released for another try at once.
* A permanent error (the input vanished or cannot be read, the store refuses the request as
  invalid, a record that does not validate) fails the job at once: a retry would fail the same.
* A task can also fail without raising: the worker dies on it, or is paused past its lease.
  Such a task is started again (a map task message delivered again, a partition taken over);
  a task started ``max_task_attempts`` times without finishing or raising fails the job. A
  start that ended in a raise is the rule above's, never this one's: starts minus raises.
* Transient errors (throttling, an unreachable service) are the store's, not the task's: the
  worker backs off and the task returns when its lease lapses, bounded by the restarts rule.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from collections.abc import Awaitable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from cmr.backends.base import Item, Received, Update
from cmr.errors import (
    ConditionFailed,
    QueueGone,
    Rejected,
    TaskError,
    Throttled,
    Unreachable,
    UsageError,
    WireError,
)
from cmr.lifecycle import end, write_while_running
from cmr.publish import read_manifest
from cmr.records import JobSpec, JobState, fail_sk, job_pk, reduce_sk
from cmr.runtime import PoolRestarted, Runtime, WorkerCrashed

PERMANENT = (TaskError, Rejected, WireError)
# Not the task's doing: the worker stops or backs off and the task comes back by itself.
PASS_THROUGH = (QueueGone, WorkerCrashed, BrokenProcessPool, PoolRestarted, Throttled, Unreachable)


@dataclass(frozen=True)
class TaskRef:
    id: str  # "m<task>" or "r<partition>": the key of its fail# record
    what: str  # for people: "map task 3", "reduce of partition 2"

    @staticmethod
    def map(task: int) -> TaskRef:
        return TaskRef(f"m{task}", f"map task {task}")

    @staticmethod
    def reduce(partition: int) -> TaskRef:
        return TaskRef(f"r{partition}", f"reduce of partition {partition}")


def describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=-8))


def headline(error: str) -> tuple[str, str]:
    """A task's error as (the one line that says what went wrong, the rest): user code's
    errors begin with it (``J.map raised ValueError: boom``, then the user's frames); a bare
    traceback ends with it."""
    # "\n" only: splitlines() would also break at a \r or \u2028 inside the user's message.
    lines = error.strip().split("\n")
    if not lines:
        return "?", ""
    if lines[0].startswith("Traceback"):
        return lines[-1], "\n".join(lines)
    return lines[0], "\n".join(lines[1:])


async def guarded(
    rt: Runtime, spec: JobSpec, task: TaskRef, queue: str, msg: Received, work: Awaitable[None]
) -> None:
    """Run a task; whatever it raises is counted against it (see the module docstring)."""
    try:
        await work
    except PASS_THROUGH:
        raise
    except Exception as exc:
        permanent = isinstance(exc, PERMANENT)
        await task_failed(rt, spec, task, describe(exc), queue, msg, permanent=permanent)


async def task_failed(
    rt: Runtime,
    spec: JobSpec,
    task: TaskRef,
    error: str,
    queue: str,
    msg: Received,
    *,
    permanent: bool = False,
) -> None:
    """Count a failure; retry the task at once, or fail the job once it keeps failing."""
    last, details = headline(error)
    if permanent:
        # Per attempt: the worker's log (INFO) and -v; the job's reason carries it to the user.
        rt.log.info("task cannot succeed", job=spec.job_id, task=task.what, error=last)
        reason = f"{task.what} failed, and would fail again: {last}"
        await fail_job(rt, spec, f"{reason}\n{details}" if details else reason)
        return
    item = await _count(rt, spec, task, set_={"error": error[-4000:]}, add={"count": 1})
    if item is None:
        return  # the job ended meanwhile
    failures = int(item.get("count", 0))
    # One line per attempt is the worker's log (INFO) and -v's; `cmr status` shows the count.
    rt.log.info("task failed", job=spec.job_id, task=task.what, failures=failures, error=last)
    if failures >= spec.max_task_failures:
        # The reason's first line says what went wrong; the user's frames follow it.
        reason = (
            f"{task.what} failed {_times(failures)} (--max-task-attempts "
            f"{spec.max_task_failures}): {last}"
        )
        await fail_job(rt, spec, f"{reason}\n{details}" if details else reason)
        return
    await rt.add_stats(spec.job_id, Counter(tasks_retried=1))
    await rt.backend.queues.change_visibility(queue, [msg.receipt], 0)


async def map_redelivered(rt: Runtime, spec: JobSpec, task: TaskRef) -> bool:
    """A map task's message came back and the task is not done: it starts again. False once
    it has started too often without finishing or raising (the job was failed)."""
    item = await _count(rt, spec, task, add={"starts": 1})
    if item is None:
        return False  # the job ended meanwhile
    # "starts" counts deliveries before this one; those that raised are counted apart.
    return await _bounded(rt, spec, task, 1 + int(item.get("starts", 0)), item)


async def _count(
    rt: Runtime,
    spec: JobSpec,
    task: TaskRef,
    *,
    set_: Item | None = None,
    add: dict[str, int],
) -> Item | None:
    """Count in the task's fail# record while the job runs; the record as it is now, or None
    if the job has ended (a late worker must not leave a record its cleanup missed)."""
    key = (job_pk(spec.job_id), fail_sk(task.id))
    try:
        await write_while_running(rt.backend, spec.job_id, Update(*key, set_=set_, add=add))
    except ConditionFailed:
        return None
    return await rt.backend.table.get(*key, consistent=True)


async def reduce_claimed(rt: Runtime, spec: JobSpec, partition: int, epoch: int) -> bool:
    """The partition was claimed for the ``epoch``-th time. False once it was started too
    often without finishing or raising.

    A straggler's backup (cmr.backup) that took the claim over is one claim more that lost
    no start: the straggler it fenced out was alive. It is not counted: the take-over marks
    the claim record ``backup``, which the claims after it keep (one backup a partition)."""
    if epoch <= 1:
        return True
    task = TaskRef.reduce(partition)
    pk = job_pk(spec.job_id)
    # Consistent: the raise that released the last claim was counted before its release.
    item, held = await asyncio.gather(
        rt.backend.table.get(pk, fail_sk(task.id), consistent=True),
        rt.backend.table.get(pk, reduce_sk(partition), consistent=True),
    )
    fenced = 1 if (held or {}).get("backup") is True else 0
    return await _bounded(rt, spec, task, epoch - fenced, item or {})


async def _bounded(rt: Runtime, spec: JobSpec, task: TaskRef, starts: int, item: Item) -> bool:
    """``starts``: this start and all before it. Those that raised are bounded by
    ``max_task_failures`` (and released at once); the rest never finished: their workers died,
    were stopped or lost the lease, and ``max_task_attempts`` bounds those."""
    raised = int(item.get("count", 0))
    lost = max(1, starts - raised)  # this start, and the ones before that never ended
    if lost == 1:
        return True  # a first try, or a retry after a raise: nothing was lost
    await rt.add_stats(spec.job_id, Counter(tasks_restarted=1))
    if lost <= spec.max_task_attempts:
        return True
    reason = (
        f"{task.what} was started {lost} times without finishing or raising: the workers "
        f"that took it died or were stopped (out of memory? killed?) or lost its lease"
    )
    if raised:
        last, details = headline(str(item.get("error", "")))
        reason += f"; it also raised {_times(raised)}, last: {last}\n{details}"
    else:
        reason += ". It never raised: look in the workers' logs."
    await fail_job(rt, spec, reason.rstrip())
    return False


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


async def fail_job(rt: Runtime, spec: JobSpec, reason: str, *, publisher: bool = False) -> None:
    """End the job as failed, and start its cleanup. Once a job is publishing, only its
    publishers (``publisher``: a finalizer whose publication cannot succeed) may fail it, and
    only while its manifest is not written. Anyone else could race a publisher whose
    manifest write is in flight, and leave a failed job's manifest as the output; every
    partition is committed by then, so a late task failure changes nothing anyway."""
    try:
        ended = await end(rt.backend, spec, JobState.FAILED, reason=reason)
    except UsageError:  # publishing
        if not publisher:
            rt.log.info(
                "not failing a job that is publishing: its finalizers decide how it ends",
                job=spec.job_id,
                reason=reason.splitlines()[0],
            )
            return
        current, _ = await read_manifest(rt.backend.blobs, spec.output)
        if current is not None and current.job == spec.job_id:
            return  # its output is published: finishing it is a finalizer's duty
        ended = await end(rt.backend, spec, JobState.FAILED, reason=reason, publishing=True)
    if ended:
        # INFO: whoever waits on the job (`cmr run`, `cmr wait`) prints the reason as its error.
        rt.log.info("job failed", job=spec.job_id, reason=reason.splitlines()[0])
    rt.job_ended(spec)
