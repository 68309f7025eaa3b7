"""Submitting a job: the client is not a master, only a convenience.

Submission checks everything it can before anything is written (the settings; the input
and output apart; a local input's every file; the output usable), lists and cuts the input,
writes the plan, creates the job's queues, enqueues every task (pointers into the plan),
and only then makes the job exist, in one transaction, so a worker that finds the job finds
it complete.
What follows is watching (:mod:`cmr.watch`): the submitter never finalizes or cleans up, so
a job whose client died, or never waited, ends exactly as one whose client watched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from cmr import formats, places, sampling, sidefiles, wire
from cmr.backends.base import Backend, BlobInfo, Blobs
from cmr.backends.embedded import EmbeddedBlobs, file_url
from cmr.errors import BackendError, BlobMissing, QueueGone, UsageError
from cmr.job import JobRef, check_formats, load_job_class
from cmr.lifecycle import cleanup, end, job_scratch, load_spec, record_submit
from cmr.localinput import local_files
from cmr.places import check_apart, make_output_dir, probe_output_dir
from cmr.plan import Plan, plan_url
from cmr.publish import (
    MANIFEST,
    Manifest,
    OutputConflict,
    existing_parts,
    read_manifest,
)
from cmr.records import (
    MAX_PARTITIONS,
    MAX_TASK_TIMEOUT_S,
    MAX_TASK_TRIES,
    MAX_VISIBILITY_S,
    OUTPUTS_PK,
    JobSpec,
    JobState,
    job_pk,
    new_job_id,
)
from cmr.settings import LineEnds
from cmr.split import Input, choose_split_bytes, input_name, never_cut, plan

STAGE_CONCURRENCY = 16
MAX_QUEUE_NAME = 80  # SQS's limit on a queue's name
MAX_REPLACED_LOCAL = 5_000  # part files a fetched local output may replace (kept in the record)
LINE_MODES = tuple(str(m) for m in LineEnds)
# Reducers past both of these for a job's map tasks are mostly empty parts: a warning.
FEW_REDUCERS = 64
REDUCERS_PER_MAP = 16

log = structlog.get_logger("cmr.submit")

is_local = places.is_local
local_path = places.local_path  # where cmr.watch finds it


@dataclass(frozen=True)
class JobOptions:
    """How a job runs, checked once at submit; nonsense is refused with the fix to make."""

    partitions: int
    visibility_s: int = 60
    max_task_failures: int = 3  # runs of one task that raise (--max-task-attempts)
    max_task_attempts: int = 10  # starts of one task that never end (its workers died)
    task_timeout_s: int = 0  # 0: grows with each task's input (cmr.timelimit)
    overwrite: bool = False
    params: dict[str, str] = field(default_factory=dict)
    lines: str = ""  # how input lines end ("": the job class's own ``lines``)
    # The steps to run (0-based indexes into the job's steps()), each one's partitions, and
    # how many steps the job has. One step of a one-step job: the defaults.
    first_step: int = 0
    last_step: int = 0
    step_partitions: tuple[int, ...] = ()
    job_steps: int = 1
    input_format: str = ""  # cmr.formats' input format ("": the job class's)
    output_format: str = ""  # cmr.formats' output format ("": the job class's)
    files: tuple[str, ...] = ()  # side files beyond the class's, "PATH[#NAME]" (cmr.sidefiles)
    total_order: bool = False  # sample keys, partition by range (or the class's total_order)

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
            f"--visibility-timeout must be between 1 and {MAX_VISIBILITY_S:,} seconds (a task's "
            f"lease: 0 would hand every task to every worker at once, and SQS holds one 12 "
            f"hours at most); got {self.visibility_s}",
        )
        need(
            1 <= self.max_task_failures <= MAX_TASK_TRIES,
            f"--max-task-attempts must be between 1 and {MAX_TASK_TRIES:,} (how often one task "
            f"may raise before the job fails; workers refuse more); got "
            f"{self.max_task_failures}",
        )
        need(
            1 <= self.max_task_attempts <= MAX_TASK_TRIES,
            f"max_task_attempts must be between 1 and {MAX_TASK_TRIES:,} (how often one task "
            f"may be started without finishing or raising before the job fails; workers "
            f"refuse more); got {self.max_task_attempts}",
        )
        need(
            0 <= self.task_timeout_s <= MAX_TASK_TIMEOUT_S,
            f"--task-timeout must be between 1 and {MAX_TASK_TIMEOUT_S:,} seconds (a week: "
            f"workers refuse more), or 0 for the default that grows with each task's input; "
            f"got {self.task_timeout_s}",
        )
        for n in self.step_partitions:
            need(
                1 <= n <= MAX_PARTITIONS,
                f"a step's reducers must be between 1 and {MAX_PARTITIONS:,}; got {n}",
            )
        need(
            0 <= self.first_step <= self.last_step < self.job_steps
            and (
                self.job_steps == 1
                or len(self.step_partitions) == self.last_step - self.first_step + 1
            ),
            f"steps {self.first_step + 1} to {self.last_step + 1} are not steps of a job of "
            f"{self.job_steps}",
        )
        if self.lines and self.lines not in LINE_MODES:
            raise UsageError(
                f"unknown --lines {self.lines!r}: use one of {', '.join(LINE_MODES)} (or leave "
                "it out for the job's own)"
            )
        for flag, value, check in (
            ("--input-format", self.input_format, formats.parse_input),
            ("--output-format", self.output_format, formats.check_output),
        ):
            if value:
                try:
                    check(value)
                except formats.FormatError as exc:
                    raise UsageError(f"{flag}: {exc}") from None


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


@dataclass(frozen=True)
class LocalInput:
    """A local input, listed and checked (:mod:`cmr.localinput`) before anything is
    written."""

    path: Path
    files: list[Path]


async def local_input(source: str) -> LocalInput | None:
    """The files of a local input, checked; None for an input in a store."""
    if not is_local(source):
        return None
    path = local_path(source)
    return LocalInput(path, await asyncio.to_thread(local_files, path))


async def list_input(backend: Backend, source: str, job_id: str) -> tuple[str, list[Input]]:
    """(root, blobs) of the input: a file (or object) alone, or everything below a directory
    (or prefix, taken as a directory: ``s3://b/logs`` means ``s3://b/logs/``, not logs2/).
    The root is recorded with the job: every range of its plan must lie under it."""
    return await _input_blobs(backend, source, await local_input(source), job_id)


async def _input_blobs(
    backend: Backend, source: str, local: LocalInput | None, job_id: str
) -> tuple[str, list[Input]]:
    if local is not None:
        path, files = local.path, local.files
        if path.is_dir() and (path / MANIFEST).is_file():
            keep = _output_files((path / MANIFEST).read_bytes())
            files = [f for f in files if f.parent != path or keep(f.name)]
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
                raise UsageError(
                    f"input {source} holds no files (no object is named so, nor lies under "
                    f"{root}): check the bucket and prefix, or upload the input first"
                ) from None
            if any(b.url == root + MANIFEST for b in blobs):
                keep = _output_files(await backend.blobs.get(root + MANIFEST))
                top = [b.url[len(root) :] for b in blobs]
                blobs = [b for b, n in zip(blobs, top, strict=True) if "/" in n or keep(n)]
    return root, [Input(b.url, b.size, input_name(root, b)) for b in blobs]


def _output_files(manifest: bytes) -> Callable[[str], bool]:
    """Which files at the top of an input directory that is an output (a ``_SUCCESS`` at
    its top) are input: a cmr output's parts are those its manifest lists (others are
    leftovers of a replaced or failed job); another tool's ``_SUCCESS`` (Hadoop's is empty)
    is only a marker. Either way the marker itself is no input."""
    try:
        listed = {p.name for p in Manifest.from_bytes(manifest).parts}
    except OutputConflict:
        return lambda name: name != MANIFEST
    return listed.__contains__


async def sniff_inputs(
    blobs: Blobs, inputs: list[Input], fmt: formats.InputFormat, split_bytes: int
) -> list[Input]:
    """The inputs with their compression, told by their first bytes (one small read each,
    16 at a time), where it decides how a file is cut: compressed files are whole-file tasks.
    Formats read whole anyway, and files too small to be cut in any case (split.never_cut:
    20,000 small files cost 20,000 reads here), are told by the worker from the bytes it
    reads; except fixed records (checked here) and files named as compressed (a name that
    lies is warned of here). Fixed records
    must fill a plain file exactly: refused here, naming the file. A pairs input read from
    an earlier job's output leaves out its manifest (``_SUCCESS``), which is not pairs."""
    if fmt.name == "pairs":
        return [i for i in inputs if i.name.rsplit("/", 1)[-1] != MANIFEST]
    if not fmt.splittable:
        return inputs
    gate = asyncio.Semaphore(STAGE_CONCURRENCY)

    async def one(inp: Input) -> Input:
        if inp.size == 0:
            return inp
        if (
            never_cut(inp.size, split_bytes)
            and fmt.name != "fixed"
            and not formats.named_codec(inp.name)
        ):
            return inp
        async with gate:
            head = await blobs.get_range(inp.url, 0, formats.SNIFF_BYTES)
        codec = formats.sniff(head)
        named = formats.named_codec(inp.name)
        if named and not codec:
            log.warning(
                f"input {inp.name} is named as {named} data but does not start as {named} "
                "does: it is read as it is"
            )
        if not codec and fmt.name == "fixed" and inp.size % fmt.record_len:
            raise UsageError(
                f"input {inp.name} holds {inp.size:,} bytes, not a whole number of "
                f"{fmt.record_len}-byte records (input format {fmt}): check the record "
                "length, or remove the file from the input"
            )
        return Input(inp.url, inp.size, inp.name, codec) if codec else inp

    return list(await asyncio.gather(*(one(i) for i in inputs)))


@dataclass(frozen=True)
class OutputPlace:
    url: str  # where workers publish
    replaces: str  # etag of the manifest the job's publication replaces ("": none)
    replaced: tuple[str, ...]  # part files the job's publication removes once it stands
    fetch: dict[str, Any] | None = None  # a local directory the client fetches into (aws)
    make: Path | None = None  # a local output directory to create once all checks passed


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


async def prepare_output(
    backend: Backend, output: str, job_id: str, overwrite: bool
) -> OutputPlace:
    """Check the output place now, before any work: it is usable, empty or replaced on
    purpose, and not owned by a running job."""
    if is_local(output):
        # Probed, not made: a job refused for something else leaves no directory behind.
        path = await asyncio.to_thread(probe_output_dir, output)
        url = file_url(path) + "/"
        etag, replaced = await _inspect(EmbeddedBlobs(), url, output, overwrite)
        if backend.capabilities.local_files:
            return OutputPlace(url, etag, replaced, make=path)
        if len(replaced) > MAX_REPLACED_LOCAL:
            raise UsageError(
                f"output {output} holds {len(replaced):,} part files; remove them first"
            )
        # Workers cannot write here: they publish to the job's results, which we fetch.
        results = f"{backend.scratch.rstrip('/')}/results/{job_id}/"
        fetch = {"dir": str(path), "replaces": etag, "replaced": list(replaced)}
        return OutputPlace(results, "", (), fetch, make=path)
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
    # Everything checkable before work starts, cheapest first, and nothing written until
    # all of it passed: the places, the local input's files, the output.
    check_apart(source, output)
    side = await asyncio.to_thread(sidefiles.gather, ref, options.files)
    local = await local_input(source)
    place = await prepare_output(backend, output, job_id, options.overwrite)
    scratch = job_scratch(backend.scratch, job_id)
    try:
        return await _submit(
            backend, ref, source, local, output, options, job_id, place, queue_prefix,
            parallelism, split_bytes, memory_bytes, side,
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
        await backend.blobs.delete_prefix(sidefiles.side_files_url(backend.scratch, job_id))


async def _delete_queue(backend: Backend, name: str) -> None:
    with contextlib.suppress(QueueGone):
        await backend.queues.delete(name)


async def _submit(
    backend: Backend,
    ref: JobRef,
    source: str,
    local: LocalInput | None,
    output: str,
    options: JobOptions,
    job_id: str,
    place: OutputPlace,
    queue_prefix: str,
    parallelism: int,
    split_bytes: int | None,
    memory_bytes: int | None,
    side: list[sidefiles.Given],
) -> JobSpec:
    input_root, inputs = await _input_blobs(backend, source, local, job_id)
    total = sum(i.size for i in inputs)
    # A run from a later step reads what the step before wrote: pairs, each file whole.
    given = "pairs" if options.first_step > 0 else options.input_format
    fmt = formats.parse_input(given or load_job_class(ref).input_format)
    check_formats(load_job_class(ref), str(fmt))
    split_bytes = split_bytes or choose_split_bytes(total, parallelism, memory_bytes)
    inputs = await sniff_inputs(backend.blobs, inputs, fmt, split_bytes)
    tasks = plan(inputs, split_bytes, fmt)
    if options.partitions > max(FEW_REDUCERS, REDUCERS_PER_MAP * len(tasks)):
        log.warning(
            "far more reducers than the input needs: most parts will be empty, and each "
            "costs a queue and a reduce task; fewer --reducers are faster",
            reducers=options.partitions,
            map_tasks=len(tasks),
        )
    scratch = job_scratch(backend.scratch, job_id)
    cuts = None
    if sampling.check(load_job_class(ref), options.total_order, options.job_steps):
        cuts = await sampling.cut_points(
            backend.blobs, ref, options.params, options.lines, tasks, options.partitions,
            options.task_timeout_s, fmt,
        )  # fmt: skip
    data = Plan(tuple(tasks), place.replaced, cuts).to_bytes()
    await backend.blobs.put(plan_url(scratch), data)
    many = options.job_steps > 1
    longest = f"{queue_prefix}{job_id}-s{options.job_steps}-p00000"
    if many and len(longest) > MAX_QUEUE_NAME:
        raise UsageError(
            f"the queue prefix {queue_prefix!r} is too long for a job of {options.job_steps} "
            f"steps: its last step's queues would be named like {longest} ({len(longest)} "
            f"characters; SQS allows {MAX_QUEUE_NAME}): use a prefix of at most "
            f"{MAX_QUEUE_NAME - len(longest) + len(queue_prefix)} characters"
        )
    spec = JobSpec(
        job_id,
        ref,
        dict(options.params),
        len(tasks),
        options.step_partitions[0] if many else options.partitions,
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
        lines=options.lines,
        step=options.first_step,
        first_step=options.first_step,
        last_step=options.last_step,
        pipeline=job_id if many else "",
        step_partitions=options.step_partitions if many else (),
        job_steps=options.job_steps,
        input_format=str(fmt),
        output_format=options.output_format,
        files=await sidefiles.stage(backend, job_id, side),
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
    if place.make is not None:
        await asyncio.to_thread(make_output_dir, place.make, output)
    await record_submit(backend, spec, extra)
    return spec
