"""Watching a job: its progress, waiting for its end, bringing its output home.

Only reads (and, for a local output on a remote store, copies the published parts home):
the workers finish and clean up a job whether or not anyone watches, so everything here
may stop at any moment without harm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cmr import usage
from cmr.backends.base import Backend
from cmr.backends.retry import transient
from cmr.errors import BackendError, JobFailed, NotFound, UsageError
from cmr.fileurls import file_path, file_url
from cmr.publish import (
    Manifest,
    OutputConflict,
    Source,
    publish,
    read_manifest,
    remove_parts,
)
from cmr.records import (
    FINAL_STATES,
    JOBS_PK,
    JobSpec,
    JobState,
    job_pk,
)
from cmr.submit import local_path


@dataclass(frozen=True)
class Progress:
    maps_done: int
    maps: int
    reduces_done: int
    reduces: int
    state: str
    stats: dict[str, int]


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
    """Watch the job (every step of a pipeline) until it ends: the record of its last step;
    raises JobFailed."""
    return (await wait_steps(backend, spec, on_progress, poll_s))[1]


async def wait_steps(
    backend: Backend,
    spec: JobSpec,
    on_progress: Callable[[Progress], None] | None = None,
    poll_s: float = 0.5,
) -> tuple[JobSpec, dict[str, Any]]:
    """Watch a pipeline step after step, as each hands over to the next, until it ends:
    (the last step's spec, its record); raises JobFailed, naming the step that failed."""
    from cmr.lifecycle import load_spec

    while True:
        try:
            record = await _wait_one(backend, spec, on_progress, poll_s)
        except JobFailed as exc:
            if not spec.pipeline:
                raise
            raise JobFailed(
                spec.pipeline_id, f"step {spec.step + 1} ({spec.job_id}): {exc.reason}"
            ) from None
        nxt = record.get("next")
        if spec.final or not isinstance(nxt, str):
            return spec, record
        while True:
            try:
                spec, _ = await load_spec(backend, nxt)
                break
            except BackendError as exc:
                if not transient(exc):
                    raise
                await asyncio.sleep(poll_s)


async def _wait_one(
    backend: Backend,
    spec: JobSpec,
    on_progress: Callable[[Progress], None] | None,
    poll_s: float,
) -> dict[str, Any]:
    """Watch one job until it ends: its final record; raises JobFailed. Only reads:
    the workers finish and clean up the job whether or not anyone waits. Transient backend
    errors only delay.

    Each poll reads the job record; the reduce records (a query) too once the maps are
    counted done, or after REDUCE_QUERY_EVERY polls in case a map counter was lost with its
    worker: during the map phase a waiting client costs one request per poll, not two."""
    reduces_done, polls, full = 0, 0, True
    usage.JOB.set(spec.job_id)  # watching is a request of the job (this task's context)
    while True:
        try:
            polls += 1
            p = await progress(backend, spec, reduces_known=None if full else reduces_done)
            reduces_done = p.reduces_done
            # Whether the next poll reads the reduce records too.
            full = p.maps_done >= spec.maps or polls % REDUCE_QUERY_EVERY == 0
            if on_progress is not None:
                on_progress(p)
            if p.state in FINAL_STATES:
                job = await backend.table.get(job_pk(spec.job_id), "job") or {}
                if p.state != JobState.SUCCEEDED.value:
                    raise JobFailed(spec.job_id, str(job.get("error") or p.state))
                return job
        except BackendError as exc:
            if not transient(exc):
                raise
        await asyncio.sleep(poll_s)


async def fetch_output(backend: Backend, spec: JobSpec, record: dict[str, Any]) -> None:
    """Bring a succeeded job's output into the local directory it was submitted with, when
    its workers could not write there (aws backend): the same fenced publication, with the
    local directory as the output place. Idempotent; the results are deleted from S3 after."""
    fetch = record.get("fetch")
    if not isinstance(fetch, dict):
        return
    local = backend.local_blobs
    dest = file_url(fetch["dir"]) + "/"
    try:
        manifest, _ = await read_manifest(backend.blobs, spec.output)
    except OutputConflict as exc:
        raise UsageError(f"the job's results at {spec.output} are damaged: {exc}") from None
    if manifest is None:
        mine, _ = await read_manifest(local, dest)
        if mine is not None and mine.job == spec.job_id:
            return  # fetched already
        raise NotFound(
            f"job {spec.job_id}'s results are no longer at {spec.output} (fetched and "
            f"removed by another client?)"
        )

    async def download(src: str, dst: str) -> None:
        await backend.blobs.download_file(src, str(file_path(dst)))

    sources = [
        Source(
            int(part.name[5:10]), spec.output + part.name, part.records, part.bytes, part.attempt
        )
        for part in manifest.parts
    ]
    await publish(
        local,
        download,
        job_id=spec.job_id,
        output=dest,
        sources=sources,
        replaces=str(fetch.get("replaces") or "") or None,
        finished=manifest.finished,
    )
    await remove_parts(local, dest, [str(n) for n in fetch.get("replaced", [])])
    await backend.blobs.delete_prefix(spec.output)


def output_parts(output: str) -> list[str]:
    """The part files of a local output directory, as its manifest lists them."""
    data = (local_path(output) / "_SUCCESS").read_bytes()
    manifest = Manifest.from_bytes(data)
    return [str(local_path(output) / p.name) for p in manifest.parts]


async def list_jobs(backend: Backend) -> list[dict[str, Any]]:
    rows = await backend.table.query(JOBS_PK)
    return sorted(rows, key=lambda r: float(r.get("created", 0)), reverse=True)


# Counters only a worker moves, and only once it has taken a task of the job.
_WORKER_STATS = (
    "progress_maps",
    "progress_bytes",
    "map_duplicates_skipped",
    "tasks_retried",
    "tasks_restarted",
    "leases_lost",
    "messages_rejected",
    "reduce_conflicts",
    "partitions_committed",
)


async def untouched(backend: Backend, spec: JobSpec, record: dict[str, Any]) -> bool:
    """Whether no worker has ever taken a task of this running job (nothing serves it yet):
    no counter a worker moves, and none of the records a taken task leaves (a partition's
    claim, a map commit, a failure or restart count). A step after a pipeline's first was
    made by a worker's hand-over: touched."""
    if record.get("state") != JobState.RUNNING.value or spec.step > spec.first_step:
        return False
    if any(isinstance(record.get(k), int) and record[k] > 0 for k in _WORKER_STATS):
        return False
    if any(isinstance(k, str) and k.startswith("c_") for k in record):  # live user counters
        return False
    pk = job_pk(spec.job_id)
    # A worker's reduce slots claim partitions as soon as it takes the job: reduce# first.
    for prefix in ("reduce#", "map#", "fail#"):
        if await backend.table.query(pk, prefix=prefix):
            return False
    return True


async def run_input(backend: Backend, spec: JobSpec) -> dict[str, Any]:
    """What a pipeline run (``spec``: its first step) read, as ``run_bytes_in`` and
    ``run_records_in``: its first step's totals (its last step read the step before's
    output). Empty for a one-step job, whose record says it already."""
    if not spec.pipeline:
        return {}
    first = await backend.table.get(job_pk(spec.job_id), "job") or {}
    return {
        f"run_{k}": first[k]
        for k in ("bytes_in", "records_in")
        if isinstance(first.get(k), int) and not isinstance(first.get(k), bool)
    }
