"""A job's ending: publishing committed parts, failing, and idempotent cleanup.

Any process may run these, any number of times, concurrently: the client, the worker that
committed the last partition, or ``cmr cleanup``. Publishing copies immutable committed
attempt outputs, so two publishers write the same bytes; state changes are conditional.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time

import structlog

from cmr.backends.base import Backend, Eq
from cmr.errors import BlobMissing, ConditionFailed, QueueGone
from cmr.records import JOBS_PK, RUNNING_PK, JobSpec, JobState, job_pk

log = structlog.get_logger("cmr.lifecycle")


def part_name(p: int) -> str:
    return f"part-{p:05d}"


def job_scratch(scratch: str, job_id: str) -> str:
    return f"{scratch.rstrip('/')}/jobs/{job_id}/"


async def set_state(
    backend: Backend,
    job_id: str,
    state: JobState,
    error: str = "",
    extra: dict[str, object] | None = None,
) -> bool:
    """Move a running job to a final state, with ``extra`` fields in the same conditional
    write; False if it already had one (then nothing of ours was written)."""
    now = time.time()
    fields: dict[str, object] = {**(extra or {}), "state": state.value, "finished": now}
    if error:
        fields["error"] = error[-8000:]
    try:
        await backend.table.update(
            job_pk(job_id), "job", set_=fields, condition=Eq("state", JobState.RUNNING.value)
        )
    except ConditionFailed:
        return False
    await backend.table.update(JOBS_PK, job_id, set_={"state": state.value, "finished": now})
    await backend.table.delete(RUNNING_PK, job_id)
    return True


async def committed_outputs(backend: Backend, spec: JobSpec) -> dict[int, str] | None:
    """Partition -> committed output URL, or None while any partition is uncommitted."""
    items = await backend.table.query(job_pk(spec.job_id), prefix="reduce#")
    done = {
        int(i["sk"].split("#")[1]): str(i["output"]) for i in items if i.get("state") == "committed"
    }
    return done if len(done) == spec.partitions else None


async def _copy(backend: Backend, src: str, dst: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix="cmr-publish-")
    os.close(fd)
    try:
        await backend.blobs.download_file(src, tmp)
        await backend.blobs.upload_file(tmp, dst)
    finally:
        os.unlink(tmp)


async def finalize(backend: Backend, spec: JobSpec) -> bool:
    """Publish every committed part and mark the job succeeded; True once it is."""
    outputs = await committed_outputs(backend, spec)
    if outputs is None:
        return False
    job = await backend.table.get(job_pk(spec.job_id), "job")
    if job is None or job.get("state") != JobState.RUNNING.value:
        return job is not None and job.get("state") == JobState.SUCCEEDED.value
    try:
        await asyncio.gather(
            *(_copy(backend, url, spec.output + part_name(p)) for p, url in outputs.items())
        )
    except BlobMissing:
        # Another finalizer finished and cleaned up under us; its verdict stands.
        job = await backend.table.get(job_pk(spec.job_id), "job")
        return job is not None and job.get("state") == JobState.SUCCEEDED.value
    pk = job_pk(spec.job_id)
    records_out = sum(
        int(i.get("records", 0)) for i in await backend.table.query(pk, prefix="reduce#")
    )
    winners = await backend.table.query(pk, prefix="map#")
    totals: dict[str, object] = {
        "records_out": records_out,
        # Exact totals from the winners' commit records (the counters may miss a worker
        # that died between its commit and its stats update).
        "records_in": sum(int(i.get("records_in", 0)) for i in winners),
        "bytes_in": sum(int(i.get("bytes_in", 0)) for i in winners),
        "maps_done": len(winners),
    }
    # One conditional write: a concurrent finalizer that already succeeded (and may have
    # cleaned the records these totals come from) keeps its figures; ours are dropped.
    totals["published"] = [outputs[p].rsplit("/", 1)[-1] for p in sorted(outputs)]
    if await set_state(backend, spec.job_id, JobState.SUCCEEDED, extra=totals):
        log.info("job succeeded", job=spec.job_id)
    await cleanup(backend, spec)
    return True


async def fail(backend: Backend, spec: JobSpec, reason: str) -> None:
    if await set_state(backend, spec.job_id, JobState.FAILED, reason):
        log.warning("job failed", job=spec.job_id, reason=reason.splitlines()[0])
    await cleanup(backend, spec)


CLEANUP_CONCURRENCY = 32  # deletes in flight: one at a time, thousands of records take minutes


async def cleanup(backend: Backend, spec: JobSpec) -> None:
    """Delete the job's queues, scratch blobs and task records; keep the job record."""
    in_q, reduce_q, part_qs = spec.queues()
    pk = job_pk(spec.job_id)
    gate = asyncio.Semaphore(CLEANUP_CONCURRENCY)

    async def delete_queue(name: str) -> None:
        async with gate:
            with contextlib.suppress(QueueGone):
                await backend.queues.delete(name)

    async def delete_item(sk: str) -> None:
        async with gate:
            await backend.table.delete(pk, sk)

    await asyncio.gather(*(delete_queue(n) for n in (in_q, reduce_q, *part_qs)))
    await backend.blobs.delete_prefix(job_scratch(spec.scratch, spec.job_id))
    for prefix in ("map#", "fail#", "reduce#"):
        items = await backend.table.query(pk, prefix=prefix)
        await asyncio.gather(*(delete_item(str(item["sk"])) for item in items))
    await backend.table.update(pk, "job", set_={"cleaned": True})
