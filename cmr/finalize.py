"""Finalizing: a job whose partitions are all committed is published and marked succeeded.

Whoever notices first does it, and any number may try at once (duplicates are the rule):
the last committer, the next receiver of a committed partition's task message (so a
committer that died half-way is replaced), or a worker's repair check (cmr.janitor). A
committer counts its commit on the job record first (``count_commit``), so that only the
last ones read every partition's record (``committed_parts``).

The last step of a job publishes its committed parts into the output place (cmr.publish);
a step of a pipeline that is not the last hands them over to the next step instead
(cmr.pipeline). Errors of either are bounded as a task's are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cmr import counters, failures, pipeline
from cmr import digest as digests
from cmr.backends.base import Eq, Update
from cmr.errors import BackendError, BlobMissing, ConditionFailed, WireError
from cmr.lifecycle import begin_publishing, end, job_scratch, reduce_output_url
from cmr.plan import Check
from cmr.publish import OutputConflict, Source, publish
from cmr.records import JobSpec, JobState, job_pk, step_job_id, task_of
from cmr.runtime import Runtime


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
            if not 0 <= task_of(str(item["sk"])) < spec.partitions:
                raise ValueError("no partition of the job")
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
        digest = item.get(digests.NAME)
        if type(digest) is not str or Check(source.bytes, digest).problem():
            raise WireError(
                f"the commit record of partition {source.partition} names no {digests.NAME} "
                "digest of its output (64 lowercase hex digits) or a size out of bounds"
            )
        sources.append(replace(source, digest=digest))
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
    except Exception as exc:
        # Publishing errors are bounded too: the finalizers that meet them count them on
        # the job record, and the job fails at once on a permanent one or once the count
        # passes the task attempts (otherwise the next finalizer tries again).
        return await _bounded(rt, spec, exc, "publishing the job's output failed")
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
    except Exception as exc:
        return await _bounded(rt, spec, exc, "making the next step failed")
    if done is None:
        return await _succeeded(rt, spec)
    nxt, ended = done
    await rt.step("pipeline.handed_over", job=spec.job_id, next=nxt.job_id)
    if ended:
        rt.log.info("step succeeded", job=spec.job_id, next=nxt.job_id)
        await rt.step("finalize.succeeded", job=spec.job_id)
        rt.job_ended(spec)
    return True


async def _bounded(rt: Runtime, spec: JobSpec, exc: Exception, what: str) -> bool:
    """An error of publishing (or handing over) that no other rule takes: counted on the job
    record. False (the finalizer's answer) once it failed the job: a permanent error, or the
    count at --max-task-attempts; otherwise it is raised again, and the next finalizer tries.
    Errors that are not the job's doing (failures.PASS_THROUGH: the worker stops or backs
    off) are raised again uncounted, as a task's are."""
    if isinstance(exc, failures.PASS_THROUGH):
        raise exc
    errors = await rt.backend.table.update(
        Update(job_pk(spec.job_id), "job", add={"publish_errors": 1})
    )
    # Publishing errors are raises: bounded as a task's are (--max-task-attempts).
    if isinstance(exc, failures.PERMANENT) or int(errors.get("publish_errors", 0)) >= max(
        1, spec.max_task_failures
    ):
        await failures.fail_job(rt, spec, f"{what}:\n{failures.describe(exc)}", publisher=True)
        return False
    raise exc


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


__all__ = ["committed_parts", "count_commit", "finalize"]
