"""A job's state changes and its cleanup.

    submit ──► running ──► (publishing) ──► succeeded ─┐
                  │                                    ├──► cleaned (job record kept)
                  └──────► failed / cancelled ─────────┘

Every change of state is one transaction over the job record, its row in the job list, its
row in the active index and its claim on the output place, so no reader ever sees a finished
job listed as running, whoever died half-way. Once a job publishes, it can no longer be
cancelled: its output is about to become the output. Any process may run any of these, any
number of times, concurrently; each is idempotent, and the token of a transaction makes a
retry after a lost answer apply once.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from cmr import attempts, clock, logs
from cmr.backends.base import (
    MAX_TX_WRITES,
    AllOf,
    AnyOf,
    Backend,
    Check,
    Delete,
    Eq,
    Item,
    Missing,
    Put,
    TxWrite,
    Update,
    item_absent,
)
from cmr.errors import BlobMissing, ConditionFailed, NotFound, QueueGone, UsageError, WireError
from cmr.plan import load_plan, plan_url
from cmr.publish import part_name, remove_parts
from cmr.records import (
    ACTIVE_PK,
    FINAL_STATES,
    JOBS_PK,
    OUTPUTS_PK,
    JobSpec,
    JobState,
    job_pk,
    step_job_id,
    task_pages,
)
from cmr.sidefiles import side_files_url

log = logs.get_logger("cmr.lifecycle")

Step = Callable[[str, dict[str, Any]], Awaitable[None]]  # a named point; see runtime.STEPS


async def no_step(name: str, context: dict[str, Any]) -> None:
    return None


def job_scratch(scratch: str, job_id: str) -> str:
    return f"{scratch.rstrip('/')}/jobs/{job_id}/"


def spill_url(scratch: str, job_id: str, task: int, attempt: str, p: int, seq: int) -> str:
    """Where a map attempt puts a batch's pairs too big for a message. A spilled batch must
    name exactly this URL for its own tag: a message can then make a reducer read nothing but
    the blob its tag's attempt wrote (not a large object, not another job's data)."""
    return f"{job_scratch(scratch, job_id)}spill/{task}-{attempt}-{p}-{seq}"


def shuffle_url(scratch: str, job_id: str, task: int, attempt: str) -> str:
    """Where a map attempt of a blob-shuffle job puts its batches (cmr.bulk). Derived, never
    read from a record: a commit can make a reducer read only its own attempt's object."""
    return f"{job_scratch(scratch, job_id)}shuffle/{task}-{attempt}"


def reduce_output_url(scratch: str, job_id: str, p: int, epoch: object, token: object) -> str:
    """Where the claim (epoch, token) of partition ``p`` uploads its output before it commits:
    a commit record must name exactly this for its own claim (cmr.finalize checks it)."""
    return f"{job_scratch(scratch, job_id)}out/p{p:05d}-e{epoch}-{token}"


def _token() -> str:
    return secrets.token_hex(16)


def while_running(job_id: str) -> Check:
    """A transaction's guard: the job is still running. A worker that wakes up after its job
    ended (paused, or slow) can then never write a record its cleanup would not see."""
    return Check(ACTIVE_PK, job_id, Eq("state", JobState.RUNNING.value))


async def write_while_running(backend: Backend, job_id: str, write: Put | Update) -> None:
    """One write, applied only while the job runs. ConditionFailed if its own condition is
    false or the job has ended."""
    await backend.table.transact([write, while_running(job_id)], token=_token())


async def write_all_while_running(backend: Backend, job_id: str, writes: Sequence[Put]) -> None:
    """Writes applied only while the job runs, as many to a transaction as one takes (each
    transaction all or nothing; a failure midway leaves earlier ones applied, as records of
    a job its cleanup deletes). ConditionFailed if the job has ended."""
    step = MAX_TX_WRITES - 1
    for i in range(0, len(writes), step):
        chunk: list[TxWrite] = [*writes[i : i + step], while_running(job_id)]
        await backend.table.transact(chunk, token=_token())


async def record_submit(backend: Backend, spec: JobSpec, extra: Item) -> None:
    """Make a job exist: its record, its rows in the job list and active index, and its claim
    on the output place, all at once. UsageError when another running job owns the output."""
    now = clock.wall()
    row = {"state": JobState.RUNNING.value, "created": now}
    writes: list[TxWrite] = [
        Put(job_pk(spec.job_id), "job", {**spec.to_item(), **extra, **row}, item_absent()),
        Put(JOBS_PK, spec.job_id, row),
        Put(ACTIVE_PK, spec.job_id, row),
        Put(
            OUTPUTS_PK,
            spec.output,
            {"job": spec.job_id, "active": True, "since": now},
            AnyOf((Missing("pk"), Eq("active", False))),
        ),
    ]
    try:
        await backend.table.transact(writes, token=_token())
    except ConditionFailed:
        held = await backend.table.get(OUTPUTS_PK, spec.output) or {}
        other = str(held.get("job", "?"))
        raise UsageError(
            f"the output {spec.output} belongs to job {other}, which is still running: wait "
            f"for it (`cmr wait {other}`), cancel it (`cmr cancel {other}`), or choose "
            f"another output"
        ) from None


async def begin_publishing(backend: Backend, spec: JobSpec) -> float | None:
    """Mark the job as publishing (it can no longer be cancelled); returns the time the first
    publisher marked it, which every publisher writes into the manifest. None: it ended."""
    pk = job_pk(spec.job_id)
    now = clock.wall()
    try:
        await backend.table.update(
            Update(
                pk,
                "job",
                set_={"publishing": now},
                condition=AllOf((Eq("state", JobState.RUNNING.value), Missing("publishing"))),
            ),
        )
    except ConditionFailed:
        job = await backend.table.get(pk, "job", consistent=True)
        if job is None or job.get("state") != JobState.RUNNING.value:
            return None
        return float(job["publishing"])
    return now


async def end(
    backend: Backend,
    spec: JobSpec,
    state: JobState,
    *,
    reason: str = "",
    totals: dict[str, Any] | None = None,
    publishing: bool = False,
) -> bool:
    """Move a running job to a final state; False if it had one already (nothing of ours was
    written). A job that is publishing ends only as succeeded, or (``publishing=True``) as
    failed by its own publisher, whose manifest was refused."""
    now = clock.wall()
    pk = job_pk(spec.job_id)
    fields: dict[str, Any] = {**(totals or {}), "state": state.value, "finished": now}
    if reason:
        fields["error"] = reason[-8000:]
    running = Eq("state", JobState.RUNNING.value)
    condition = (
        running
        if state == JobState.SUCCEEDED or publishing
        else AllOf((running, Missing("publishing")))
    )
    claim: dict[str, Any] = {"active": False}
    if state == JobState.SUCCEEDED:
        claim["published"] = spec.job_id
    writes: list[TxWrite] = [
        Update(pk, "job", set_=fields, condition=condition),
        # The job list has one row per pipeline (its first job's id): any step's end ends
        # the run (a step that hands over ends in cmr.pipeline's own transaction instead).
        Update(JOBS_PK, spec.pipeline_id, set_={"state": state.value, "finished": now}),
        # The row stays: cleaning up is the duty left, and any worker may take it.
        Update(ACTIVE_PK, spec.job_id, set_={"state": state.value}),
        Update(
            OUTPUTS_PK,
            spec.output,
            set_=claim,
            condition=AnyOf((Missing("pk"), Eq("job", spec.job_id))),
        ),
    ]
    try:
        await backend.table.transact(writes, token=_token())
    except ConditionFailed:
        job = await backend.table.get(pk, "job", consistent=True)
        if job is None or job.get("state") != JobState.RUNNING.value:
            return False  # ended already, by someone else
        if "publishing" in job and not (state == JobState.SUCCEEDED or publishing):
            raise UsageError(
                f"job {spec.job_id} is publishing its output and can no longer be "
                f"cancelled or failed; it will end in a moment (`cmr wait {spec.job_id}`)"
            ) from None
        # The output claim is not ours (a record changed by hand?): end the job all the same.
        await backend.table.transact(writes[:3], token=_token())
    return True


async def mark_cleaned(backend: Backend, spec: JobSpec) -> None:
    """The last step of cleanup: the job leaves the active index."""
    final = AnyOf(tuple(Eq("state", s.value) for s in sorted(FINAL_STATES)))
    with contextlib.suppress(ConditionFailed):  # not ended: nothing to mark
        await backend.table.transact(
            [
                Update(job_pk(spec.job_id), "job", set_={"cleaned": True}, condition=final),
                Delete(ACTIVE_PK, spec.job_id),
            ],
            token=_token(),
        )


CLEANUP_CONCURRENCY = 32  # deletes in flight: one at a time, thousands of records take minutes


async def cleanup(backend: Backend, spec: JobSpec, state: JobState, step: Step = no_step) -> None:
    """Remove what an ended job leaves behind: the parts its output replaced (succeeded) or its
    own unpublished parts (failed, cancelled), its queues, scratch blobs and task records;
    keep the job record and its timeline. Idempotent, and safe to stop anywhere: run it again."""
    pk = job_pk(spec.job_id)
    scratch = job_scratch(spec.scratch, spec.job_id)
    if state == JobState.SUCCEEDED and not spec.final:
        pass  # a step that handed over: the output place is the last step's to change
    elif state == JobState.SUCCEEDED:
        try:
            plan = await load_plan(backend.blobs, scratch, spec.plan_digest, tasks=False)
        except (BlobMissing, WireError):
            pass  # the scratch is gone: a cleanup before ours got past this point
        else:
            await remove_parts(backend.blobs, spec.output, plan.replaced)
    else:
        own = [part_name(spec.job_id, p) for p in range(spec.partitions)]
        await remove_parts(backend.blobs, spec.output, own)
    await step("cleanup.output", {"job": spec.job_id})
    in_q, reduce_q, part_qs = spec.queues()
    gate = asyncio.Semaphore(CLEANUP_CONCURRENCY)

    async def delete_queue(name: str) -> None:
        async with gate:
            with contextlib.suppress(QueueGone):
                await backend.queues.delete(name)

    async def delete_item(sk: str) -> None:
        async with gate:
            await backend.table.delete(pk, sk)

    await asyncio.gather(*(delete_queue(n) for n in (in_q, reduce_q, *part_qs)))
    await step("cleanup.queues", {"job": spec.job_id})
    if state == JobState.SUCCEEDED and not spec.final:
        # Its committed outputs are the next step's input: they go with the next step's
        # cleanup. The rest (spilled values, shuffle objects, staged input, the plan) goes now.
        for below in ("spill/", "shuffle/", "input/"):
            await backend.blobs.delete_prefix(scratch + below)
        await backend.blobs.delete([plan_url(scratch)])
    else:
        await backend.blobs.delete_prefix(scratch)
    if spec.step > spec.first_step and state != JobState.FAILED:
        # The previous step's outputs were this step's input. A failed step keeps them: the
        # run can resume from them (`cmr run --from-step`), until `cmr cleanup`.
        previous = step_job_id(spec.pipeline_id, spec.first_step, spec.step - 1)
        await backend.blobs.delete_prefix(job_scratch(spec.scratch, previous))
    if spec.final or state != JobState.SUCCEEDED:
        # The run is over: its side files, staged once for every step, go.
        await backend.blobs.delete_prefix(side_files_url(spec.scratch, spec.pipeline_id))
    await step("cleanup.scratch", {"job": spec.job_id})
    # A blob job's pages, one map task's at a time: all of them at once would be held in
    # memory (100 TB sorted in 3,125 tasks of 1,280 partitions: 62,500 items, ~220 MB).
    for t in range(spec.maps if spec.shuffle == "blob" else 0):
        items = await backend.table.query(pk, prefix=task_pages(t))
        await asyncio.gather(*(delete_item(str(item["sk"])) for item in items))
    # The attempts are kept as the job's timeline (cmr.attempts) before their rows go.
    await attempts.fold(backend, spec.job_id)
    # Then every record left, pages a table writer made for no task included.
    for prefix in ("map#", "page#", "fail#", "reduce#", "bk#", attempts.PREFIX):
        items = await backend.table.query(pk, prefix=prefix)
        await asyncio.gather(*(delete_item(str(item["sk"])) for item in items))
    await step("cleanup.records", {"job": spec.job_id})
    await mark_cleaned(backend, spec)
    await step("cleanup.done", {"job": spec.job_id})


async def load_spec(backend: Backend, job_id: str) -> tuple[JobSpec, dict[str, Any]]:
    """A job's spec and record, as the table has them now."""
    item = await backend.table.get(job_pk(job_id), "job")
    if item is None:
        raise NotFound(f"no job {job_id} in this backend's table (see `cmr status`)")
    return JobSpec.from_item(job_id, item), item
