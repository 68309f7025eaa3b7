"""Submitting a job and watching it: the client is not a master, only a convenience.

Submission lists and cuts the input, creates the job's queues, enqueues every task, and
only then publishes the job record, so a worker that finds the job finds it complete.
After that the client merely watches the table; if it dies, workers finish the job.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmr import wire
from cmr.backends.base import Backend, BlobInfo
from cmr.backends.embedded import file_url
from cmr.backends.retry import transient
from cmr.errors import BackendError, BlobMissing, JobFailed, UsageError
from cmr.job import JobRef
from cmr.lifecycle import cleanup, finalize, job_scratch, part_name
from cmr.records import (
    JOBS_PK,
    RUNNING_PK,
    JobSpec,
    JobState,
    job_pk,
    new_job_id,
)
from cmr.split import Input, choose_split_bytes, input_name, plan

STAGE_CONCURRENCY = 16


@dataclass(frozen=True)
class Progress:
    maps_done: int
    maps: int
    reduces_done: int
    reduces: int
    state: str
    stats: dict[str, int]


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


async def _stage(backend: Backend, src: str, job_id: str) -> tuple[str, list[BlobInfo]]:
    """Upload a local file or directory to the job's scratch area; returns (root, blobs)."""
    root_path = Path(src.removeprefix("file://"))
    files = (
        [root_path]
        if root_path.is_file()
        else sorted(p for p in root_path.rglob("*") if p.is_file())
    )
    root = f"{job_scratch(backend.scratch, job_id)}input/"
    gate = asyncio.Semaphore(STAGE_CONCURRENCY)

    async def up(p: Path) -> BlobInfo:
        rel = p.name if root_path.is_file() else p.relative_to(root_path).as_posix()
        async with gate:
            await backend.blobs.upload_file(str(p), root + rel)
        return BlobInfo(root + rel, p.stat().st_size)

    return root, list(await asyncio.gather(*(up(p) for p in files)))


async def list_input(backend: Backend, source: str, job_id: str) -> list[Input]:
    """The input's blobs: a file (or object) alone, or everything below a directory (or
    prefix, taken as a directory: ``s3://b/logs`` means ``s3://b/logs/``, not logs2/)."""
    if is_local(source):
        path = Path(source.removeprefix("file://"))
        if not path.exists():
            raise UsageError(f"input {source} does not exist")
        if backend.name != "embedded":
            root, blobs = await _stage(backend, str(path), job_id)
        elif path.is_file():
            root, blobs = file_url(path), [BlobInfo(file_url(path), path.stat().st_size)]
        else:
            root = file_url(path) + "/"
            blobs = await backend.blobs.list(root)
    else:
        try:
            root, blobs = source, [BlobInfo(source, await backend.blobs.size(source))]
        except BlobMissing:
            root = source.rstrip("/") + "/"
            blobs = await backend.blobs.list(root)
            if not blobs:
                raise UsageError(f"input {source} matches no objects") from None
    return [Input(b.url, b.size, input_name(root, b)) for b in blobs]


def output_url(backend: Backend, output: str, job_id: str) -> str:
    """Where committed parts are published: the output itself when the backend can write
    there, else a scratch prefix the client downloads from."""
    if backend.name == "embedded":
        if not is_local(output):
            raise UsageError(
                "the embedded backend writes local directories; use --backend aws "
                "for an s3:// output"
            )
        return file_url(output.removeprefix("file://")) + "/"
    if is_local(output):
        # Outside the job's scratch area, which cleanup removes before the client fetches.
        return f"{backend.scratch.rstrip('/')}/results/{job_id}/"
    return output if output.endswith("/") else output + "/"


def check_output(output: str, overwrite: bool) -> None:
    if is_local(output):
        path = Path(output.removeprefix("file://"))
        if path.is_file():
            raise UsageError(f"output {output} is a file; give a directory")
        if path.is_dir() and any(path.iterdir()):
            if not overwrite:
                raise UsageError(
                    f"output directory {output} is not empty; remove it or pass --overwrite"
                )
            for old in path.glob("part-*"):
                old.unlink()


async def submit(
    backend: Backend,
    ref: JobRef,
    source: str,
    output: str,
    *,
    partitions: int,
    params: dict[str, str],
    visibility_s: int,
    queue_prefix: str,
    parallelism: int,
    max_task_failures: int = 3,
    split_bytes: int | None = None,
    memory_bytes: int | None = None,
) -> JobSpec:
    if partitions < 1:
        raise UsageError("--reducers must be at least 1")
    job_id = new_job_id()
    inputs = await list_input(backend, source, job_id)
    total = sum(i.size for i in inputs)
    tasks = plan(inputs, split_bytes or choose_split_bytes(total, parallelism, memory_bytes))
    spec = JobSpec(
        job_id,
        ref,
        params,
        len(tasks),
        partitions,
        output_url(backend, output, job_id),
        backend.scratch,
        queue_prefix,
        visibility_s,
        max_task_failures,
    )
    in_q, reduce_q, part_qs = spec.queues()
    queues = backend.queues
    await asyncio.gather(
        *(queues.create(q, visibility_s=visibility_s) for q in (in_q, reduce_q, *part_qs))
    )
    await queues.send(in_q, [wire.encode(wire.MapTask(job_id, i, t)) for i, t in enumerate(tasks)])
    await queues.send(
        reduce_q, [wire.encode(wire.ReduceTask(job_id, p)) for p in range(partitions)]
    )
    now = time.time()
    await backend.table.put(
        job_pk(job_id),
        "job",
        {
            **spec.to_item(),
            "state": JobState.RUNNING.value,
            "created": now,
            "input": source,
            "input_bytes": total,
            "inputs": len(inputs),
            "user_output": output,
        },
    )
    await backend.table.put(JOBS_PK, job_id, {"state": JobState.RUNNING.value, "created": now})
    await backend.table.put(RUNNING_PK, job_id, {"state": JobState.RUNNING.value, "created": now})
    return spec


async def progress(
    backend: Backend, spec: JobSpec, *, reduces_known: int | None = None
) -> Progress:
    """Where the job stands. ``reduces_known``: skip the reduce-record query and report this
    many reduces done (a caller polling often asks for them only when they can change)."""
    pk = job_pk(spec.job_id)
    if reduces_known is None:
        reduces, job = await asyncio.gather(
            backend.table.query(pk, prefix="reduce#"),
            backend.table.get(pk, "job"),
        )
    else:
        reduces, job = [], await backend.table.get(pk, "job")
    job = job or {}
    stats = {k: int(v) for k, v in job.items() if isinstance(v, int) and not isinstance(v, bool)}
    state = str(job.get("state", "unknown"))
    if state == JobState.SUCCEEDED.value:
        return Progress(spec.maps, spec.maps, spec.partitions, spec.partitions, state, stats)
    done = (
        reduces_known
        if reduces_known is not None
        else sum(1 for r in reduces if r.get("state") == "committed")
    )
    return Progress(
        min(spec.maps, stats.get("progress_maps", 0)),
        spec.maps,
        done,
        spec.partitions,
        state,
        stats,
    )


REDUCE_QUERY_EVERY = 10


async def wait(
    backend: Backend,
    spec: JobSpec,
    on_progress: Callable[[Progress], None] | None = None,
    poll_s: float = 0.5,
) -> dict[str, Any]:
    """Wait until the job ends; finalize it ourselves if every partition is committed.
    Returns the final job record; raises JobFailed. Transient backend errors only delay.

    Each poll reads the job record; the reduce records (a query) too once the maps are
    counted done, or after REDUCE_QUERY_EVERY polls in case a map counter was lost with its
    worker: during the map phase a waiting client costs one request per poll, not two."""
    reduces_done, polls, full = 0, 0, True
    while True:
        try:
            polls += 1
            p = await progress(backend, spec, reduces_known=None if full else reduces_done)
            reduces_done = p.reduces_done
            # Whether the next poll reads the reduce records too.
            full = p.maps_done >= spec.maps or polls % REDUCE_QUERY_EVERY == 0
            if on_progress is not None:
                on_progress(p)
            if p.state == JobState.RUNNING.value and p.reduces_done == spec.partitions:
                await finalize(backend, spec)
                continue
            if p.state != JobState.RUNNING.value:
                job = await backend.table.get(job_pk(spec.job_id), "job") or {}
                if not job.get("cleaned"):
                    # The worker that ended the job was stopped mid-cleanup; finish it.
                    await cleanup(backend, spec)
                if p.state != JobState.SUCCEEDED.value:
                    raise JobFailed(spec.job_id, str(job.get("error") or p.state))
                return job
        except (BackendError, BlobMissing) as exc:
            if not transient(exc) and not isinstance(exc, BlobMissing):
                raise
        await asyncio.sleep(poll_s)


async def fetch_output(backend: Backend, spec: JobSpec, output: str) -> None:
    """Bring published parts back to a local output directory (aws backend, local DIR)."""
    if backend.name == "embedded" or not is_local(output):
        return
    dest = Path(output.removeprefix("file://"))
    dest.mkdir(parents=True, exist_ok=True)
    await asyncio.gather(
        *(
            backend.blobs.download_file(spec.output + part_name(p), str(dest / part_name(p)))
            for p in range(spec.partitions)
        )
    )
    await backend.blobs.delete_prefix(spec.output)


async def load_spec(backend: Backend, job_id: str) -> tuple[JobSpec, dict[str, Any]]:
    item = await backend.table.get(job_pk(job_id), "job")
    if item is None:
        raise UsageError(f"no job {job_id} in this backend's table (see `cmr status`)")
    return JobSpec.from_item(job_id, item), item


async def list_jobs(backend: Backend) -> list[dict[str, Any]]:
    rows = await backend.table.query(JOBS_PK)
    return sorted(rows, key=lambda r: float(r.get("created", 0)), reverse=True)


def ensure_dir(path: str) -> None:
    os.makedirs(path, exist_ok=True)
