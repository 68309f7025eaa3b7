"""What a sort through the blob shuffle writes to a worker's local disk, on the aws backend.

At a fleet's scale the instance store's speed bounds the sort: every byte a worker writes
to its disk and reads back costs time (benchmarks/cloudsort.py, "disk passes"). So the
worker's process tree (its event loop and its pool) is measured by the kernel's own count
of the bytes each process caused to be written to storage (/proc/PID/io ``write_bytes``,
counted as pages are dirtied, even for a file deleted before it reaches the disk).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from cmr import submit
from cmr.api import job_ref, run_on
from cmr.backends.base import Backend
from cmr.backends.middleware import Call, Middleware, Proceed, wrap
from cmr.errors import BackendError, JobFailed
from cmr.pool import cpu_pool
from cmr.records import JobSpec, job_pk
from cmr.settings import AwsSettings, WorkerSettings
from cmr.submit import JobOptions
from cmr.worker import Worker


def _written(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError(f"no write_bytes in /proc/{pid}/io")


def _tree(pool: Any) -> list[int]:
    """This process and the pool's processes (children of a fork server, not of ours)."""
    return ["self", *(p.pid for p in pool._pool._processes.values())]


@pytest.mark.usefixtures("aws_stack")
async def test_a_sort_writes_its_output_and_its_objects_to_the_store_only(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """A reducer's output goes to the store as the pool writes it, and a map task's object
    from its spool as it is sent: neither is a file on the worker's disk first. What the
    worker still writes: each map task's spool (compressed) and each reducer's fetched
    parts. Before (e0f2188) it also wrote each object's file and each reducer's output
    file: 2.5 bytes for each byte sorted here, against 1.3."""
    be, settings = aws
    rnd = random.Random(11)
    # Keys of 10 random bytes; the rest compresses as TeraGen's rows do (~3x).
    records = [rnd.randbytes(10) + b"%088d\r\n" % rnd.randrange(10**9) for i in range(80_000)]
    size = 100 * len(records)  # 8 MB: far above what the worker writes besides
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    for f in range(4):
        local = tmp_path / f"part-m-{f:05d}"
        local.write_bytes(b"".join(records[f * 20_000 : (f + 1) * 20_000]))
        await be.blobs.upload_file(str(local), root + f"in/{local.name}")
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
    spools = tmp_path / "spools"
    spools.mkdir()
    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(spools))
    with cpu_pool(1) as pool:
        before = {pid: _written(pid) for pid in _tree(pool)}
        await asyncio.wait_for(
            Worker(be, ws, pool, queue_prefix=settings.queue_prefix, only_job=spec.job_id).run(),
            120,
        )
        after = {pid: _written(pid) for pid in _tree(pool)}
    assert set(after) == set(before), "the pool restarted: its counts are lost"
    written = sum(after[pid] - before[pid] for pid in after)
    parts = sorted(b.url for b in await be.blobs.list(root + "out/part-"))
    assert b"".join([await be.blobs.get(u) for u in parts]) == b"".join(sorted(records))
    # The spools (~0.3 of the input, compressed) and the fetched parts (1.0).
    assert written < 1.6 * size, f"{written / size:.2f} bytes written per byte sorted"


class _UploadFailsMidway(Middleware):
    """The store failing once in the middle of a reducer's output: after two chunks of the
    stream have gone, as a connection dropped by S3 would."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    async def around(self, call: Call, proceed: Proceed) -> Any:
        if call.method != "upload_stream" or "/out/p" not in call.target or self.failed:
            return await proceed(call)
        self.failed.append(call.target)
        stream = aiter(call.args[1])
        for _ in range(2):
            await anext(stream)
        raise BackendError("s3.UploadPart failed: connection reset (injected)")


async def _sort_one_file(
    aws: tuple[Backend, AwsSettings],
    tmp_path: Path,
    records: list[bytes],
    options: JobOptions,
    split_bytes: int,
    store: Middleware,
    spools: Path,
) -> tuple[JobSpec, str]:
    """TeraSort of ``records`` as one input file in the bucket, by one worker whose store
    is wrapped in ``store``, until the job ends; (its spec, the job's root URL)."""
    be, settings = aws
    root = f"s3://{settings.bucket}/{tmp_path.name}/"
    local = tmp_path / "part-m-00000"
    local.write_bytes(b"".join(records))
    await be.blobs.upload_file(str(local), root + f"in/{local.name}")
    spec = await submit.submit(
        be,
        job_ref("examples/terasort.py"),
        root + "in/",
        root + "out/",
        options,
        queue_prefix=settings.queue_prefix,
        parallelism=1,
        split_bytes=split_bytes,
    )
    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(spools))
    with cpu_pool(1) as pool:
        await asyncio.wait_for(
            Worker(
                wrap(be, store), ws, pool, queue_prefix=settings.queue_prefix,
                only_job=spec.job_id,
            ).run(),
            120,
        )  # fmt: skip
    return spec, root


@pytest.mark.usefixtures("aws_stack")
async def test_an_output_upload_that_fails_midway_stops_the_reduce_and_is_retried(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """The pool process writing the output is stopped (its pipe closed under it), nothing
    of the failed upload is stored or left unfinished, and the task's next attempt writes
    the whole output: the job ends exact."""
    be, settings = aws
    rnd = random.Random(5)
    records = [rnd.randbytes(10) + b"%088d\r\n" % i for i in range(60_000)]
    failing = _UploadFailsMidway()
    spools = tmp_path / "spools"
    spools.mkdir()
    options = JobOptions(partitions=1, shuffle="blob", visibility_s=5)
    _, root = await _sort_one_file(aws, tmp_path, records, options, 2_000_000, failing, spools)
    assert len(failing.failed) == 1
    (part,) = [b.url for b in await be.blobs.list(root + "out/part-")]
    assert await be.blobs.get(part) == b"".join(sorted(records))
    s3 = be.blobs._s3 if hasattr(be.blobs, "_s3") else be.blobs.inner._s3  # type: ignore[attr-defined]
    assert (await s3.list_multipart_uploads(Bucket=settings.bucket)).get("Uploads", []) == []
    assert [p.name for p in spools.rglob("*")] == []


@pytest.mark.usefixtures("aws_stack")
async def test_a_reduce_that_fails_after_writing_stores_nothing(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """Its output was streaming to the store (past one part: a multipart upload) when
    reduce raised: the job fails with the reduce's own reason, and no upload is left
    unfinished in the bucket."""
    be, settings = aws
    job = tmp_path / "j.py"
    job.write_text(
        "import cmr\n"
        "class J(cmr.Job):\n"
        "    def map(self, k, line):\n        yield line, 1\n"
        "    def reduce(self, k, vs):\n"
        "        if k == 'k11999':\n            raise ValueError('boom after writing')\n"
        "        yield k, 'x' * 1000\n"
    )
    src = tmp_path / "in.txt"
    src.write_text("".join(f"k{i:05d}\n" for i in range(12_000)))  # 12 MB of output
    with pytest.raises(JobFailed) as info:
        await run_on(
            be, str(job), str(src), str(tmp_path / "out"), reducers=1, workers=1,
            visibility_timeout=60, aws=settings,
        )  # fmt: skip
    assert "boom after writing" in info.value.reason
    s3 = be.blobs._s3 if hasattr(be.blobs, "_s3") else be.blobs.inner._s3  # type: ignore[attr-defined]
    assert (await s3.list_multipart_uploads(Bucket=settings.bucket)).get("Uploads", []) == []


class _SlowUpload(Middleware):
    """A store that takes a reducer's output at ``s_per_mib`` a MiB, as a congested link
    would: the pool process writing it waits on the pipe."""

    def __init__(self, s_per_mib: float) -> None:
        self.s_per_mib = s_per_mib
        self.uploads: list[str] = []

    async def around(self, call: Call, proceed: Proceed) -> Any:
        if call.method != "upload_stream" or "/out/p" not in call.target:
            return await proceed(call)
        self.uploads.append(call.target)
        return await proceed(call.replace(call.args[0], self._slowly(call.args[1])))

    async def _slowly(self, chunks: Any) -> Any:
        async for chunk in chunks:
            await asyncio.sleep(self.s_per_mib * len(chunk) / (1 << 20))
            yield chunk


@pytest.mark.usefixtures("aws_stack")
async def test_a_slow_store_is_not_counted_against_the_reduces_time_limit(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """The reduce's output streams to the store as the pool writes it: while the store is
    slow the pool's writes wait, and that wait is not the job's code's time. Here the
    upload takes ~21 s against a 2 s task limit, and the pool waits past its hard limit
    (12.2 s) with its last MiB unread: the one attempt finishes, exact. Before, the pool's
    limit struck while it waited on the pipe, blamed the job's code, and every attempt
    failed the same way."""
    be, _ = aws
    rnd = random.Random(7)
    records = [rnd.randbytes(10) + b"%088d\r\n" % i for i in range(100_000)]  # 9.5 MiB
    slow = _SlowUpload(2.2)
    options = JobOptions(partitions=1, shuffle="blob", task_timeout_s=2, max_task_failures=1)
    spec, root = await _sort_one_file(aws, tmp_path, records, options, 16_000_000, slow, tmp_path)
    job = await be.table.get(job_pk(spec.job_id), "job")
    assert job is not None and job["state"] == "succeeded", job
    assert len(slow.uploads) == 1, slow.uploads
    (part,) = [b.url for b in await be.blobs.list(root + "out/part-")]
    assert await be.blobs.get(part) == b"".join(sorted(records))
