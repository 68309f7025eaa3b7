"""Pipelines: a job of several steps, each step a job of its own, chained through the store.

One submission makes the first step's job. When a step's partitions are all committed, the
worker that finalizes it (any worker: ``cmr.finalize``) *hands over* instead of publishing:

1. it marks the step as publishing (from then on the step can only succeed, and a worker's
   repair check finalizes it again if this one dies);
2. it makes the next step's job from the step's committed outputs: a plan whose map tasks
   read those outputs whole (as pairs), its queues and its task messages;
3. in one transaction: the next step's record and row in the active index, the output
   place's claim passed from this step to the next, and this step ended as succeeded,
   naming the next (so no reader ever sees one without the other).

Every part is idempotent and derived only from the step's record and commits (the next
step's id, plan and queues are the same whoever makes them), so any number of workers may
hand over at once, and any may die half-way: duplicates of task messages are the rule the
protocol already handles. Only the last step publishes the job's output, fenced as a
one-step job's is. The pipeline's row in the job list (its first job's id) says where the
pipeline stands: running (at step n), or how it ended.

A step's committed outputs are kept until the next step is cleaned up (they are its
input); when the next step failed they are kept still, so the run can resume from them
(``cmr run --from-step``), until ``cmr cleanup`` removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from cmr import clock, wire
from cmr.backends.base import Backend, Eq, Put, TxWrite, Update, item_absent
from cmr.errors import BackendError, CmrError, ConditionFailed, QueueGone, UsageError
from cmr.lifecycle import _token, job_scratch
from cmr.plan import Check, Plan, plan_url
from cmr.publish import Source
from cmr.records import ACTIVE_PK, JOBS_PK, OUTPUTS_PK, JobSpec, JobState, job_pk, step_job_id
from cmr.wire import Range

TASK_BYTES = 64 * 1024 * 1024  # a next step's map task reads about this much of the outputs
TASK_PARTS = 200  # and at most this many of them (small parts are packed together)
# Fields of the first step's record every step's record carries (what `cmr status` and a
# waiting client show about the run as a whole).
CARRIED = ("input", "user_output", "fetch")


def outputs_root(spec: JobSpec) -> str:
    """Where a step's reduce outputs lie (cmr.lifecycle.reduce_output_url): the next step's
    input root."""
    return job_scratch(spec.scratch, spec.job_id) + "out/"


def next_tasks(sources: Sequence[Source]) -> list[tuple[Range, ...]]:
    """The next step's map tasks: each committed output read whole (a stream of pairs has no
    boundaries to cut at), small ones packed together, in partition order."""
    tasks: list[tuple[Range, ...]] = []
    pending: list[Range] = []
    held = 0
    for s in sorted(sources, key=lambda s: s.partition):
        if s.bytes == 0:
            continue  # an empty part has no pairs
        pending.append(Range(s.url, 0, s.bytes, f"part-{s.partition:05d}"))
        held += s.bytes
        if held >= TASK_BYTES or len(pending) >= TASK_PARTS:
            tasks.append(tuple(pending))
            pending, held = [], 0
    if pending:
        tasks.append(tuple(pending))
    if not tasks:
        # Nothing to read: one task over nothing still runs the step's map hooks and lets
        # its reducers see every map committed.
        first = min(sources, key=lambda s: s.partition)
        tasks.append((Range(first.url, 0, 0, f"part-{first.partition:05d}"),))
    return tasks


def next_checks(sources: Sequence[Source]) -> dict[str, Check]:
    """What each committed output must be when the next step reads it: the size and digest
    its commit recorded. The plan holds them, and the job record names the plan's digest,
    so a bucket writer who replaces a part makes the next step fail, not read other bytes."""
    return {s.url: Check(s.bytes, s.digest) for s in sources}


def next_spec(spec: JobSpec, plan_digest: str, maps: int) -> JobSpec:
    step = spec.step + 1
    return replace(
        spec,
        job_id=step_job_id(spec.pipeline_id, spec.first_step, step),
        maps=maps,
        partitions=spec.step_partitions[step - spec.first_step],
        plan_digest=plan_digest,
        input_root=outputs_root(spec),
        input_roots=(),  # the step before's outputs, not the run's inputs
        input_globs=(),
        step=step,
        pipeline=spec.pipeline_id,
        input_format="pairs",  # what every step but the job's last writes
    )


class HandOverError(CmrError):
    """The next step cannot be made, ever (the step is failed with this reason)."""


# A next step's record a hand-over takes as its own holds exactly what the hand-over writes
# (whoever can write the table can write one first): every field of the spec and of the
# extras, and none of the spec's optional fields that it leaves out. Only what the
# transaction's row and later writers add (state, created, counters, finished, ...) may
# differ. These are the spec's fields ``JobSpec.to_item`` leaves out when empty.
_SAME = ("step", "first_step", "last_step", "pipeline", "step_partitions", "job_steps",
         "input_roots", "input_globs", "files", "shuffle")  # fmt: skip


async def hand_over(
    be: Backend,
    spec: JobSpec,
    sources: Sequence[Source],
    replaced: Sequence[str],
    totals: dict[str, Any],
    made: Callable[[JobSpec], Awaitable[None]],
) -> tuple[JobSpec, bool] | None:
    """Make the next step's job from this step's committed outputs and end this step, naming
    it, in one transaction (steps 2 and 3 above). Returns (the next step's spec, whether
    this call ended this step), or None when this step ended without a next (it failed).
    ``replaced``: the parts of the output place the last step's publication replaces;
    ``totals``: this step's, for its record; ``made`` is awaited once the next step's plan,
    queues and tasks exist (a test's crash point). HandOverError when it can never be made."""
    tasks = next_tasks(sources)
    data = Plan(tuple(tasks), tuple(replaced), checks=next_checks(sources)).to_bytes()
    nxt = next_spec(spec, Plan.digest(data), len(tasks))
    await _drop_orphans(be, spec, sources)
    await be.blobs.put(plan_url(job_scratch(nxt.scratch, nxt.job_id)), data)
    in_q, reduce_q, part_qs = nxt.queues()
    await asyncio.gather(
        *(be.queues.create(q, visibility_s=nxt.visibility_s) for q in (in_q, reduce_q, *part_qs))
    )
    await be.queues.send(in_q, [wire.encode(wire.MapTask(nxt.job_id, i)) for i in range(nxt.maps)])
    await be.queues.send(
        reduce_q, [wire.encode(wire.ReduceTask(nxt.job_id, p)) for p in range(nxt.partitions)]
    )
    await made(nxt)
    record = await be.table.get(job_pk(spec.job_id), "job", consistent=True) or {}
    extra = {k: record[k] for k in CARRIED if k in record}
    extra["input_bytes"] = sum(s.bytes for s in sources)
    extra["inputs"] = len(sources)
    if record.get("state") == JobState.RUNNING.value:
        try:
            await _record(be, spec, nxt, extra, totals)
        except ConditionFailed:
            pass  # decided by someone else: see below what stands
        else:
            return nxt, True
    held = await be.table.get(job_pk(nxt.job_id), "job", consistent=True)
    if held is None:
        mine = await be.table.get(job_pk(spec.job_id), "job", consistent=True) or {}
        if mine.get("state") == JobState.RUNNING.value:
            raise HandOverError(
                f"the output place {spec.output} is no longer claimed by this step (its "
                "claim record was changed)"
            )
        await _undo(be, nxt, plan=True)  # the step failed: what we made serves nobody
        return None
    expected = {**nxt.to_item(), **extra}
    differ = sorted(k for k in {*expected, *_SAME} if held.get(k) != expected.get(k))
    mine = await be.table.get(job_pk(spec.job_id), "job", consistent=True) or {}
    # The transaction that makes the next step's record ends this step naming it: a record
    # without that end, or not the one a hand-over writes, was written by someone else.
    ended = mine.get("state") == JobState.SUCCEEDED.value and mine.get("next") == nxt.job_id
    if differ or not ended:
        if not ended:
            await _undo(be, nxt, plan=True)  # what we made must not serve a stranger's record
        why = (
            f"its {', '.join(differ[:4])} differ from what this step hands over"
            if differ
            else f"this step did not end naming it (state {str(mine.get('state'))[:20]!r})"
        )
        raise HandOverError(
            f"a record of step {nxt.step + 1} ({nxt.job_id}) exists that no hand-over of "
            f"this step made ({why}): the table was written by someone else"
        )
    if held.get("state") != JobState.RUNNING.value:
        # We were paused past the next step's whole run: what we just made must go again.
        await _undo(be, nxt, plan=bool(held.get("cleaned")))
    return nxt, False


async def _drop_orphans(be: Backend, spec: JobSpec, sources: Sequence[Source]) -> None:
    """Leave only the committed outputs in the step's output place: a reducer that died
    between its upload and its commit left its file there, which a resume from the kept
    outputs (``--from-step``) would otherwise read."""
    committed = {s.url for s in sources}
    found = await be.blobs.list(outputs_root(spec))
    orphans = [b.url for b in found if b.url not in committed]
    if orphans:
        await be.blobs.delete(orphans)


async def _record(
    be: Backend, spec: JobSpec, nxt: JobSpec, extra: dict[str, Any], totals: dict[str, Any]
) -> None:
    """At once: the next step's record and active row, the output place's claim passed to
    it, the pipeline's listing at its step, and this step ended as succeeded, naming it.
    ConditionFailed if the next step's record exists, this step no longer runs, or the
    claim is not this step's."""
    now = clock.wall()
    row = {"state": JobState.RUNNING.value, "created": now}
    done = JobState.SUCCEEDED.value
    writes: list[TxWrite] = [
        Put(job_pk(nxt.job_id), "job", {**nxt.to_item(), **extra, **row}, item_absent()),
        Put(ACTIVE_PK, nxt.job_id, row),
        Update(OUTPUTS_PK, nxt.output, set_={"job": nxt.job_id}, condition=Eq("job", spec.job_id)),
        Update(JOBS_PK, spec.pipeline_id, set_={"step": nxt.step + 1}),
        Update(
            job_pk(spec.job_id),
            "job",
            set_={**totals, "state": done, "finished": now, "next": nxt.job_id},
            condition=Eq("state", JobState.RUNNING.value),
        ),
        # The row stays: cleaning the step up is the duty left, and any worker may take it.
        Update(ACTIVE_PK, spec.job_id, set_={"state": done}),
    ]
    await be.table.transact(writes, token=_token())


async def _undo(be: Backend, nxt: JobSpec, *, plan: bool = False) -> None:
    """Remove what a late hand-over made for a next step that ended already, or was never
    made: its queues (nobody serves them any more) and, with ``plan`` (the step was cleaned
    up, or never existed), its plan (before then its cleanup still reads it)."""
    in_q, reduce_q, part_qs = nxt.queues()

    async def delete(name: str) -> None:
        with contextlib.suppress(QueueGone, BackendError):
            await be.queues.delete(name)

    await asyncio.gather(*(delete(q) for q in (in_q, reduce_q, *part_qs)))
    if plan:
        with contextlib.suppress(BackendError):
            await be.blobs.delete_prefix(job_scratch(nxt.scratch, nxt.job_id))


async def chain(be: Backend, job_id: str) -> list[tuple[JobSpec, dict[str, Any]]]:
    """The steps of the pipeline ``job_id`` names that exist so far, in order, each with
    its record: a step that succeeded and handed over names the next (``next``)."""
    from cmr.lifecycle import load_spec

    steps = [await load_spec(be, job_id)]
    while True:
        spec, rec = steps[-1]
        if spec.final or rec.get("state") != JobState.SUCCEEDED.value or len(steps) > 64:
            return steps
        nxt = step_job_id(spec.pipeline_id, spec.first_step, spec.step + 1)
        if rec.get("next") != nxt:
            return steps
        steps.append(await load_spec(be, nxt))


async def current(be: Backend, job_id: str) -> tuple[JobSpec, dict[str, Any]]:
    """The step a pipeline is at: its last step made so far."""
    return (await chain(be, job_id))[-1]


HANDOVER_WAIT_S = 90.0  # how long cancelling waits for a step handing over (a dead
# hand-over is taken up by a worker's repair check, every janitor_s: 60 s by default)


async def cancel(be: Backend, job_id: str, reason: str, *, clean: bool = False) -> bool:
    """Cancel the step a pipeline (or a one-step job) is at; False if it had ended. A step
    handing over cannot be cancelled: the next one is, once it exists. ``clean``: clean the
    cancelled step up here (nobody else can reach an in-process backend's queues)."""
    from cmr.lifecycle import cleanup, end

    deadline = clock.monotonic() + HANDOVER_WAIT_S
    while True:
        spec, _ = await current(be, job_id)
        try:
            ended = await end(be, spec, JobState.CANCELLED, reason=reason)
        except UsageError:
            # Publishing: the last step ends as succeeded in a moment; an earlier one is
            # handing over, and its next step is what to cancel.
            if spec.final or clock.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
            continue
        if ended and clean:
            await cleanup(be, spec, JobState.CANCELLED)
        return ended
