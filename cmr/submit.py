"""Submitting a job: the client is not a master, only a convenience.

Submission checks the settings and the output place, lists and cuts the input, writes the
plan, creates the job's queues, enqueues every task (pointers into the plan), and only then
makes the job exist, in one transaction, so a worker that finds the job finds it complete.
What follows is watching (:mod:`cmr.watch`): the submitter never finalizes or cleans up, so
a job whose client died, or never waited, ends exactly as one whose client watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmr import wire
from cmr.backends.base import Backend, BlobInfo, Blobs
from cmr.backends.embedded import EmbeddedBlobs, file_url
from cmr.errors import BackendError, BlobMissing, QueueGone, UsageError
from cmr.job import JobRef
from cmr.lifecycle import cleanup, end, job_scratch, load_spec, record_submit
from cmr.plan import Plan, plan_url
from cmr.publish import (
    OutputConflict,
    existing_parts,
    read_manifest,
)
from cmr.records import (
    MAX_PARTITIONS,
    MAX_VISIBILITY_S,
    OUTPUTS_PK,
    JobSpec,
    JobState,
    job_pk,
    new_job_id,
)
from cmr.split import Input, choose_split_bytes, input_name, plan

STAGE_CONCURRENCY = 16
MAX_REPLACED_LOCAL = 5_000  # part files a fetched local output may replace (kept in the record)


@dataclass(frozen=True)
class JobOptions:
    """How a job runs, checked once at submit; nonsense is refused with the fix to make."""

    partitions: int
    visibility_s: int = 60
    max_task_failures: int = 3
    max_task_attempts: int = 10
    task_timeout_s: int = 0  # 0: grows with each task's input (cmr.timelimit)
    overwrite: bool = False
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise UsageError(what)

        need(
            1 <= self.partitions <= MAX_PARTITIONS,
            f"--reducers must be between 1 and {MAX_PARTITIONS:,} (one queue each); "
            f"got {self.partitions}",
        )
        need(
            1 <= self.visibility_s <= MAX_VISIBILITY_S,
            f"--visibility-timeout must be between 1 and {MAX_VISIBILITY_S} seconds (a task's "
            f"lease: 0 would hand every task to every worker at once); got {self.visibility_s}",
        )
        need(
            self.max_task_failures >= 1,
            f"max_task_failures must be at least 1; got {self.max_task_failures}",
        )
        need(
            self.max_task_attempts >= 1,
            f"max_task_attempts must be at least 1; got {self.max_task_attempts}",
        )
        need(
            self.task_timeout_s >= 0,
            f"--task-timeout must be a number of seconds, or 0 for the default that grows "
            f"with each task's input; got {self.task_timeout_s}",
        )


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).absolute()


def _utf8_name(p: Path) -> None:
    try:
        str(p).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"input file {os.fsencode(p)!r} has a name that is not valid UTF-8 (map would "
            "receive a garbled name): rename it, or remove it from the input"
        ) from None


async def _stage(
    backend: Backend, root_path: Path, files: list[Path], job_id: str
) -> tuple[str, list[BlobInfo]]:
    """Upload local files to the job's scratch area; returns (root, blobs)."""
    root = f"{job_scratch(backend.scratch, job_id)}input/"
    gate = asyncio.Semaphore(STAGE_CONCURRENCY)

    async def up(p: Path) -> BlobInfo:
        rel = p.name if root_path.is_file() else p.relative_to(root_path).as_posix()
        async with gate:
            await backend.blobs.upload_file(str(p), root + rel)
        return BlobInfo(root + rel, p.stat().st_size)

    blobs = list(await asyncio.gather(*(up(p) for p in files)))
    return (blobs[0].url if root_path.is_file() else root), blobs


def _outside(link: Path, root: Path) -> UsageError | None:
    """The refusal for a symbolic link whose target lies outside the input directory
    ``root`` (resolved), or None for one that stays inside."""
    try:
        target = link.resolve()
    except (OSError, RuntimeError):  # a loop of links (RuntimeError up to Python 3.12)
        return UsageError(f"input {link} is a loop of symbolic links: remove it from the input")
    if target == root or target.is_relative_to(root):
        return None
    return UsageError(
        f"input {link} is a symbolic link to {target}, outside the input directory {root}: "
        "a job reads only what lies under its input. Copy what it points to into the "
        "directory, or remove the link"
    )


def _local_files(path: Path) -> list[Path]:
    """The input's files, each readable, with UTF-8 names: anything else is found now, not
    by a task that would fail on it. A directory's symbolic links (to files or directories)
    are followed only while their targets stay inside it: a link out of it is refused, so a
    job never reads, or uploads, a file nobody named (someone's ~/.ssh, a secret in /tmp).
    An input that is itself a link is the user's own choice, and followed."""
    if path.is_file():
        files = [path]
    else:
        files = []
        root = path.resolve()
        seen: set[tuple[int, int]] = set()  # directories by (device, inode): links may loop
        for dirpath, dirs, names in os.walk(path, followlinks=True):
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in seen:
                dirs.clear()
                continue
            seen.add((st.st_dev, st.st_ino))
            for name in (*dirs, *names):
                entry = Path(dirpath, name)
                # Checked before os.walk descends: a link to / is refused, not walked.
                if entry.is_symlink() and (refused := _outside(entry, root)) is not None:
                    raise refused
            files += [Path(dirpath, n) for n in names]
        files.sort()
    for f in files:
        _utf8_name(f)
        if not f.is_file():
            raise UsageError(
                f"input {f} is a broken link or not a regular file: fix it, or remove it from "
                "the input"
            )
        if not os.access(f, os.R_OK):
            raise UsageError(f"input file {f} cannot be read (permissions)")
    return files


async def list_input(backend: Backend, source: str, job_id: str) -> tuple[str, list[Input]]:
    """(root, blobs) of the input: a file (or object) alone, or everything below a directory
    (or prefix, taken as a directory: ``s3://b/logs`` means ``s3://b/logs/``, not logs2/).
    The root is recorded with the job: every range of its plan must lie under it."""
    if is_local(source):
        path = local_path(source)
        if not path.exists():
            raise UsageError(f"input {source} does not exist")
        files = await asyncio.to_thread(_local_files, path)
        if backend.capabilities.local_files:
            root = file_url(path) if path.is_file() else file_url(path) + "/"
            blobs = [BlobInfo(file_url(f), f.stat().st_size) for f in files]
        else:
            root, blobs = await _stage(backend, path, files, job_id)
    else:
        try:
            root, blobs = source, [BlobInfo(source, await backend.blobs.size(source))]
        except BlobMissing:
            root = source.rstrip("/") + "/"
            blobs = await backend.blobs.list(root)
            if not blobs:
                raise UsageError(f"input {source} matches no objects") from None
    return root, [Input(b.url, b.size, input_name(root, b)) for b in blobs]


@dataclass(frozen=True)
class OutputPlace:
    url: str  # where workers publish
    replaces: str  # etag of the manifest the job's publication replaces ("": none)
    replaced: tuple[str, ...]  # part files the job's publication removes once it stands
    fetch: dict[str, Any] | None = None  # a local directory the client fetches into (aws)


async def _inspect(
    blobs: Blobs, url: str, output: str, overwrite: bool
) -> tuple[str, tuple[str, ...]]:
    """(manifest etag, replaced parts) of an output place; refuses one in use without
    ``overwrite``."""
    found = await blobs.list(url)
    if found and not overwrite:
        raise UsageError(
            f"output {output} is not empty; remove it or pass --overwrite (the old output "
            "is replaced only once the new one is complete)"
        )
    try:
        _, etag = await read_manifest(blobs, url)
    except OutputConflict as exc:
        raise UsageError(f"output {output}: {exc}; remove that file") from None
    return etag or "", tuple(await existing_parts(blobs, url)) if overwrite else ()


def _local_dir(output: str) -> Path:
    path = local_path(output)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output {output} is a file; give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the output directory {output}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"output directory {output} is not writable")
    return path


async def prepare_output(
    backend: Backend, output: str, job_id: str, overwrite: bool
) -> OutputPlace:
    """Check the output place now, before any work: it is usable, empty or replaced on
    purpose, and not owned by a running job."""
    if is_local(output):
        path = await asyncio.to_thread(_local_dir, output)
        url = file_url(path) + "/"
        etag, replaced = await _inspect(EmbeddedBlobs(), url, output, overwrite)
        if backend.capabilities.local_files:
            return OutputPlace(url, etag, replaced)
        if len(replaced) > MAX_REPLACED_LOCAL:
            raise UsageError(
                f"output {output} holds {len(replaced):,} part files; remove them first"
            )
        # Workers cannot write here: they publish to the job's results, which we fetch.
        results = f"{backend.scratch.rstrip('/')}/results/{job_id}/"
        fetch = {"dir": str(path), "replaces": etag, "replaced": list(replaced)}
        return OutputPlace(results, "", (), fetch)
    if backend.capabilities.local_files:
        raise UsageError(
            "the embedded backend writes local directories; use --backend aws for an s3:// output"
        )
    url = output if output.endswith("/") else output + "/"
    held = await backend.table.get(OUTPUTS_PK, url)
    if held is not None and held.get("active"):
        other = str(held.get("job"))
        raise UsageError(
            f"the output {url} belongs to job {other}, which is still running: wait for it "
            f"(`cmr wait {other}`), cancel it (`cmr cancel {other}`), or choose another output"
        )
    etag, replaced = await _inspect(backend.blobs, url, output, overwrite)
    return OutputPlace(url, etag, replaced)


async def submit(
    backend: Backend,
    ref: JobRef,
    source: str,
    output: str,
    options: JobOptions,
    *,
    queue_prefix: str,
    parallelism: int,
    split_bytes: int | None = None,
    memory_bytes: int | None = None,
) -> JobSpec:
    job_id = new_job_id()
    place = await prepare_output(backend, output, job_id, options.overwrite)
    scratch = job_scratch(backend.scratch, job_id)
    try:
        return await _submit(
            backend, ref, source, output, options, job_id, place, queue_prefix, parallelism,
            split_bytes, memory_bytes,
        )  # fmt: skip
    except BaseException:
        # Interrupted or failed half-way: what was made for the job must not linger, and a
        # job that was recorded after all (its answer lost) is ended, not pulled from under.
        await asyncio.shield(_abandon(backend, job_id, scratch, queue_prefix, options))
        raise


async def _abandon(
    backend: Backend, job_id: str, scratch: str, queue_prefix: str, options: JobOptions
) -> None:
    with contextlib.suppress(BackendError):
        if await backend.table.get(job_pk(job_id), "job", consistent=True) is not None:
            spec, _ = await load_spec(backend, job_id)
            reason = "cancelled: its submission was interrupted"
            if await end(backend, spec, JobState.CANCELLED, reason=reason):
                await cleanup(backend, spec, JobState.CANCELLED)
            return
        names = await backend.queues.list(f"{queue_prefix}{job_id}-")
        await asyncio.gather(*(_delete_queue(backend, q) for q in names))
        await backend.blobs.delete_prefix(scratch)


async def _delete_queue(backend: Backend, name: str) -> None:
    with contextlib.suppress(QueueGone):
        await backend.queues.delete(name)


async def _submit(
    backend: Backend,
    ref: JobRef,
    source: str,
    output: str,
    options: JobOptions,
    job_id: str,
    place: OutputPlace,
    queue_prefix: str,
    parallelism: int,
    split_bytes: int | None,
    memory_bytes: int | None,
) -> JobSpec:
    input_root, inputs = await list_input(backend, source, job_id)
    total = sum(i.size for i in inputs)
    tasks = plan(inputs, split_bytes or choose_split_bytes(total, parallelism, memory_bytes))
    scratch = job_scratch(backend.scratch, job_id)
    data = Plan(tuple(tasks), place.replaced).to_bytes()
    await backend.blobs.put(plan_url(scratch), data)
    spec = JobSpec(
        job_id,
        ref,
        dict(options.params),
        len(tasks),
        options.partitions,
        place.url,
        backend.scratch,
        queue_prefix,
        options.visibility_s,
        options.max_task_failures,
        options.max_task_attempts,
        options.task_timeout_s,
        Plan.digest(data),
        place.replaces,
        input_root,
    )
    in_q, reduce_q, part_qs = spec.queues()
    queues = backend.queues
    await asyncio.gather(
        *(queues.create(q, visibility_s=spec.visibility_s) for q in (in_q, reduce_q, *part_qs))
    )
    await queues.send(in_q, [wire.encode(wire.MapTask(job_id, i)) for i in range(len(tasks))])
    await queues.send(
        reduce_q, [wire.encode(wire.ReduceTask(job_id, p)) for p in range(spec.partitions)]
    )
    extra: dict[str, Any] = {
        "input": source,
        "input_bytes": total,
        "inputs": len(inputs),
        "user_output": output,
    }
    if place.fetch is not None:
        extra["fetch"] = place.fetch
    await record_submit(backend, spec, extra)
    return spec
