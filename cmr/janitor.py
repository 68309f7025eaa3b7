"""Duties, not roles: finishing a job, cleaning it up, and sending lost task messages again.

Any worker performs these when it sees them due; none waits on a particular process, the
submitting client included.

* **Finalize**: a job whose partitions are all committed is published and marked succeeded
  by whoever notices first: the last committer, the next receiver of a committed partition's
  task message (so a committer that died half-way is replaced), or a worker's repair check.
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
from dataclasses import replace
from typing import Any

from cmr import counters, failures, pipeline, wire
from cmr.backends.base import AllOf, Condition, Eq, Missing, Present, Update
from cmr.errors import BackendError, BlobMissing, ConditionFailed, QueueGone, WireError
from cmr.lease import in_background
from cmr.lifecycle import begin_publishing, cleanup, end, job_scratch, reduce_output_url
from cmr.plan import Check
from cmr.publish import OutputConflict, Source, publish
from cmr.records import ACTIVE_PK, JobSpec, JobState, job_pk, step_job_id, task_of
from cmr.runtime import Runtime

WATCH_LEASES = 1.5  # a cleaner silent this many leases (on the watcher's clock) is replaced


async def committed_parts(rt: Runtime, spec: JobSpec) -> list[Source] | None:
    """Every partition's committed output, or None while any is uncommitted. WireError when
    a commit record names anything but the output its own claim uploaded: publication copies
    what the records name into the output, so a record written by someone else must not make
    it publish another job's data or any object the worker can read."""
    items = await rt.backend.table.query(job_pk(spec.job_id), prefix="reduce#")
    done = [i for i in items if i.get("state") == "committed"]
    if len(done) != spec.partitions:
        return None
    sources = []
    for item in done:
        try:
            source = Source(
                task_of(str(item["sk"])),
                str(item["output"]),
                int(item["records"]),
                int(item.get("bytes", 0)),
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            raise WireError(f"the commit record {item.get('sk')!r} is malformed") from None
        own = reduce_output_url(
            spec.scratch, spec.job_id, source.partition, item.get("epoch"), item.get("token")
        )
        if source.url != own:
            raise WireError(
                f"the commit record of partition {source.partition} names "
                f"{source.url[:200]!r}, not one of the job's own reduce outputs"
            )
        # Every reduce commit records its output's digest; one without (of an older worker,
        # or written by someone else) is refused as malformed, for a last step too: one
        # rule for every commit, and no fleet of mixed versions needs the other.
        digest = item.get("sha256")
        if type(digest) is not str or Check(source.bytes, digest).problem():
            raise WireError(
                f"the commit record of partition {source.partition} names no sha256 of its "
                "output (64 lowercase hex digits) or a size out of bounds"
            )
        sources.append(replace(source, sha256=digest))
    if sorted(s.partition for s in sources) != list(range(spec.partitions)):
        raise WireError("the job's commit records do not name each partition once")
    return sources


async def count_commit(rt: Runtime, spec: JobSpec) -> bool:
    """Count one sighting of a committed partition in the job record, and say whether the
    job may now be complete: whether a committer should read every partition's record.
    Reading them after every commit would read partitions² records in a job (10,000
    partitions: 10^8 reads, and minutes).

    The count is returned by the same atomic write that adds to it, so the last counter sees
    every count before its own. A committed partition is counted at least once: by its
    committer, or, if that one died before counting, by whoever receives its task message
    again (it is deleted only after this). Counting twice only makes a reader look early,
    where ``committed_parts`` finds the job not complete; counting never decides anything.
    A count that cannot be written (the store failed) says: look."""
    try:
        item = await rt.backend.table.update(
            Update(
                job_pk(spec.job_id),
                "job",
                add={"partitions_committed": 1},
                condition=Eq("state", JobState.RUNNING.value),
            )
        )
    except ConditionFailed:
        return False  # the job has ended: nothing to finish
    except BackendError:
        return True
    counted = item.get("partitions_committed", 0)
    return "publishing" in item or not isinstance(counted, int) or counted >= spec.partitions


async def finalize(rt: Runtime, spec: JobSpec) -> bool:
    """Publish a job whose partitions are all committed, and mark it succeeded. True once it
    has succeeded (whoever did it); False while it cannot, or if it ended otherwise."""
    be = rt.backend
    try:
        sources = await committed_parts(rt, spec)
    except WireError as exc:
        await failures.fail_job(rt, spec, f"the job cannot be published: {exc}", publisher=True)
        return False
    if sources is None:
        return False
    winners = await be.table.query(job_pk(spec.job_id), prefix="map#")
    try:
        # Checked before anything is published: a job that publishes must succeed.
        counted = await _counter_totals(rt, spec, winners)
    except WireError as exc:
        await failures.fail_job(rt, spec, f"the job cannot be published: {exc}", publisher=True)
        return False
    await rt.step("finalize.begin", job=spec.job_id)
    finished = await begin_publishing(be, spec)
    if finished is None:
        return await _succeeded(rt, spec)
    if not spec.final:
        return await _hand_over(rt, spec, sources, winners, counted)
    await rt.step("publish.marked", job=spec.job_id)
    try:
        await publish(
            be.blobs,
            be.blobs.copy,
            job_id=spec.job_id,
            output=spec.output,
            sources=sources,
            replaces=spec.replaces or None,
            finished=finished,
            after_copy=lambda: rt.step("publish.copied", job=spec.job_id),
        )
    except OutputConflict as exc:
        if await end(be, spec, JobState.FAILED, reason=str(exc), publishing=True):
            rt.log.warning("job failed", job=spec.job_id, reason=str(exc))
            rt.job_ended(spec)
        return False
    except BlobMissing as exc:
        if await _state(rt, spec) != JobState.RUNNING.value:
            # The job ended and was cleaned up under us (another finalizer finished it).
            return await _succeeded(rt, spec)
        # A committed output vanished while the job ran (deleted by hand, or by a lifecycle
        # rule on the scratch): it can never be published.
        reason = f"the job cannot be published: a committed output is missing ({exc})"
        await failures.fail_job(rt, spec, reason, publisher=True)
        return False
    except failures.PASS_THROUGH:
        raise
    except Exception as exc:
        # Publishing errors are bounded too: the finalizers that meet them count them on
        # the job record, and the job fails at once on a permanent one or once the count
        # passes the task attempts (otherwise the next finalizer tries again).
        if await _count_publish_error(rt, spec, exc, "publishing the job's output failed"):
            return False
        raise
    await rt.step("publish.manifest_written", job=spec.job_id)
    totals = await _totals(rt, spec, sources, winners, counted)
    if await end(be, spec, JobState.SUCCEEDED, totals=totals):
        rt.log.info("job succeeded", job=spec.job_id)
        await rt.step("finalize.succeeded", job=spec.job_id)
        rt.job_ended(spec)
    return True


async def _totals(
    rt: Runtime,
    spec: JobSpec,
    sources: list[Source],
    winners: list[dict[str, Any]],
    counted: counters.Totals,
) -> dict[str, Any]:
    """Exact totals from the commit records (the live counters may miss a worker that died
    between its commit and its counter update). The last step of a pipeline adds the
    counters of the steps before it: its record speaks for the run."""
    totals: dict[str, Any] = {
        "records_out": sum(s.records for s in sources),
        "bytes_out": sum(s.bytes for s in sources),
        "records_in": sum(int(i.get("records_in", 0)) for i in winners),
        "bytes_in": sum(int(i.get("bytes_in", 0)) for i in winners),
        "maps_done": len(winners),
    }
    if counted.sums and spec.pipeline:
        totals["step_counters"] = counted.nested()  # this step's own
    if spec.final and spec.step > spec.first_step:
        for k in range(spec.first_step, spec.step):
            earlier = step_job_id(spec.pipeline_id, spec.first_step, k)
            rec = await rt.backend.table.get(job_pk(earlier), "job", consistent=True) or {}
            counted.add_nested(rec.get("step_counters"))
    if counted.sums:
        totals["counters"] = counted.nested()
    if counted.omitted:
        totals["counters_omitted"] = counted.omitted
    return totals


async def _hand_over(
    rt: Runtime,
    spec: JobSpec,
    sources: list[Source],
    winners: list[dict[str, Any]],
    counted: counters.Totals,
) -> bool:
    """A step of a pipeline that is not the last: its committed outputs become the next
    step's input (cmr.pipeline), and the step ends as succeeded, naming the next. Errors
    are bounded as publishing's are."""
    be = rt.backend

    async def made(nxt: JobSpec) -> None:
        await rt.step("pipeline.next_made", job=spec.job_id, next=nxt.job_id)

    try:
        plan = await rt.plan(spec, job_scratch(spec.scratch, spec.job_id))
        totals = await _totals(rt, spec, sources, winners, counted)
        done = await pipeline.hand_over(be, spec, sources, plan.replaced, totals, made)
    except (BlobMissing, WireError, pipeline.HandOverError) as exc:
        reason = f"the next step cannot be made: {exc}"
        await failures.fail_job(rt, spec, reason, publisher=True)
        return False
    except failures.PASS_THROUGH:
        raise
    except Exception as exc:
        if await _count_publish_error(rt, spec, exc, "making the next step failed"):
            return False
        raise
    if done is None:
        return await _succeeded(rt, spec)
    nxt, ended = done
    await rt.step("pipeline.handed_over", job=spec.job_id, next=nxt.job_id)
    if ended:
        rt.log.info("step succeeded", job=spec.job_id, next=nxt.job_id)
        await rt.step("finalize.succeeded", job=spec.job_id)
        rt.job_ended(spec)
    return True


async def _count_publish_error(rt: Runtime, spec: JobSpec, exc: Exception, what: str) -> bool:
    """Count an error of publishing (or handing over) on the job record; True when it failed
    the job: a permanent error, or the count at --max-task-attempts. Otherwise the next
    finalizer tries again."""
    errors = await rt.backend.table.update(
        Update(job_pk(spec.job_id), "job", add={"publish_errors": 1})
    )
    # Publishing errors are raises: bounded as a task's are (--max-task-attempts).
    if isinstance(exc, failures.PERMANENT) or int(errors.get("publish_errors", 0)) >= max(
        1, spec.max_task_failures
    ):
        await failures.fail_job(rt, spec, f"{what}:\n{failures.describe(exc)}", publisher=True)
        return True
    return False


async def _counter_totals(
    rt: Runtime, spec: JobSpec, winners: list[dict[str, object]]
) -> counters.Totals:
    """The job's counters: every winning map commit's and every committed reduce's, each
    once (a record holds only the attempt that won it). WireError on a malformed record."""
    totals = counters.Totals()
    for item in winners:
        try:
            totals.add(counters.decode(item.get("counters")))
        except WireError as exc:
            raise WireError(f"the map commit record {item.get('sk')!r}: {exc}") from None
    for item in await rt.backend.table.query(job_pk(spec.job_id), prefix="reduce#"):
        if item.get("state") != "committed":
            continue
        try:
            totals.add(counters.decode(item.get("counters")))
        except WireError as exc:
            raise WireError(f"the commit record {item.get('sk')!r}: {exc}") from None
    return totals


async def _succeeded(rt: Runtime, spec: JobSpec) -> bool:
    return await _state(rt, spec) == JobState.SUCCEEDED.value


async def _state(rt: Runtime, spec: JobSpec) -> object:
    job = await rt.backend.table.get(job_pk(spec.job_id), "job", consistent=True)
    return None if job is None else job.get("state")


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


__all__ = ["clean", "cleaner_of", "committed_parts", "finalize", "job_scratch", "repair"]
