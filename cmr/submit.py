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
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cmr import (
    adapters,
    bulk,
    formats,
    joboptions,
    logs,
    places,
    sampling,
    sidefiles,
    usage,
    wire,
)
from cmr.backends.base import Backend, BlobInfo, Blobs
from cmr.errors import BackendError, BlobMissing, QueueGone, UsageError
from cmr.fileurls import file_url
from cmr.inputs import (
    base_of,
    glob_keeps,
    has_magic,
    listed_is_input,
    literal_prefix,
    match_root,
    name_below,
)
from cmr.job import Job, check_formats
from cmr.jobload import LoadedJob
from cmr.lifecycle import cleanup, end, job_scratch, load_spec, record_submit
from cmr.localcheck import stat_identity
from cmr.localinput import glob_matches, local_files_stat
from cmr.places import check_apart, make_output_dir, probe_output_dir
from cmr.plan import Check, Plan, plan_url
from cmr.publish import (
    MANIFEST,
    Manifest,
    OutputConflict,
    existing_parts,
    read_manifest,
)
from cmr.records import (
    MAX_INPUTS,
    OUTPUTS_PK,
    JobSpec,
    JobState,
    job_pk,
    new_job_id,
)
from cmr.split import Input, choose_split_bytes, never_cut, plan

STAGE_CONCURRENCY = 16
MAX_QUEUE_NAME = 80  # SQS's limit on a queue's name
MAX_REPLACED_LOCAL = 5_000  # part files a fetched local output may replace (kept in the record)
# Reducers past both of these for a job's map tasks are mostly empty parts: a warning.
FEW_REDUCERS = 64
REDUCERS_PER_MAP = 16

log = logs.get_logger("cmr.submit")

is_local = places.is_local
local_path = places.local_path  # where cmr.watch finds it
JobOptions = joboptions.JobOptions  # what submit takes; harnesses and tests find it here


Sources = str | Sequence[str]  # one input, or several (--input given more than once)


def input_list(source: Sources) -> tuple[str, ...]:
    """The run's inputs, each given (never empty)."""
    given = (source,) if isinstance(source, str) else tuple(source)
    if not given:
        raise UsageError("no --input given: give a file, a directory, a glob or an s3:// URL")
    for s in given:
        if not isinstance(s, str) or not s.strip():
            raise UsageError(
                f"--input {s!r} is empty: give a file, a directory, a glob or an s3:// URL"
            )
    return given


@dataclass(frozen=True)
class LocalInput:
    """A local input root (a file or a directory; each match of a glob), listed and checked
    (:mod:`cmr.localinput`) before anything is written."""

    path: Path
    # Each file with its identity as it was listed and checked (cmr.localcheck): what a
    # task that reads it in place must find.
    files: list[tuple[Path, Check]]
    pattern: str = ""  # the glob it matches ("": named outright)

    @classmethod
    def of(cls, path: Path, pattern: str = "") -> LocalInput:
        """The root's files, listed and checked."""
        return cls(path, [(f, stat_identity(st)) for f, st in local_files_stat(path)], pattern)


def _local_roots(source: str) -> list[LocalInput]:
    path = local_path(source)
    if has_magic(str(path)) and not os.path.lexists(path):
        pattern = str(path)
        matches = glob_matches(pattern, source)
        return [LocalInput.of(m, pattern) for m in matches]
    return [LocalInput.of(path)]


async def local_inputs(sources: Sources) -> list[list[LocalInput] | None]:
    """For each input, its local roots, checked; None for an input in a store."""
    return [
        await asyncio.to_thread(_local_roots, s) if is_local(s) else None
        for s in input_list(sources)
    ]


@dataclass(frozen=True)
class _Found:
    url: str  # where workers read it ("": a local file to stage)
    size: int
    location: str  # its path, names are made from: absolute (local), or its s3:// URL
    check: Check | None = None  # a local file read in place: its identity (cmr.localcheck)


@dataclass(frozen=True)
class _Root:
    location: str  # the file or directory (no trailing "/")
    is_dir: bool
    record: str  # the root the job record names ("": a glob, or staged, covers it)
    found: list[_Found]

    @property
    def directory(self) -> str:
        return self.location if self.is_dir else self.location.rsplit("/", 1)[0] or "/"


@dataclass(frozen=True)
class Listing:
    """A run's inputs, listed: what the job record names, and every file in order."""

    roots: tuple[str, ...]  # files (exact) and directories or prefixes (ending in "/")
    globs: tuple[str, ...]  # patterns a glob input's matches are read under
    inputs: list[Input]
    base: str  # what map's names are below (cmr.inputs.base_of); the one file, if one_file
    one_file: bool  # a single file, named outright: map's name is its own
    # Local files read in place: what each must be when a task reads it (the plan's checks).
    checks: dict[str, Check] = field(default_factory=dict)


async def list_input(backend: Backend, source: Sources, job_id: str) -> tuple[str, list[Input]]:
    """(first root, files) of the inputs: a file (or object) alone, or everything below a
    directory (or prefix, taken as a directory: ``s3://b/logs`` means ``s3://b/logs/``,
    not logs2/), or a glob's matches; see :func:`list_inputs`."""
    listing = await list_inputs(backend, source, await local_inputs(source), job_id)
    return (listing.roots or listing.globs)[0], listing.inputs


async def list_inputs(
    backend: Backend, source: Sources, local: list[list[LocalInput] | None], job_id: str
) -> Listing:
    """Every input's files, named below their common directory (:mod:`cmr.inputs`); local
    files are staged to the job's scratch for a backend that cannot read them."""
    readable = backend.capabilities.local_files
    roots: list[_Root] = []
    globs: list[str] = []
    for s, here in zip(input_list(source), local, strict=True):
        if here is not None:
            roots += [_local_root(li, readable) for li in here]
            # Staged files lie under the job's scratch, which the record names instead.
            globs += sorted({file_url(li.pattern) for li in here if li.pattern and readable})
        else:
            found, glob = await _store_roots(backend.blobs, s)
            roots += found
            globs += [glob] if glob else []
    to_stage = any(not f.url for r in roots for f in r.found)
    scratch = [f"{job_scratch(backend.scratch, job_id)}input/"] if to_stage else []
    record = tuple(dict.fromkeys(scratch + [r.record for r in roots if r.record]))
    if len(record) + len(set(globs)) > MAX_INPUTS:
        raise UsageError(
            f"{len(record) + len(set(globs)):,} inputs given (at most {MAX_INPUTS}; a glob is "
            "one): give their directory, or a glob, instead of each file"
        )
    base = base_of([r.directory for r in roots])
    one_file = len(roots) == 1 and not roots[0].is_dir and not globs
    files = [(f, name_below(base, f.location)) for r in roots for f in r.found]
    if to_stage:
        files = await _stage(backend, files, job_id)
    inputs = [Input(f.url, f.size, name) for f, name in files]
    checks = {f.url: f.check for f, _ in files if f.check is not None}
    return Listing(record, tuple(dict.fromkeys(globs)), inputs,
                   roots[0].location if one_file else base, one_file, checks)  # fmt: skip


def _local_root(li: LocalInput, readable: bool) -> _Root:
    """A local root's files (those a cmr output's manifest lists, for one): by URL where
    workers read them in place (``readable``), else to stage."""
    path, files = li.path, li.files
    if path.is_dir() and (path / MANIFEST).is_file():
        keep = _output_files((path / MANIFEST).read_bytes())
        files = [(f, c) for f, c in files if f.parent != path or keep(f.name)]
    found = []
    for f, check in files:
        # Read in place: a task reads only this file (inode) as it was when listed and
        # checked, a moment ago (cmr.localcheck).
        found.append(_Found(file_url(f) if readable else "", check.size, str(f),
                            check if readable else None))  # fmt: skip
    own = file_url(path) + ("/" if path.is_dir() else "")
    return _Root(str(path), path.is_dir(), own if readable and not li.pattern else "", found)


async def _store_roots(blobs: Blobs, source: str) -> tuple[list[_Root], str]:
    """(roots, glob) of an input in a store: an object, a glob's matches, or a prefix."""
    try:
        return [
            _Root(source, False, source, [_Found(source, await blobs.size(source), source)])
        ], ""
    except BlobMissing:
        pass
    if has_magic(source):
        return await _store_glob(blobs, source), source
    root = source.rstrip("/") + "/"
    listed = await blobs.list(root)
    found = _below(root, listed)
    if not found:
        hidden = " but hidden ones (names starting with _ or .)" if listed else ""
        raise UsageError(
            f"input {source} holds no files{hidden} (no object is named so, nor lies under "
            f"{root}): check the bucket and prefix, or upload the input first"
        ) from None
    if any(b.url == root + MANIFEST for b in listed):
        keep = _output_files(await blobs.get(root + MANIFEST))
        found = [f for f in found if "/" in f.url[len(root) :] or keep(f.url[len(root) :])]
    return [_Root(root.rstrip("/"), True, root, found)], ""


def _below(root: str, listed: list[BlobInfo]) -> list[_Found]:
    """The input files of a listing under ``root``: hidden paths (cmr.inputs) left out."""
    return [
        _Found(b.url, b.size, b.url)
        for b in listed
        if b.url != root and listed_is_input(b.url[len(root) :])
    ]


async def _store_glob(blobs: Blobs, pattern: str) -> list[_Root]:
    """The roots an S3 glob matches: everything under its literal start is listed, and each
    key matched component by component (a match may be an object or a prefix)."""
    listed = await blobs.list(literal_prefix(pattern))
    by_match: dict[str, list[BlobInfo]] = {}
    for b in listed:
        m = match_root(pattern, b.url)
        if m is not None and glob_keeps(pattern, m):
            by_match.setdefault(m, []).append(b)
    roots: list[_Root] = []
    for m, under in sorted(by_match.items()):
        if any(b.url == m for b in under):
            roots.append(_Root(m, False, "", [_Found(m, b.size, m) for b in under if b.url == m]))
        if found := _below(m + "/", [b for b in under if b.url.startswith(m + "/")]):
            roots.append(_Root(m, True, "", found))
    if not roots:
        raise UsageError(
            f"input pattern {pattern} matches no files: check the pattern and the bucket, "
            "or upload the input first"
        )
    return roots


async def _stage(
    backend: Backend, files: list[tuple[_Found, str]], job_id: str
) -> list[tuple[_Found, str]]:
    """Upload local files to the job's scratch area, each under its name (a file given
    twice is uploaded once, read twice); the files with their URLs there."""
    root = f"{job_scratch(backend.scratch, job_id)}input/"
    gate = asyncio.Semaphore(STAGE_CONCURRENCY)
    uploads = {root + name: f.location for f, name in files if not f.url}

    async def up(url: str, location: str) -> None:
        async with gate:
            await backend.blobs.upload_file(location, url)

    await asyncio.gather(*(up(u, loc) for u, loc in uploads.items()))
    return [(f if f.url else _Found(root + name, f.size, f.location), name) for f, name in files]


def _with_input_uri(cls: type[Job], options: JobOptions, listing: Listing) -> JobOptions:
    """The options with what the inputs' listing tells the job's adapter, if it has one
    (cmr.adapters): an mrjob job's gain the URI its map's names are below (mrjob's
    ``mapreduce.map.input.file``), known once the inputs are listed."""
    params = adapters.inputs_listed(cls, options.params, listing.base, listing.one_file)
    return options if params == options.params else replace(options, params=params)


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

    def told_by_worker(inp: Input) -> bool:
        return inp.size == 0 or (
            never_cut(inp.size, split_bytes)
            and fmt.name != "fixed"
            and not formats.named_codec(inp.name)
        )

    async def one(inp: Input) -> Input:
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

    # Only the files to sniff get a task (20,000 small files: none, and no 20,000 tasks).
    sniffed = iter(await asyncio.gather(*(one(i) for i in inputs if not told_by_worker(i))))
    return [i if told_by_worker(i) else next(sniffed) for i in inputs]


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
        etag, replaced = await _inspect(backend.local_blobs, url, output, overwrite)
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
    job: LoadedJob,
    source: Sources,
    output: str,
    options: JobOptions,
    *,
    queue_prefix: str,
    parallelism: int,
    split_bytes: int | None = None,
    memory_bytes: int | None = None,
) -> JobSpec:
    job_id = new_job_id()
    # From here the caller works for this job (cmr.usage): its requests, and the tasks it
    # makes after (the watch), are the job's cost. run_on puts the caller's back.
    usage.JOB.set(job_id)
    # Everything checkable before work starts, cheapest first, and nothing written until
    # all of it passed: the places, the local input's files, the output.
    sources = input_list(source)
    for s in sources:
        check_apart(s, output)
    side = await asyncio.to_thread(sidefiles.gather, job, options.files)
    local = await local_inputs(sources)
    for here in local:  # a glob's matches (and links) as they resolve
        for li in here or ():
            check_apart(str(li.path), output)
    place = await prepare_output(backend, output, job_id, options.overwrite)
    scratch = job_scratch(backend.scratch, job_id)
    try:
        return await _submit(
            backend,
            job,
            output,
            options,
            job_id=job_id,
            sources=sources,
            local=local,
            place=place,
            side=side,
            queue_prefix=queue_prefix,
            parallelism=parallelism,
            split_bytes=split_bytes,
            memory_bytes=memory_bytes,
        )
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
    job: LoadedJob,
    output: str,
    options: JobOptions,
    *,
    job_id: str,
    sources: tuple[str, ...],
    local: list[list[LocalInput] | None],
    place: OutputPlace,
    side: list[sidefiles.Given],
    queue_prefix: str,
    parallelism: int,
    split_bytes: int | None,
    memory_bytes: int | None,
) -> JobSpec:
    """The submission once everything checkable before work started passed (``submit``):
    what it found is passed by name (the job's id, its sources, their local files, the
    output's place, the side files), as are the sizing hints."""
    listing = await list_inputs(backend, sources, local, job_id)
    options = _with_input_uri(job.cls, options, listing)
    inputs = listing.inputs
    total = sum(i.size for i in inputs)
    # A run from a later step reads what the step before wrote: pairs, each file whole.
    given = "pairs" if options.first_step > 0 else options.input_format
    fmt = formats.parse_input(given or job.cls.input_format)
    check_formats(job.cls, str(fmt))
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
    if sampling.check(job.cls, options.total_order, options.job_steps):
        cuts = await sampling.cut_points(
            backend.blobs, job, options.params, options.lines, tasks, options.partitions,
            options.task_timeout_s, fmt,
        )  # fmt: skip
    planned = {r.url for t in tasks for r in t}
    checks = {u: c for u, c in listing.checks.items() if u in planned}
    data = Plan(tuple(tasks), place.replaced, cuts, checks).to_bytes()
    many_roots = len(listing.roots) > 1 or bool(listing.globs)
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
        job_id=job_id,
        ref=job.ref,
        params=dict(options.params),
        maps=len(tasks),
        partitions=options.step_partitions[0] if many else options.partitions,
        output=place.url,
        scratch=backend.scratch,
        queue_prefix=queue_prefix,
        visibility_s=options.visibility_s,
        max_task_failures=options.max_task_failures,
        max_task_attempts=options.max_task_attempts,
        task_timeout_s=options.task_timeout_s,
        plan_digest=Plan.digest(data),
        replaces=place.replaces,
        # One root as before; several, or a glob's pattern: each, named in the record.
        input_root=(listing.roots or listing.globs)[0],
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
        input_roots=listing.roots if many_roots else (),
        input_globs=listing.globs,
        shuffle=_shuffle(options.shuffle, total, backend.capabilities.free_requests),
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
        "input": ", ".join(sources),  # what `cmr status` shows
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


def _shuffle(mode: str, input_bytes: int, free_requests: bool) -> str:
    """The job record's shuffle. ``auto`` is the blob store for a large input (a sort
    shuffles all of it) on a store that bills requests, queues otherwise
    (cmr.bulk.AUTO_BLOB_BYTES). Where requests cost nothing (the embedded store) the blob
    path saves nothing and adds a copy and a hash of every byte: TeraSort of 2 GB took
    34.97 s through it against 25.86 s through queues (benchmarks/RESULTS.md)."""
    if mode != "auto":
        return mode
    return "blob" if input_bytes >= bulk.AUTO_BLOB_BYTES and not free_requests else "queue"
