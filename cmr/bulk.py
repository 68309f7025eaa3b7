"""The blob shuffle: a map attempt's batches as one object, read back part by part.

SQS bills each 64 KiB of a message as one request, so a shuffle carried in queue batches
costs dollars per TB moved (DESIGN.md, "The shuffle at cloud scale"). A job whose shuffle is
"blob" (``JobSpec.shuffle``; ``cmr run --shuffle``) sends no batch through a queue and has
no partition queues:

* a map attempt writes every batch it made into one object, ``shuffle/<task>-<attempt>``
  under the job's scratch (``cmr.lifecycle.shuffle_url``): partition after partition, each
  batch one msgpack bin holding the very body a queue would have carried, tag included.
  Before its commit record, it writes its pages (``MapPage``, one table item for each
  PAGE_PARTITIONS partitions, keyed by its attempt): each partition's part, offset, length
  and digest, with its batch and record counts. Its commit record names only how many
  pages it has: a record that named every part grew with the partitions, and every reducer
  read every one of them (benchmarks/cloudsort.py). A value too big for a batch still goes
  to a blob of its own, and its batch is a pointer to it, as on the queue path.
* a reducer learns the winning attempts from the commit records, as it always did, reads
  its page of each winner, and then only its part of the winner's object, in pieces,
  checking the digest and every batch's tag.

So the three duplicate rules of the seeds hold as before: only the winner's object is ever
read (its commit names it: method 1); no message can come twice, as there are none
(method 2 has nothing to do); reduce claims are fenced as they always were (method 3). A
losing attempt deletes its object; the job's cleanup deletes whatever is left under its
scratch, a crashed attempt's included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

import msgpack

from cmr import digest as digests
from cmr import wire
from cmr.backends.base import Put
from cmr.cpu.results import MapResult
from cmr.errors import BlobMissing, TaskError, WireError
from cmr.lifecycle import shuffle_url, write_all_while_running
from cmr.records import (
    PAGE_PARTITIONS,
    PART_DIGEST,
    JobSpec,
    MapCommit,
    MapPage,
    job_pk,
    page_sk,
    pages_for,
)
from cmr.runtime import Runtime

# A reducer reads a part in pieces of at most this (its memory holds a few at once).
PIECE_BYTES = 8 * 1024 * 1024
PIECE_MIN = 256 * 1024
READ_CONCURRENCY = 4  # parts a reducer reads at once
# The largest batch body in an object: what the largest queue message holds (SQS: 1 MiB);
# a mapper packs its batches to its queue's limit, at most this.
MAX_BODY = 1024 * 1024
# Input above which `--shuffle auto` picks the blob store on a store that bills requests:
# the job's input, as the submitter sees it (a sort shuffles all of it; a combiner shrinks
# it). Below it, one object per map task and one read per part cost more requests than the
# few batches they replace. The embedded store bills nothing: there auto keeps queues.
AUTO_BLOB_BYTES = 64 * 1024 * 1024

SpilledBody = Callable[[int, int, int, bytes], Coroutine[Any, Any, bytes]]


@dataclass(frozen=True)
class Written:
    url: str
    parts: dict[int, tuple[int, int, bytes]]  # partition -> (offset, length, digest)
    size: int


def _bin_framed(n: int) -> int:
    """Bytes msgpack packs n bytes in: bin 8, bin 16 or bin 32's header, then the bytes."""
    return n + (2 if n < 1 << 8 else 3 if n < 1 << 16 else 5)


def _index(spool: str) -> dict[int, list[tuple[int, int, int, bool]]]:
    """Where each partition's batches lie in a map task's spool: partition -> [(seq, start,
    end, spilled?)] in seq order. The spool holds [partition, seq, records, body, spilled?]
    arrays, as cmr.cpu.shuffle writes them; a batch's span is its body packed as msgpack bin
    (just before the one-byte spilled?), the very bytes the object holds for it; a spilled
    entry's span is the whole entry."""
    spans: dict[int, list[tuple[int, int, int, bool]]] = {}
    with open(spool, "rb") as f:
        up = msgpack.Unpacker(f, raw=False, use_list=False, max_buffer_size=2**31 - 1)
        start = 0
        for p, seq, _n, data, spilled in up:
            end = up.tell()
            if spilled:
                spans.setdefault(p, []).append((seq, start, end, True))
            else:
                body_start = end - 1 - _bin_framed(len(data))
                spans.setdefault(p, []).append((seq, body_start, end - 1, False))
            start = end
    return spans


def _entry(f: Any, start: int, end: int) -> tuple[int, int, int, bytes, bool]:
    f.seek(start)
    return msgpack.unpackb(f.read(end - start), raw=False, use_list=False)  # type: ignore[no-any-return]


OBJECT_CHUNK = 8 * 1024 * 1024  # bytes of a shuffle object made at once from the spool


def _object_chunks(
    spool: str,
    spans: dict[int, list[tuple[int, int, int, bool]]],
    pointers: dict[tuple[int, int], bytes],
    parts: dict[int, tuple[int, int, bytes]],
) -> Generator[bytes, None, None]:
    """The object's bytes, partition after partition, about OBJECT_CHUNK at a time, each
    partition's part put in ``parts`` (partition -> offset, length, digest) once made."""
    offset = 0
    pack = msgpack.Packer(use_bin_type=True).pack
    out: list[bytes] = []
    held = 0
    with open(spool, "rb") as src:
        for p in sorted(spans):
            digest = digests.new()
            length = 0
            for seq, start, end, spilled in spans[p]:
                if spilled:
                    framed = pack(pointers[(p, seq)])
                else:  # the body, framed as packed, copied as it lies
                    src.seek(start)
                    framed = src.read(end - start)
                digest.update(framed)
                length += len(framed)
                out.append(framed)
                held += len(framed)
                if held >= OBJECT_CHUNK:
                    yield b"".join(out)
                    out.clear()
                    held = 0
            parts[p] = (offset, length, digest.digest()[:PART_DIGEST])
            offset += length
    if out:
        yield b"".join(out)


def _write(
    spool: str,
    spans: dict[int, list[tuple[int, int, int, bool]]],
    pointers: dict[tuple[int, int], bytes],
    path: str,
) -> dict[int, tuple[int, int, bytes]]:
    """The object's file, and each partition's part."""
    parts: dict[int, tuple[int, int, bytes]] = {}
    with open(path, "wb") as out:
        for chunk in _object_chunks(spool, spans, pointers, parts):
            out.write(chunk)
    return parts


async def write_object(
    rt: Runtime,
    spec: JobSpec,
    task: int,
    attempt: str,
    spool: str,
    spilled_body: SpilledBody,
) -> Written:
    """Store a map attempt's spool as its shuffle object; the parts its commit names. A
    spilled value is uploaded first (``spilled_body``) and its pointer batch stored."""
    spans = await asyncio.to_thread(_index, spool)
    pointers: dict[tuple[int, int], bytes] = {}
    with open(spool, "rb") as f:
        for p, entries in spans.items():
            for seq, start, end, spilled in entries:
                if spilled:  # a value of its own (rare, and big): uploaded, then pointed at
                    _p, _seq, n, data, _ = await asyncio.to_thread(_entry, f, start, end)
                    pointers[(p, seq)] = await spilled_body(p, seq, n, data)
    url = shuffle_url(spec.scratch, spec.job_id, task, attempt)
    if not rt.backend.capabilities.local_files:
        # Made from the spool as it is sent: no file of the object on this disk, which at
        # a fleet's scale is what bounds a sort (benchmarks/cloudsort.py).
        parts: dict[int, tuple[int, int, bytes]] = {}
        made = _object_chunks(spool, spans, pointers, parts)

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await asyncio.to_thread(next, made, b""):
                yield chunk

        try:
            size = await rt.backend.blobs.upload_stream(
                url, chunks(), size_hint=os.path.getsize(spool)
            )
        finally:
            # Its spool file closed, when the upload stopped early (unless a thread still
            # runs it: then it closes as it is collected).
            with contextlib.suppress(ValueError):
                made.close()
        return Written(url, parts, size)
    # A store of local files links the finished file instead of copying it.
    path = spool + ".object"
    try:
        parts = await asyncio.to_thread(_write, spool, spans, pointers, path)
        size = os.path.getsize(path)
        await rt.backend.blobs.upload_file(path, url, frozen=True)
    finally:
        with contextlib.suppress(FileNotFoundError):  # a store on this disk may keep it
            os.unlink(path)
    return Written(url, parts, size)


# A reducer of a job of more partitions than this polls the table less often, in
# proportion (cmr.reducer._drain).
POLL_PARTITIONS = PAGE_PARTITIONS


BLOB_POLL_MAX_S = 1.0  # the longest a reducer of a small job waits between table polls


def poll_intervals(partitions: int) -> tuple[float, float]:
    """How often a reducer of the blob shuffle asks the table for commits: (while they
    arrive, at most while none does), seconds. Each poll reads every commit past the
    reducer's first unknown task, all under the job's one partition key, which DynamoDB
    serves at most 3,000 read units a second: 1,280 reducers polling every 0.25 to 5 s
    would read ~5,900 (benchmarks/cloudsort.py). Past POLL_PARTITIONS reducers, they poll
    in proportion less often, the job's polls a second staying about the same: 1,280
    reducers every 20 to 40 s."""
    scale = partitions / POLL_PARTITIONS
    if scale <= 1:
        return 0.25, BLOB_POLL_MAX_S
    return scale, 2 * scale


PAGE_READS = 16  # pages a reducer reads at once


async def unpaged(
    rt: Runtime, spec: JobSpec, partition: int, commits: list[tuple[int, MapCommit]]
) -> list[tuple[int, MapCommit]]:
    """Each (task, commit) as a reducer of ``partition`` needs it: a paged commit with its
    page's part for the partition read in (MapPage.commit_for); others as they are. A page
    is written before its commit, so a commit whose page is missing, or malformed, or
    whose page count is not this job's, was not written by a mapper of it: WireError,
    as a malformed commit is."""
    gate = asyncio.Semaphore(PAGE_READS)
    page = partition // PAGE_PARTITIONS

    async def one(task: int, commit: MapCommit) -> tuple[int, MapCommit]:
        if not commit.pages:
            return task, commit
        if commit.pages != pages_for(spec.partitions):
            raise WireError(
                f"map task {task}'s commit names {commit.pages} pages, where this job's "
                f"{spec.partitions} partitions take {pages_for(spec.partitions)}"
            )
        pk, sk = job_pk(spec.job_id), page_sk(task, commit.attempt, page)
        async with gate:
            # A page is written once, before its commit: an eventually consistent read (half
            # the price) that finds none may only be stale, and a strong one then tells.
            item = await rt.backend.table.get(pk, sk, consistent=False)
            if item is None:
                item = await rt.backend.table.get(pk, sk, consistent=True)
        if item is None:
            raise WireError(f"map task {task}'s commit has no page {page}")
        return task, MapPage.from_item(item, page, spec.partitions).commit_for(commit, partition)

    return list(await asyncio.gather(*(one(t, c) for t, c in commits)))


async def write_pages(
    rt: Runtime, spec: JobSpec, task: int, attempt: str, written: Written, result: MapResult
) -> None:
    """The attempt's pages, every one of them (an empty page too: a reducer tells a page
    with no part for it from one never written), only while the job runs (ConditionFailed
    once it has ended: nothing of a late attempt outlives the job's cleanup)."""
    batches = {p: b for p, b in enumerate(result.batches) if b}
    records = {p: r for p, r in enumerate(result.records) if r}
    pk = job_pk(spec.job_id)
    puts = [
        Put(pk, page_sk(task, attempt, g), MapPage.of(g, written.parts, batches, records).to_item())
        for g in range(pages_for(spec.partitions))
    ]
    await write_all_while_running(rt.backend, spec.job_id, puts)


async def read_part(
    rt: Runtime,
    spec: JobSpec,
    partition: int,
    task: int,
    commit: MapCommit,
    out_path: str,
    spilled_pairs: Callable[[wire.Batch], Coroutine[Any, Any, bytes]],
) -> int:
    """Append partition ``partition``'s pairs of map task ``task``'s winning attempt to
    ``out_path``: its part of the attempt's object, read in pieces, every batch checked
    against the commit (tag, seq, count) and the part against its digest. Returns the bytes
    of pairs appended. TaskError when the object is gone or is not what the commit says (no
    other copy exists: the reduce task fails, with the reason)."""
    url = shuffle_url(spec.scratch, spec.job_id, task, commit.attempt)
    offset, length, digest = commit.parts[partition]
    count = commit.batches.get(partition, 0)
    piece = max(PIECE_MIN, min(PIECE_BYTES, rt.settings.memory_mb * 1024 * 1024 // 16))
    where = f"map task {task}'s shuffle object ({url[:200]})"
    hashed = digests.new()
    up = wire.unpacker(piece + MAX_BODY + 8, max_bin=MAX_BODY)
    seq = spooled = fed = ended = 0  # ended: where the last whole batch ended
    wrong = ""  # the first thing found wrong: said once the digest is known
    with open(out_path, "ab") as out:
        for at in range(offset, offset + length, piece):
            want = min(piece, offset + length - at)
            try:
                data = await rt.backend.blobs.get_range(url, at, at + want)
            except BlobMissing:
                raise TaskError(
                    f"{where} is gone, though its commit names it: the job ended, or the "
                    "bucket was written by someone else"
                ) from None
            if len(data) != want:
                raise TaskError(f"{where} is shorter than its commit record says")
            await asyncio.to_thread(hashed.update, data)
            if wrong:
                continue  # read on only to tell a spoiled object from a forged commit
            # Only what decoding raises says the part is wrong: a store's or the disk's
            # errors on the way (a throttled spill read, a full disk) pass on as they are,
            # to be retried or reported as themselves.
            up.feed(data)
            fed += len(data)
            while True:
                try:
                    body = next(up)
                    ended = up.tell()
                except StopIteration:
                    break
                except Exception as exc:  # msgpack's zoo: whatever a spoiled object provokes
                    wrong = wire.bounded(f"it is not batches: {type(exc).__name__}: {exc}")
                    break
                try:
                    pairs = await _pairs(body, spec, task, commit.attempt, partition, seq)
                except _Wrong as exc:
                    wrong = str(exc)
                    break
                if isinstance(pairs, wire.Batch):
                    pairs = await spilled_pairs(pairs)  # its TaskError says what is wrong
                out.write(pairs)
                spooled += len(pairs)
                seq += 1
    if hashed.digest()[:PART_DIGEST] != digest:
        raise TaskError(
            f"{where}: part {partition} is not what its attempt wrote (its digest differs: "
            "the bucket, or the commit record, was written by someone else, or the map task "
            f"ran on an older cmr, whose digests were sha256: {digests.MIXED_VERSIONS})"
        )
    if not wrong and ended != fed:
        wrong = f"part {partition} ends inside a batch ({fed - ended} bytes left over)"
    if not wrong and seq != count:
        wrong = f"part {partition} holds {seq} batches, its commit {count}"
    if wrong:
        # The bytes are the attempt's, so its commit record is not: a table writer's.
        raise TaskError(f"{where}: {wrong} (the commit record was written by someone else)")
    return spooled


class _Wrong(Exception):
    """A part's content is not what its commit says."""


async def _pairs(
    body: Any, spec: JobSpec, task: int, attempt: str, partition: int, seq: int
) -> bytes | wire.Batch:
    """A batch's pairs, or the batch itself when its pairs were spilled to a blob."""
    if not isinstance(body, bytes):
        raise _Wrong("it holds something other than a batch")
    try:
        batch = await wire.decode_async(body)
    except WireError as exc:
        raise _Wrong(wire.bounded(f"batch {seq} is not one: {exc}")) from None
    if not isinstance(batch, wire.Batch) or (
        batch.job,
        batch.task,
        batch.attempt,
        batch.partition,
        batch.seq,
    ) != (spec.job_id, task, attempt, partition, seq):
        raise _Wrong(f"batch {seq} of part {partition} is not the attempt's")
    return batch if batch.spilled else batch.pairs
