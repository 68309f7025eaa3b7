"""A large map task of fixed records on a remote store streams its ranges into the pool
process through FIFOs (cmr.rangefile), never through a copy on the local disk: the sort is
the same as one read whole; no regular file ever holds the split in the worker's spool. A
store failing mid-stream fails the task with the store's reason; a pool process that stops
early stops the stream, and a worker cancelled frees its pool process; a stream slower
than the task's limit is told as a slow read. None hangs, and nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cmr import rangefile, submit
from cmr.api import job_ref
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan, inject
from cmr.cpu.mapping import FileSlice
from cmr.pool import cpu_pool
from cmr.records import JobSpec
from cmr.runtime import Runtime
from cmr.settings import AwsSettings, WorkerSettings
from cmr.submit import JobOptions
from cmr.worker import Worker

RECORD = 100


def _rows(rnd: random.Random, n: int, first: int = 0) -> list[bytes]:
    """TeraGen-like records: a random 10-byte key, then the record's number."""
    return [rnd.randbytes(10) + b"%088d\r\n" % i for i in range(first, first + n)]


async def _upload(be: Backend, tmp_path: Path, under: str, files: dict[str, bytes]) -> None:
    # In the bucket: a local input is read by in-process workers as the file it is.
    for name, data in files.items():
        local = tmp_path / name
        local.write_bytes(data)
        await be.blobs.upload_file(str(local), under + name)


class SpoolWatch:
    """What appears in a worker's spool while it runs, looked at every few milliseconds:
    a streamed split's FIFOs, and any regular file that begins with one of ``heads`` (a
    range's first record: a copy of the range, which a streamed split must never make)."""

    def __init__(self, spools: Path, heads: set[bytes]) -> None:
        self.spools, self.heads = spools, heads
        self.fifos: set[str] = set()
        self.copies: set[str] = set()
        self.largest = 0  # the largest such copy seen, in bytes
        self.streaming = asyncio.Event()  # a FIFO was seen

    def look(self) -> None:
        for top, _, names in os.walk(self.spools):
            for name in names:
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                    # A split's FIFOs (a reducer streams its output through one of its own).
                    if stat.S_ISFIFO(st.st_mode) and name.endswith(".range"):
                        self.fifos.add(path)
                        self.streaming.set()
                    elif stat.S_ISREG(st.st_mode) and st.st_size >= RECORD:
                        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                        try:
                            head = os.read(fd, RECORD)
                        finally:
                            os.close(fd)
                        if head in self.heads:
                            self.copies.add(path)
                            self.largest = max(self.largest, st.st_size)
                except OSError:
                    continue  # gone meanwhile

    def left(self) -> list[str]:
        """Anything of a streamed split still in the spool: a FIFO, a copy, or the
        directory the FIFOs were made in."""
        self.look()
        found = [p for p in self.fifos | self.copies if os.path.lexists(p)]
        found += [str(p) for p in self.spools.rglob("split-*")]
        return sorted(found)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                self.look()
                await asyncio.sleep(0.002)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _work(
    be: Backend,
    settings: AwsSettings,
    spec: JobSpec,
    spools: Path,
    look: Callable[[Runtime, str, dict[str, Any]], Awaitable[None]],
    within_s: float,
    jobs_from: tuple[str, ...] = (),
) -> None:
    """One worker on this backend (its requests are counted), with a pool of one process,
    serving the job until it ends; a hang fails the test."""
    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(spools), jobs_from=jobs_from)
    with cpu_pool(1) as pool:
        worker = Worker(
            be, ws, pool, queue_prefix=settings.queue_prefix, only_job=spec.job_id, hook=look
        )
        await asyncio.wait_for(worker.run(), within_s)


@pytest.mark.usefixtures("aws_stack")
async def test_a_large_fixed_record_split_streams_into_the_pool_and_never_to_disk(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map task of fixed records larger than rangefile.STREAM_FROM reads its ranges in
    ranged GETs and streams them into the pool process, which maps them a piece at a time
    (what makes map tasks of gigabytes possible, and the blob shuffle's GETs few:
    benchmarks/cloudsort.py): the sort is the same as one read whole, in pieces smaller
    than a pipe's buffer and larger; the ranges pass through FIFOs, no regular file in the
    spool ever holds one (a copy on the local disk, as before: fails here), and nothing is
    left once the tasks end. The task's size decides, not a range's: a task of two files,
    each under STREAM_FROM, streams."""
    be, settings = aws
    rnd = random.Random(7)
    # Four files of 1.2 MB, each under STREAM_FROM below; two to a task of 2.4 MB, over it.
    files = {f"part-m-{f:05d}": b"".join(_rows(rnd, 12_000, f * 12_000)) for f in range(4)}
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    await _upload(be, tmp_path, root + "in/", files)
    heads = {data[:RECORD] for data in files.values()}
    records = sorted(
        data[i : i + RECORD] for data in files.values() for i in range(0, len(data), RECORD)
    )
    spools = tmp_path / "spools"
    spools.mkdir()
    gets = {}
    assert rangefile.PIPE_BYTES == 1024 * 1024
    runs = (
        ("whole", 1 << 40, 64 * 1024),
        ("small pieces", 1_000_000, 64 * 1024),  # under a pipe's buffer
        ("large pieces", 1_000_000, 1_100_000),  # over it: a piece waits for room
    )
    for label, stream_from, piece in runs:
        monkeypatch.setattr(rangefile, "STREAM_FROM", stream_from)
        monkeypatch.setattr(rangefile, "PIECE_BYTES", piece)
        spec = await submit.submit(
            be,
            job_ref("examples/terasort.py"),
            root + "in/",
            root + label.replace(" ", "-") + "/",
            JobOptions(partitions=3, shuffle="blob"),
            queue_prefix=settings.queue_prefix,
            parallelism=1,
            split_bytes=2_400_000,
        )
        assert spec.maps == 2
        before = be.calls()["s3.GetObject"]
        watch = SpoolWatch(spools, heads)
        left: list[str] = []

        async def look(
            rt: Runtime,
            step: str,
            context: dict[str, Any],
            left: list[str] = left,
            watch: SpoolWatch = watch,
        ) -> None:
            # While the worker lives (it deletes its whole spool when it stops).
            if step == "cleanup.done":
                left.extend(watch.left())

        async with watch.watching():
            await _work(be, settings, spec, spools, look, 120)
        assert not watch.copies, (label, watch.copies, watch.largest)
        if label == "whole":
            assert not watch.fifos, watch.fifos
        else:
            assert watch.fifos, label  # the split did stream
        assert left == [], (label, left)
        gets[label] = be.calls()["s3.GetObject"] - before
        parts = sorted(
            b.url for b in await be.blobs.list(root + label.replace(" ", "-") + "/part-")
        )
        assert len(parts) == 3
        data = b"".join([await be.blobs.get(u) for u in parts])
        assert data == b"".join(records), label
    # Each 1.2 MB file read in pieces where one GET was made, and each, read from byte 0,
    # has its head read first, to tell it is not compressed: 19 pieces of 64 KiB; 2 of
    # 1.1 MB.
    assert gets["small pieces"] - gets["whole"] == 4 * (19 - 1) + 4, gets
    assert gets["large pieces"] - gets["whole"] == 4 * (2 - 1) + 4, gets


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.parametrize("how", ["deleted", "truncated"])
async def test_the_store_failing_mid_stream_fails_the_task_with_its_reason(
    aws: tuple[Backend, AwsSettings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """A streamed task of two files, one deleted while the other streams (its GETs fail
    once the pump comes to it), or cut short since submit (its GETs fail part-way, after
    the pool process has taken what came before): the pipes are closed, the pool process
    reads a short range and stops, and the task fails with the store's reason (the input
    is gone: the job fails, naming it), not the pool's "cut short"; no hang, and no FIFO or
    directory is left."""
    be, settings = aws
    rnd = random.Random(8)
    files = {"part-a": b"".join(_rows(rnd, 8000)), "part-b": b"".join(_rows(rnd, 3000))}
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    await _upload(be, tmp_path, root + "in/", files)
    monkeypatch.setattr(rangefile, "STREAM_FROM", 100_000)
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 16 * 1024)  # part-a: 49 GETs
    monkeypatch.setattr(rangefile, "IN_FLIGHT", 2)
    spec = await submit.submit(
        be,
        job_ref("examples/terasort.py"),
        root + "in/",
        root + "out/",
        JobOptions(partitions=2, shuffle="blob"),
        queue_prefix=settings.queue_prefix,
        parallelism=1,
        split_bytes=2_000_000,
    )
    assert spec.maps == 1
    spools = tmp_path / "spools"
    spools.mkdir()
    watch = SpoolWatch(spools, {data[:RECORD] for data in files.values()})
    gone = "part-a" if how == "truncated" else "part-b"
    if how == "truncated":  # streamed first: 300 KB of its 800 KB reach the pool process
        await be.blobs.put(root + "in/part-a", files["part-a"][:300_000])

    async def delete_once_streaming() -> None:
        # Its head was read (it is not compressed) before its FIFO was made; part-a's 49
        # GETs come before its first.
        await watch.streaming.wait()
        await be.blobs.delete([root + "in/part-b"])

    left: list[str] = []

    async def look(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "cleanup.done":  # the worker still lives: its spool is there to see
            await asyncio.sleep(0.5)  # time for anything going on regardless to land
            left.extend(watch.left())

    async with watch.watching():
        deleting = asyncio.create_task(delete_once_streaming()) if how == "deleted" else None
        await _work(be, settings, spec, spools, look, 60)
        if deleting is not None:
            assert deleting.done()
            await deleting
    assert watch.fifos and not watch.copies
    assert left == [], left
    record = await be.table.get(f"job#{spec.job_id}", "job")
    assert record is not None and record["state"] == "failed"
    error = record["error"]
    # Permanent, at its first failure: no other worker would find the input either.
    assert error.startswith("map task 0 failed, and would fail again:"), error
    assert f"input {gone} (" in error and "no longer exists" in error, error
    assert "cut short" not in error and "this worker's stream" not in error, error
    # At once: not the pool's short read first, retried, and the input found gone when
    # a retry read its head.
    assert not record.get("tasks_retried"), record


FAILS_EARLY = """
import cmr


class RefusesARecord(cmr.Job):
    input_format = "fixed:100:10"
    output_format = "raw"

    def map(self, key, value):
        raise ValueError("this job refuses record " + value[-10:-2].decode())

    def reduce(self, key, values):
        yield from ()
"""


@pytest.mark.usefixtures("aws_stack")
async def test_a_pool_process_that_stops_early_stops_the_stream(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's map raises at the first record, while the stream still has megabytes to
    send (its next range's pipe full, its writer waiting for room a reader that stopped
    will never make): the writer is stopped once the pool's call ends, the task fails with
    the map's error (the job fails: one failure allowed), no hang, and nothing is left."""
    be, settings = aws
    rnd = random.Random(9)
    # The small file first: the map reads it whole and fails; the large one never read.
    files = {"part-a": b"".join(_rows(rnd, 100)), "part-b": b"".join(_rows(rnd, 30_000))}
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    await _upload(be, tmp_path, root + "in/", files)
    job = tmp_path / "refuses.py"
    job.write_text(FAILS_EARLY)
    monkeypatch.setattr(rangefile, "STREAM_FROM", 100_000)
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 256 * 1024)
    spec = await submit.submit(
        be,
        job_ref(str(job)),
        root + "in/",
        root + "out/",
        JobOptions(partitions=2, shuffle="blob", max_task_failures=1),
        queue_prefix=settings.queue_prefix,
        parallelism=1,
        split_bytes=4_000_000,
    )
    assert spec.maps == 1
    spools = tmp_path / "spools"
    spools.mkdir()
    watch = SpoolWatch(spools, {data[:RECORD] for data in files.values()})
    left: list[str] = []

    async def look(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "cleanup.done":
            left.extend(watch.left())

    async with watch.watching():
        await _work(be, settings, spec, spools, look, 60, jobs_from=(str(tmp_path),))
    assert watch.fifos and not watch.copies
    assert left == [], left
    record = await be.table.get(f"job#{spec.job_id}", "job")
    assert record is not None and record["state"] == "failed"
    error = record["error"]
    assert "ValueError: this job refuses record 00000000" in error, error
    assert "cut short" not in error and "no longer exists" not in error, error


@pytest.mark.usefixtures("aws_stack")
async def test_a_stream_slower_than_the_task_limit_is_reported_as_a_slow_read(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is slow (each of the worker's requests delayed, by a fault plan) and the
    task's limit short: the pool process runs out of time waiting for its input, and the
    task says that reading its input ran past the limit (a slow store), not that the job's
    code did not return; the stream is stopped, and nothing is left."""
    be, settings = aws
    rnd = random.Random(12)
    files = {"part-a": b"".join(_rows(rnd, 8000)), "part-b": b"".join(_rows(rnd, 100))}
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    await _upload(be, tmp_path, root + "in/", files)
    monkeypatch.setattr(rangefile, "STREAM_FROM", 100_000)
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 16 * 1024)  # 49 GETs, one at a time:
    monkeypatch.setattr(rangefile, "IN_FLIGHT", 1)  # ~5 s at 0.1 s each
    spec = await submit.submit(
        be,
        job_ref("examples/terasort.py"),
        root + "in/",
        root + "out/",
        JobOptions(partitions=2, shuffle="blob", max_task_failures=1, task_timeout_s=2),
        queue_prefix=settings.queue_prefix,
        parallelism=1,
        split_bytes=2_000_000,
    )
    assert spec.maps == 1
    spools = tmp_path / "spools"
    spools.mkdir()
    watch = SpoolWatch(spools, {data[:RECORD] for data in files.values()})
    left: list[str] = []

    async def look(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "cleanup.done":
            left.extend(watch.left())

    async with watch.watching(), inject(be, FaultPlan(seed=3, delay_max_s=0.2)) as slow:
        await _work(slow, settings, spec, spools, look, 90)
    assert watch.fifos and not watch.copies
    assert left == [], left
    record = await be.table.get(f"job#{spec.job_id}", "job")
    assert record is not None and record["state"] == "failed"
    error = record["error"]
    assert (
        "TimeLimitExceeded: reading the input of map task 0 ran past its time limit of 2 s "
        "(a slow store" in error
    ), error


@pytest.mark.usefixtures("aws_stack")
async def test_a_worker_cancelled_mid_stream_leaves_its_pool_process_free(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker cancelled while its pool process reads a stream (Ctrl-C, a stopped
    service): the worker ends at once, and the pool process is not left waiting for bytes
    that will never come (its pipes were closed: it reads a short range and is free for
    the next task). Another worker then sorts the job exactly, once the lease lapses."""
    be, settings = aws
    rnd = random.Random(13)
    files = {"part-a": b"".join(_rows(rnd, 8000)), "part-b": b"".join(_rows(rnd, 3000))}
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    await _upload(be, tmp_path, root + "in/", files)
    monkeypatch.setattr(rangefile, "STREAM_FROM", 100_000)
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 4 * 1024)  # 270 GETs, one at a time:
    monkeypatch.setattr(rangefile, "IN_FLIGHT", 1)  # a second or more
    spec = await submit.submit(
        be,
        job_ref("examples/terasort.py"),
        root + "in/",
        root + "out/",
        JobOptions(partitions=2, shuffle="blob", visibility_s=2),
        queue_prefix=settings.queue_prefix,
        parallelism=1,
        split_bytes=2_000_000,
    )
    assert spec.maps == 1
    spools = tmp_path / "spools"
    spools.mkdir()
    watch = SpoolWatch(spools, {data[:RECORD] for data in files.values()})
    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(spools))
    with cpu_pool(1) as pool:
        # What the pool process loads for its first sort, loaded: it reads the stream soon.
        await asyncio.wrap_future(pool.submit(exec, "import cmr.cpu.fixedsort"))
        worker = Worker(be, ws, pool, queue_prefix=settings.queue_prefix, only_job=spec.job_id)
        async with watch.watching():
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(watch.streaming.wait(), 30)
            await asyncio.sleep(0.5)  # the pool process is reading
            assert not running.done()
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(running, 10)
        # Free: it takes a task of ours at once.
        try:
            await asyncio.wait_for(asyncio.wrap_future(pool.submit(os.getpid)), 10)
        except TimeoutError:
            pool.kill()  # or leaving the pool would wait for it forever
            pytest.fail("the pool process still waits for the stream of a cancelled task")

    async def nothing(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        pass

    await _work(be, settings, spec, spools, nothing, 120)
    assert not watch.copies
    record = await be.table.get(f"job#{spec.job_id}", "job")
    assert record is not None and record["state"] == "succeeded", record
    parts = sorted(b.url for b in await be.blobs.list(root + "out/part-"))
    data = b"".join([await be.blobs.get(u) for u in parts])
    rows = [d[i : i + RECORD] for d in files.values() for i in range(0, len(d), RECORD)]
    assert data == b"".join(sorted(rows))


def _read(piece: FileSlice, size: int) -> bytes:
    """A slice read as the pool process reads it (FileSlice.pieces), whole."""
    return b"".join(piece.pieces(piece.name, size))


async def test_a_stream_carries_each_range_exactly_in_pieces_of_any_size(
    embedded: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges of two objects, added out of order, each read from its FIFO by a reader in a
    thread as the pool process reads a slice: each exact, in pieces smaller than a pipe's
    buffer (and not a multiple of the reader's) and larger; nothing left once closed."""
    rnd = random.Random(10)
    big = rnd.randbytes(5 * 1024 * 1024 + 123)
    small = rnd.randbytes(10_240)
    urls = [(tmp_path / "big").as_uri(), (tmp_path / "small").as_uri()]
    await embedded.blobs.put(urls[0], big)
    await embedded.blobs.put(urls[1], small)
    spool = tmp_path / "spool"
    spool.mkdir()
    for piece in (1000, 3 * 1024 * 1024):
        monkeypatch.setattr(rangefile, "PIECE_BYTES", piece)
        ranges = [(urls[0], 7, len(big) - 5), (urls[1], 123, 9_876), (urls[0], 0, 1)]
        with rangefile.Stream(embedded.blobs, str(spool)) as stream:
            slices = {}
            for key in (2, 0, 1):
                url, start, end = ranges[key]
                path = stream.add(key, url, start, end)
                slices[key] = FileSlice(path, 0, end - start, f"range {key}", stream=True)
            pump = stream.start()
            got = [await asyncio.to_thread(_read, slices[k], 64 * 1024 + 1) for k in range(3)]
            await asyncio.wait_for(pump, 10)
        assert got == [big[7:-5], small[123:9_876], big[:1]], piece
        assert list(spool.iterdir()) == []


async def test_a_short_object_stops_the_stream_and_the_reader_sees_a_short_read(
    embedded: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object shorter than its range (replaced since the plan was made): the pump fails
    with the byte it stopped at and names the range; the reader, mid-range, is told its
    stream was cut short (this worker's fault, retried), never waits; nothing is left."""
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 1000)
    data = bytes(range(256)) * 40  # 10,240 bytes
    url = (tmp_path / "object").as_uri()
    await embedded.blobs.put(url, data)
    spool = tmp_path / "spool"
    spool.mkdir()
    with rangefile.Stream(embedded.blobs, str(spool)) as stream:
        path = stream.add(0, url, 0, 12_000)
        pump = stream.start()
        reading = asyncio.to_thread(_read, FileSlice(path, 0, 12_000, "object", stream=True), 4096)
        with pytest.raises(OSError, match="stream of input object is cut short"):
            await asyncio.wait_for(reading, 10)
        with pytest.raises(EOFError, match="ends at byte 10,240, before 12,000"):
            await asyncio.wait_for(pump, 10)
        assert stream.failed == 0
    assert list(spool.iterdir()) == []


async def test_a_reader_that_stops_leaves_the_pump_waiting_until_it_is_cancelled(
    embedded: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader takes one piece and stops (a pool process whose map failed): the pump
    waits for room in the pipe without blocking the loop, having fetched no more than the
    pipe holds and IN_FLIGHT pieces besides, until it is cancelled; then every end is
    closed and nothing is left."""
    monkeypatch.setattr(rangefile, "PIECE_BYTES", 256 * 1024)
    data = random.Random(11).randbytes(8 * 1024 * 1024)  # 32 pieces
    url = (tmp_path / "object").as_uri()
    await embedded.blobs.put(url, data)
    spool = tmp_path / "spool"
    spool.mkdir()
    before = embedded.calls()["s3.GetObject"]
    with rangefile.Stream(embedded.blobs, str(spool)) as stream:
        path = stream.add(0, url, 0, len(data))
        pump = stream.start()

        def first_piece() -> bytes:
            piece = FileSlice(path, 0, len(data), "object", stream=True)
            return next(piece.pieces("object", 1000))

        assert await asyncio.to_thread(first_piece) == data[:1000]
        await asyncio.sleep(0.3)  # the loop runs on: the pump waits, it does not block
        assert not pump.done()
        # 1 MiB in the pipe (4 pieces), one being written, IN_FLIGHT - 1 fetched ahead.
        assert embedded.calls()["s3.GetObject"] - before <= 4 + 1 + rangefile.IN_FLIGHT
        pump.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(pump, 10)
    assert list(spool.iterdir()) == []
