"""A map task: read the split, map/combine/partition in the pool, send tagged batches, and
commit the attempt.

Duplicate deliveries of a task are allowed to run (method 1 of the seeds): every attempt
has its own id and tags its batches with it; after all its batches are sent, the attempt
tries to write the task's commit record *if absent*. The first such write wins, forever;
reducers take only the winner's batches, so a losing or crashed attempt's output is never
counted.

The task message is only a pointer: the split's ranges come from the job's plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgpack

from cmr import bulk, failures, formats, rangefile, sidefiles, tracking, wire
from cmr import digest as digests
from cmr.aio import TaskGroup, first_error
from cmr.backends.base import Put, Received, item_absent
from cmr.cpu.mapping import FileSlice, run_map
from cmr.cpu.results import MapResult
from cmr.cpu.specs import MapSpec, map_max_record, map_piece_bytes
from cmr.errors import BackendError, BlobMissing, ConditionFailed, QueueGone, TaskError, WireError
from cmr.fileurls import file_path
from cmr.lease import message_lease
from cmr.lifecycle import job_scratch, spill_url, write_while_running
from cmr.localcheck import CheckedFile, InputChanged
from cmr.plan import Check
from cmr.records import JobSpec, MapCommit, job_pk, map_sk, pages_for
from cmr.runtime import Runtime, WorkerCrashed
from cmr.split import read_range
from cmr.timelimit import task_limit

SEND_CONCURRENCY = 16  # SendMessageBatch calls in flight, and so at most this many batches
# of bodies held in memory at once: the spool is streamed, never loaded whole
PENDING_BYTES = 16 * 1024 * 1024  # bodies waiting for a full batch of 10, all partitions


async def run_map_task(
    rt: Runtime, spec: JobSpec, msg: Received | None, task: wire.MapTask
) -> None:
    """One attempt of the map task. ``msg`` None: a straggler's backup (:mod:`cmr.backup`),
    which holds no task message: it renews, deletes and fails none, and its failure is only
    its own (the attempt it backs up goes on, and is counted if it fails too)."""
    in_q = spec.queues()[0]
    table, queues = rt.backend.table, rt.backend.queues
    pk = job_pk(spec.job_id)
    stats: Counter[str] = Counter()
    if await table.get(pk, map_sk(task.task)) is not None:
        stats["map_duplicates_skipped"] += 1
        if msg is not None:
            await queues.delete_messages(in_q, [msg.receipt])
        await rt.add_stats(spec.job_id, stats)
        return
    ref = failures.TaskRef.map(task.task)
    redelivered = msg is not None and msg.receive_count > 1
    if redelivered and not await failures.map_redelivered(rt, spec, ref):
        return  # started too often: the job was failed
    attempt = secrets.token_hex(6)
    row = tracking.Tracked(rt.backend, spec.job_id, "m", task.task, attempt, rt.worker_id)
    if not await row.start(backup=msg is None):
        return  # the job has ended
    try:
        await _attempt(rt, spec, msg, task, attempt, row, stats)
    except WorkerCrashed:
        raise  # a dead worker writes nothing: its row stays running, as a killed one's does
    except Exception as exc:
        with contextlib.suppress(BackendError):
            await row.end("failed", failures.describe(exc))
        raise
    await rt.add_stats(spec.job_id, stats)


async def _failed(
    rt: Runtime,
    spec: JobSpec,
    msg: Received | None,
    row: tracking.Tracked,
    task: int,
    error: str,
    *,
    permanent: bool = False,
) -> None:
    """The attempt failed: counted against the task (a backup's failure only ends it)."""
    await row.end("failed", error)
    if msg is not None:
        ref = failures.TaskRef.map(task)
        await failures.task_failed(rt, spec, ref, error, spec.queues()[0], msg, permanent=permanent)


def _leased(rt: Runtime, spec: JobSpec, msg: Received | None) -> AbstractAsyncContextManager[Any]:
    if msg is None:
        return contextlib.nullcontext()
    in_q = spec.queues()[0]
    return message_lease(rt.backend.queues, in_q, msg.receipt, spec.visibility_s, rt.awake)


async def _attempt(
    rt: Runtime,
    spec: JobSpec,
    msg: Received | None,
    task: wire.MapTask,
    attempt: str,
    row: tracking.Tracked,
    stats: Counter[str],
) -> None:
    in_q, _, part_qs = spec.queues()
    table, queues = rt.backend.table, rt.backend.queues
    pk = job_pk(spec.job_id)
    log = rt.log.bind(job=spec.job_id, task=task.task, attempt=attempt)
    async with _leased(rt, spec, msg):
        ranges, cuts, checks = await _ranges(rt, spec, task.task)
        files_dir = await sidefiles.fetch(rt, spec)
        fmt = _input_format(spec)
        # The read is under the task's time limit too (a hostile input, say one endless
        # line, must not hold the task in this process, where no SIGALRM reaches it). A
        # streamed range is read by the pool process, under its own limit (_map_streamed).
        task_bytes = sum(r.end - r.start for r in ranges)
        read_limit = task_limit(spec.task_timeout_s, task_bytes)
        # A large task of fixed records streams its ranges from the store into the pool
        # process through FIFOs (cmr.rangefile), never to local disk; the FIFOs and their
        # directory are removed however the task ends.
        with _stream(rt, fmt, task_bytes) as stream:
            try:
                async with asyncio.timeout(read_limit):
                    # In a task group: one range failing stops the others' reads.
                    chunks = await _read_all(rt, ranges, fmt, checks, stream)
            except TimeoutError:
                await _failed(rt, spec, msg, row, task.task, _read_too_long(task.task, read_limit))
                return
            # Compression is told by a file's first bytes (decompressing is the pool's work);
            # a slice was told uncompressed by its head.
            codecs = tuple(
                formats.sniff(c[: formats.SNIFF_BYTES])
                if r.start == 0 and not isinstance(c, FileSlice)
                else ""
                for r, c in zip(ranges, chunks, strict=True)
            )
            if any(codecs):
                # A compressed file is a whole-file range: nothing past its end is ours.
                chunks = [
                    c[: r.end] if k and isinstance(c, bytes) and len(c) > r.end else c
                    for r, c, k in zip(ranges, chunks, codecs, strict=True)
                ]
            nbytes = sum(len(c) for c in chunks)
            map_limit = task_limit(spec.task_timeout_s, nbytes)
            mapping = rt.cpu(
                run_map,
                spec.ref,
                spec.params,
                [(r.name, data) for r, data in zip(ranges, chunks, strict=True)],
                MapSpec.of(
                    spec,
                    rt.settings,
                    task=task.task,
                    attempt=attempt,
                    queue_limit=queues.max_message_bytes,
                    spool_dir=rt.spool_dir,
                    limit_s=map_limit,
                    input_format=str(fmt),
                    codecs=codecs,
                    starts=tuple(r.start for r in ranges),
                    files_dir=files_dir,
                    cuts=cuts,
                ),
                limit_s=map_limit,
            )
            del chunks
            result = await _map_streamed(mapping, stream, ranges, task.task, map_limit)
        if result.error:
            await _failed(rt, spec, msg, row, task.task, result.error, permanent=result.permanent)
            return
        written, spiller = None, _Spiller(rt, spec, task.task, attempt)
        ended = False  # the job ended before this attempt's pages were written
        try:
            if spec.shuffle == "blob":
                written = await bulk.write_object(
                    rt, spec, task.task, attempt, result.spool, spiller.body
                )
                try:
                    await bulk.write_pages(rt, spec, task.task, attempt, written, result)
                except ConditionFailed:
                    ended = True  # written only while the job runs: it does not
                await rt.step(
                    "map.shuffle_written", job=spec.job_id, task=task.task, attempt=attempt
                )
            else:
                await _send_spool(rt, spec, task.task, attempt, result.spool, part_qs, spiller)
        finally:
            os.unlink(result.spool)
        paged = written is not None
        commit = MapCommit(
            attempt,
            {} if paged else {p: b for p, b in enumerate(result.batches) if b},
            {} if paged else {p: r for p, r in enumerate(result.records) if r},
            result.records_in,
            result.bytes_in,
            result.counters,
            pages=pages_for(spec.partitions) if paged else 0,
        )
        try:
            if ended:
                raise ConditionFailed("the job ended")
            # Only while the job runs: an attempt that wakes after its job ended and was
            # cleaned up must not leave a record behind.
            put = Put(pk, map_sk(task.task), commit.to_item(), item_absent())
            await write_while_running(rt.backend, spec.job_id, put)
            won = True
        except ConditionFailed:
            # Another attempt won, or the job ended. (A retry of our own write that was
            # applied the first time is answered as applied, by its token.)
            held = await table.get(pk, map_sk(task.task), consistent=True)
            won = held is not None and held.get("attempt") == attempt
        if result.status:
            log.info("map task status", status=result.status)
        await row.end("committed" if won else "lost")
        if not won:
            stats["map_attempts_filtered"] += 1
            log.info("map attempt lost to an earlier commit; its batches will be ignored")
            if written is not None:
                # Never read (no commit names it); the job's cleanup would delete it too.
                with contextlib.suppress(BackendError):
                    await rt.backend.blobs.delete([written.url, *spiller.spills])
        else:
            # For progress displays only: finalize writes exact totals from the commits.
            stats["progress_maps"] += 1
            stats["progress_bytes"] += result.bytes_in
        await rt.step("map.committed", job=spec.job_id, task=task.task, attempt=attempt, won=won)
        if msg is not None:
            await queues.delete_messages(in_q, [msg.receipt])


async def _ranges(
    rt: Runtime, spec: JobSpec, task: int
) -> tuple[tuple[wire.Range, ...], tuple[Any, ...] | None, Mapping[str, Check]]:
    """The task's input ranges, the job's cut points (total order; None: hashed), and what
    the plan says each input object must be when read (cmr.plan.Check; most have none)."""
    try:
        plan = await rt.plan(spec, job_scratch(spec.scratch, spec.job_id))
    except (BlobMissing, WireError) as exc:
        raise TaskError(f"the job's plan cannot be read: {exc}") from exc
    if task >= len(plan.tasks):
        raise TaskError(f"the job's plan has {len(plan.tasks)} map tasks, not task {task}")
    for r in plan.tasks[task]:
        if not spec.owns_input(r.url):
            raise TaskError(
                f"the job's plan names {r.url[:200]!r}, outside its input {spec.input_root}"
            )
    return plan.tasks[task], plan.cuts, plan.checks


def _input_format(spec: JobSpec) -> formats.InputFormat:
    try:
        return formats.parse_input(spec.input_format or "lines")  # "": a record of before
    except formats.FormatError as exc:  # JobSpec.from_item refuses it first
        raise TaskError(str(exc)) from None


def _read_too_long(task: int, limit_s: float) -> str:
    return (
        f"TimeLimitExceeded: reading the input of map task {task} ran past its time limit "
        f"of {limit_s:.0f} s (a slow store, or input too large for the task; give the job "
        "more with --task-timeout SECONDS if it needs it)"
    )


async def _map_streamed(
    mapping: Coroutine[Any, Any, MapResult],
    stream: rangefile.Stream | None,
    ranges: Sequence[wire.Range],
    task: int,
    limit_s: float,
) -> MapResult:
    """The pool's call (``mapping``, limited to ``limit_s``), with the task's streamed
    ranges (if any) pumped into it meanwhile.

    The pump needs no time limit of its own: the pool process reads the stream as it comes,
    under the task's limit (and the worker's hard limit past it), and the pump is stopped
    once the call ends, however it ends (the pool process stopped reading: a bad record,
    its time limit, its death, this task cancelled), or it would wait for room in a pipe
    nobody reads. A failed fetch closes the pipes: the pool process then reads a short
    range and stops, and the fetch's error (the cause) is what the task reports."""
    if not stream:
        return await mapping
    try:
        pump = stream.start()
    except BaseException:
        mapping.close()  # never started
        raise
    try:
        result = await mapping
        if result.error.startswith("TimeLimitExceeded") and stream.starved:
            # The pool process ran out of time waiting for its input: the store was slow.
            result.error = _read_too_long(task, limit_s)
    finally:
        pump.cancel()  # nothing, if it is done
        await asyncio.wait([pump])
    failed = None if pump.cancelled() else pump.exception()
    if failed is None or not result.error:
        # A pump that failed after the pool process read every byte has nothing to say.
        return result
    if isinstance(failed, (BlobMissing, EOFError)) and stream.failed is not None:
        raise _lost_input(ranges[stream.failed]) from None
    raise failed


async def _read_all(
    rt: Runtime,
    ranges: Sequence[wire.Range],
    fmt: formats.InputFormat,
    checks: Mapping[str, Check],
    stream: rangefile.Stream | None,
) -> list[bytes | FileSlice]:
    """Every range's bytes or slice, in order; the first error, as itself, once the other
    reads have stopped."""
    try:
        async with TaskGroup() as group:
            reads = [
                group.create_task(_read_or_slice(rt, r, fmt, checks.get(r.url), stream, i))
                for i, r in enumerate(ranges)
            ]
    except BaseExceptionGroup as errors:
        raise first_error(errors) from None
    return [t.result() for t in reads]


async def _read_or_slice(
    rt: Runtime,
    r: wire.Range,
    fmt: formats.InputFormat,
    check: Check | None = None,
    stream: rangefile.Stream | None = None,
    key: int = 0,
) -> bytes | FileSlice:
    """A split's bytes; or, for uncompressed fixed records (a range is exactly its bytes),
    a slice the pool process reads itself, a piece at a time: of the input file itself on a
    backend whose blobs are local files, or, in a large task (``stream``), of a FIFO the
    range will be streamed through (cmr.rangefile; ``key``: the range's place in the task,
    the order the pool process reads the FIFOs in and so the order they are written in)."""
    if check is not None and check.digest:
        return await _read_verified(rt, r, check)
    local = rt.backend.capabilities.local_files
    if fmt.name != "fixed" or r.start >= r.end or not (local or stream is not None):
        return await _read(rt, r, fmt, check)
    if r.start == 0:  # a compressed file is one range from 0: its head tells
        head = wire.Range(r.url, 0, min(r.end, formats.SNIFF_BYTES), r.name)
        if formats.sniff(await _read(rt, head, fmt, check)):
            return await _read(rt, r, fmt, check)
    if stream is not None:  # never on a backend of local files
        fifo = stream.add(key, r.url, r.start, r.end)
        return FileSlice(fifo, 0, r.end - r.start, r.name, stream=True)
    path = file_path(r.url)  # local_files: a file:// URL
    try:
        regular = stat.S_ISREG(path.stat().st_mode)  # a syscall: no thread hop per file
    except FileNotFoundError:
        regular = False
    except OSError as exc:
        raise _lost_input(r, exc) from None
    if not regular:  # as the blob store answers for a vanished file, or a directory there
        raise _lost_input(r)
    # The pool process opens it and compares it with the file submitted (cmr.localcheck).
    return FileSlice(str(path), r.start, r.end, r.name, _identity(rt, check))


async def _read_verified(rt: Runtime, r: wire.Range, check: Check) -> bytes:
    """The whole object ``r`` names, only if it is what the plan says (a pipeline step's
    committed output: its size and digest, as its commit recorded). Read at most one byte
    past that size, and compared before anything decodes it: a bucket writer who replaced
    the part makes the task fail (permanently: a retry would read the same bytes), and a
    bomb put in its place is never decompressed."""
    if (r.start, r.end) != (0, check.size):
        raise TaskError(
            f"the job's plan reads bytes {r.start} to {r.end} of input {r.name}, whose check "
            f"covers the whole object ({check.size:,} bytes): the plan is not one cmr made"
        )
    try:
        data = await rt.backend.blobs.get_range(r.url, 0, check.size + 1)
    except BlobMissing:
        raise _lost_input(r) from None
    except OSError as exc:
        raise _lost_input(r, exc) from None
    digest = await digests.hex_async(data)
    if len(data) != check.size or digest != check.digest:
        got = f"{check.size:,}+" if len(data) > check.size else f"{len(data):,}"
        raise TaskError(
            f"input {r.name} of the step before ({r.url[:200]}) is not what its commit "
            f"recorded: {got} bytes, "
            f"{digests.NAME} {digest[:16]}..., where the commit says {check.size:,} bytes, "
            f"{digests.NAME} {check.digest[:16]}...; the bucket was written by someone else "
            "(rerun the job; a step's outputs are written only by its reducers)"
        )
    return data


def _lost_input(r: wire.Range, exc: OSError | None = None) -> TaskError:
    """Input that vanished (no ``exc``) or cannot be read since the job was submitted: a
    permanent failure, as no other worker or later try would find it either."""
    if exc is not None:
        return TaskError(f"input {r.name} ({r.url}) cannot be read: {exc}")
    return TaskError(
        f"input {r.name} ({r.url}) no longer exists: it was deleted or moved after the job "
        "was submitted"
    )


async def _read(
    rt: Runtime, r: wire.Range, fmt: formats.InputFormat, check: Check | None = None
) -> bytes:
    """A split's bytes; a TaskError (permanent) for input that vanished, cannot be read,
    changed since submit (a local file: cmr.localcheck), or holds a line longer than this
    worker's map tasks hold."""
    max_record = map_max_record(map_piece_bytes(rt.settings.memory_mb * 1024 * 1024))
    try:
        if (local := _identity(rt, check)) is not None:
            with CheckedFile(str(file_path(r.url)), r.name, local) as f:
                return await read_range(f, r, fmt, max_record)
        return await read_range(rt.backend.blobs, r, fmt, max_record)
    except (BlobMissing, FileNotFoundError, IsADirectoryError):
        raise _lost_input(r) from None
    except OSError as exc:
        raise _lost_input(r, exc) from None
    except (InputChanged, formats.InputError) as exc:
        raise TaskError(str(exc)) from None


@contextlib.contextmanager
def _stream(
    rt: Runtime, fmt: formats.InputFormat, task_bytes: int
) -> Iterator[rangefile.Stream | None]:
    """The task's stream (None: its input is read as it lies), removed at the end. Only
    fixed records can be (a range of them is exactly its bytes), and only from a remote
    store (a local file is read by the pool process as it lies)."""
    local = rt.backend.capabilities.local_files
    if fmt.name != "fixed" or local or not rangefile.streams(task_bytes):
        yield None
        return
    with rangefile.Stream(rt.backend.blobs, rt.spool_dir) as stream:
        yield stream


def _identity(rt: Runtime, check: Check | None) -> Check | None:
    """The file identity a local input must have when read (None: none to compare)."""
    if check is None or check.inode < 0 or not rt.backend.capabilities.local_files:
        return None
    return check


class _Spiller:
    """Puts a value too big for one message in a blob of its own; its batch points at it."""

    def __init__(self, rt: Runtime, spec: JobSpec, task: int, attempt: str) -> None:
        self.rt, self.spec, self.task, self.attempt = rt, spec, task, attempt
        self.spills: list[str] = []

    async def body(self, p: int, seq: int, n: int, stream: bytes) -> bytes:
        spec = self.spec
        url = spill_url(spec.scratch, spec.job_id, self.task, self.attempt, p, seq)
        self.spills.append(url)
        digest = await digests.hex_async(stream)
        await self.rt.backend.blobs.put(url, stream)
        return wire.encode(
            wire.Batch(spec.job_id, self.task, self.attempt, p, seq, n, b"", url, digest),
            compress=self.rt.settings.compress,
        )


async def _send_spool(
    rt: Runtime,
    spec: JobSpec,
    task: int,
    attempt: str,
    spool: str,
    part_qs: Sequence[str],
    spiller: _Spiller,
) -> None:
    queues, blobs = rt.backend.queues, rt.backend.blobs
    gate = asyncio.Semaphore(SEND_CONCURRENCY)
    sent = 0

    async def send(p: int, bodies: list[bytes]) -> None:
        nonlocal sent
        try:
            await queues.send(part_qs[p], bodies)
        finally:
            gate.release()
        sent += 1
        if sent == 1:
            await rt.step("map.partly_sent", job=spec.job_id, task=task, attempt=attempt)

    try:
        await _send_all(spool, gate, send, spiller.body)
    except BaseExceptionGroup as group:
        # Callers handle single backend errors (retry, abandon the attempt); not groups.
        first = first_error(group)
        if isinstance(first, QueueGone) and spiller.spills:
            # The job ended under us: our spilled values would outlive its cleanup.
            with contextlib.suppress(BackendError):
                await blobs.delete(spiller.spills)
        raise first from None


async def _send_all(
    spool: str,
    gate: asyncio.Semaphore,
    send: Callable[[int, list[bytes]], Coroutine[Any, Any, None]],
    spilled_body: Callable[[int, int, int, bytes], Coroutine[Any, Any, bytes]],
) -> None:
    """Stream the spool into sends; a send is started only when the gate admits it (``send``
    releases it), so the bodies in memory are bounded whatever the spool's size."""
    pending: dict[int, list[bytes]] = {}
    held = 0  # bytes waiting in partial batches
    async with TaskGroup() as tg:

        async def start(p: int) -> None:
            nonlocal held
            bodies = pending.pop(p)
            held -= sum(len(b) for b in bodies)
            await gate.acquire()
            tg.create_task(send(p, bodies))

        with open(spool, "rb") as f:
            for p, seq, n, data, spilled in msgpack.Unpacker(f, raw=False, use_list=False):
                body = await spilled_body(p, seq, n, data) if spilled else data
                pending.setdefault(p, []).append(body)
                held += len(body)
                if len(pending[p]) >= 10:
                    await start(p)
                elif held > PENDING_BYTES:
                    # Many partitions, each with a partial batch: send the fullest now.
                    await start(max(pending, key=lambda q: len(pending[q])))
        for p in list(pending):
            await start(p)
