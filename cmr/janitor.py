"""Duties, not roles: finishing a job, cleaning it up, and sending lost task messages again.

Any worker performs these when it sees them due; none waits on a particular process, the
submitting client included.

* **Finalize** (cmr.finalize): a job whose partitions are all committed is published and
  marked succeeded by whoever notices first; a worker's repair check is one of them.
* **Clean up**: an ended job keeps its row in the active index until it is cleaned. The
  worker that ended it cleans at once; others watch the row, and if its cleaner stops
  beating for one and a half leases (each on its own clock), one takes over.
* **Repair**: a running job whose queues are both empty, twice in a row, yet has tasks not
  done lost their messages (a queue's retention ran out, a purge): they are sent again from
  the plan, which is harmless if they were not lost after all (duplicates are the rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator

from cmr import failures, usage, wire
from cmr.backends.base import AllOf, Condition, Eq, Missing, Present, Update
from cmr.errors import BackendError, ConditionFailed, QueueGone, WireError
from cmr.finalize import committed_parts, finalize
from cmr.lease import in_background
from cmr.lifecycle import cleanup
from cmr.records import ACTIVE_PK, JobSpec, JobState, job_pk, task_of
from cmr.runtime import Runtime

WATCH_LEASES = 1.5  # a cleaner silent this many leases (on the watcher's clock) is replaced

Seen = tuple[object, object]  # (cleaner token, beat) of an active row, as a watcher saw it


def cleaner_of(row: dict[str, object]) -> Seen:
    return row.get("cleaner"), row.get("cbeat")


async def take_cleanup(rt: Runtime, spec: JobSpec, token: str, seen: Seen | None) -> bool:
    """Become the job's cleaner: at once when nobody is (``seen`` None), or in place of the
    silent cleaner a watcher saw. The row must still exist: a cleaned job stays cleaned."""
    free: Condition
    if seen is None or seen[0] is None:
        free = Missing("cleaner")
    else:
        free = AllOf((Eq("cleaner", seen[0]), Eq("cbeat", seen[1])))
    try:
        await rt.backend.table.update(
            Update(
                ACTIVE_PK,
                spec.job_id,
                set_={"cleaner": token, "cbeat": 0},
                condition=AllOf((Present("pk"), free)),
            ),
        )
    except ConditionFailed:
        row = await rt.backend.table.get(ACTIVE_PK, spec.job_id, consistent=True)
        return row is not None and row.get("cleaner") == token  # a retry of our own write
    return True


@contextlib.asynccontextmanager
async def _beating(rt: Runtime, spec: JobSpec, token: str) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            await asyncio.sleep(max(0.2, spec.visibility_s / 3))
            await rt.awake.wait()
            try:
                await rt.backend.table.update(
                    Update(
                        ACTIVE_PK,
                        spec.job_id,
                        add={"cbeat": 1},
                        condition=AllOf((Present("pk"), Eq("cleaner", token))),
                    ),
                )
            except ConditionFailed:
                return  # cleaned, or taken over: cleanup is idempotent, we simply go on
            except BackendError:
                continue

    async with in_background(beat()):
        yield


async def clean(rt: Runtime, spec: JobSpec, seen: Seen | None) -> None:
    """The cleanup duty of an ended job, if we can take it (see take_cleanup)."""
    token = secrets.token_hex(8)
    if not await take_cleanup(rt, spec, token, seen):
        return
    job = await rt.backend.table.get(job_pk(spec.job_id), "job", consistent=True)
    if job is None or job.get("state") not in {s.value for s in JobState} - {"running"}:
        return
    async with _beating(rt, spec, token):
        await cleanup(rt.backend, spec, JobState(str(job["state"])), rt.hook_step)
    # The job's cost as this process saw it, after its cleanup (cleanup keeps usage rows).
    await usage.flush(rt.backend, [spec.job_id])
    rt.forget_job(spec.job_id)
    rt.log.info("job cleaned up", job=spec.job_id)


async def repair(rt: Runtime, spec: JobSpec, before: int | None) -> int | None:
    """One repair check of a running job. Returns the job's count of repairs when both its
    task queues were empty (None otherwise); the caller passes it back at its next check, and
    lost messages are sent again only when the queues were empty at both checks with no
    repair in between, by the one worker whose conditional count wins."""
    in_q, reduce_q, _ = spec.queues()
    queues, table = rt.backend.queues, rt.backend.table
    job = await table.get(job_pk(spec.job_id), "job", consistent=True) or {}
    if "publishing" in job:
        # Its publisher died or stopped (nothing else can end it now): publish it ourselves,
        # whatever its queues still hold.
        await finalize(rt, spec)
        return None
    try:
        counts = await asyncio.gather(queues.counts(in_q), queues.counts(reduce_q))
    except QueueGone:
        # A running job without its queues can never finish: they were deleted by hand,
        # or its submitter died half-way through submitting.
        await failures.fail_job(rt, spec, "the job's queues were deleted while it ran")
        return None
    if any(sum(c) for c in counts):
        return None
    pk = job_pk(spec.job_id)
    job = await table.get(pk, "job", consistent=True) or {}
    repairs = int(job.get("repairs", 0))
    try:
        ready = await committed_parts(rt, spec) is not None
    except WireError:
        ready = True  # forged commit records: finalize fails the job with the reason
    if ready:
        await finalize(rt, spec)
        return repairs
    if before != repairs:
        return repairs
    try:
        await table.update(
            Update(
                pk,
                "job",
                add={"repairs": 1},
                condition=Eq("repairs", repairs) if repairs else Missing("repairs"),
            ),
        )
    except ConditionFailed:
        return None  # another worker repairs it
    maps_done = {task_of(str(i["sk"])) for i in await table.query(pk, prefix="map#")}
    reduced = {
        task_of(str(i["sk"]))
        for i in await table.query(pk, prefix="reduce#")
        if i.get("state") == "committed"
    }
    lost_maps = [t for t in range(spec.maps) if t not in maps_done]
    lost_reduces = [p for p in range(spec.partitions) if p not in reduced]
    rt.log.warning(
        "task messages lost from the job's queues; sending them again from the plan",
        job=spec.job_id,
        maps=len(lost_maps),
        reduces=len(lost_reduces),
    )
    await queues.send(in_q, [wire.encode(wire.MapTask(spec.job_id, t)) for t in lost_maps])
    await queues.send(
        reduce_q, [wire.encode(wire.ReduceTask(spec.job_id, p)) for p in lost_reduces]
    )
    await rt.add_stats(spec.job_id, Counter(tasks_resent=len(lost_maps) + len(lost_reduces)))
    return None


__all__ = ["clean", "cleaner_of", "repair", "take_cleanup"]
