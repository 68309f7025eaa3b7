"""Every read of a job's data is bounded by what was submitted (issue 26, items 3-5).

* A line longer than a map task's record bound fails the task at once, naming the input and
  the byte the line starts at, having read little more than the bound (a real ``cmr run``
  process, its peak RSS measured); splits read whole lines exactly once however the ranges
  fall and however long the lines.
* A side file replaced after submit by a much larger object is fetched in ranged reads of
  at most its submitted size (+1 byte that tells it is larger): the worker's spool never
  holds more than that, and the job fails naming the file (a real worker on the local stack).
* A local input swapped for a link to a file outside the input after submit is never read:
  the job fails naming the input, for file slices (fixed records, read by the pool process)
  and for the worker's own reads (lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path

import boto3
import pytest

from cmr import api
from cmr.api import open_backend
from cmr.backends.base import Backend
from cmr.backends.embedded import EmbeddedBlobs
from cmr.backends.faults import FaultPlan
from cmr.cpu.mapping import FileSlice, slice_bytes
from cmr.cpu.results import InputGone
from cmr.fileurls import file_url
from cmr.formats import InputError
from cmr.localcheck import identity
from cmr.records import JobSpec, job_pk
from cmr.settings import AwsSettings
from cmr.split import LOOKAHEAD, read_split
from cmr.testing import chaos_run
from cmr.virtualtime import in_virtual_time
from cmr.wire import Range
from tests.procs import Peaks
from tests.stack import remove_test_resources

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
DEADLINE_S = 120.0  # a process that has not ended by then did not end on its own


# ------------------------------------------------------------------ lines, read whole once


async def test_splits_read_every_line_once_however_long(tmp_path: Path) -> None:
    """Lines short and long (many lookahead rounds), ranges cut anywhere: the splits' bytes,
    in order, are the file; each begins at a line's start."""
    rng = random.Random(26)
    lines = [
        b"x" * rng.choice([0, 1, 5, 80, LOOKAHEAD - 1, LOOKAHEAD, 3 * LOOKAHEAD + 7, 700_000])
        for _ in range(60)
    ]
    for tail in (b"\n", b""):  # the last line with and without its newline
        data = b"\n".join(lines) + tail
        path = tmp_path / f"in{len(tail)}.txt"
        path.write_bytes(data)
        blobs = EmbeddedBlobs()
        for _ in range(5):
            cuts = sorted({0, len(data), *(rng.randrange(len(data)) for _ in range(12))})
            got = [
                await read_split(blobs, Range(file_url(path), a, b, "in"))
                for a, b in itertools.pairwise(cuts)
            ]
            assert b"".join(got) == data
            at = 0
            for piece in got:
                assert at == 0 or data[at - 1 : at] == b"\n" or not piece
                at += len(piece)


async def test_a_long_line_stops_at_the_bound_naming_its_byte(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    head = b"alpha beta\n" * 1000
    with path.open("wb") as f:
        f.write(head)
        f.truncate(len(head) + 40 * MIB)  # one line of zeros, no newline
    blobs = EmbeddedBlobs()
    r = Range(file_url(path), 0, len(head) + 100, "big.txt")  # its last line: the long one
    with pytest.raises(InputError) as caught:
        await read_split(blobs, r, max_record=MIB)
    assert f"input big.txt: the line at byte {len(head):,} is longer than 1,048,576" in str(
        caught.value
    )
    # A later split, inside the long line, owns no line: it reads its own range only.
    inside = Range(file_url(path), len(head) + 8 * MIB, len(head) + 9 * MIB, "big.txt")
    assert await read_split(blobs, inside, max_record=MIB) == b""


def _run_and_measure(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """Run a process to its end (DEADLINE_S); its exit code, stderr and the largest peak
    RSS (MiB) of it or any process below it (tests.procs: VmHWM, sampled)."""
    err = cwd / "stderr.txt"
    with err.open("wb") as f:
        proc = subprocess.Popen(
            args, cwd=ROOT, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=f,
        )  # fmt: skip
    with Peaks(proc.pid).sampling() as peaks:
        try:
            proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"{args[3]} did not end on its own: {err.read_text()[-2000:]}"
            ) from None
    return proc.returncode, err.read_text(errors="replace"), peaks.most()


def test_a_line_with_no_newline_fails_the_job_at_once_within_memory(tmp_path: Path) -> None:
    """A 256 MiB line (no newline) under --memory-mb 64 (lines up to 32 MiB): the job fails
    naming the file and the byte the line starts at, and no process held the line."""
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.txt").write_bytes(b"alpha beta\n" * 100)
    head = b"gamma delta\n" * 1000
    with (data / "b.txt").open("wb") as f:
        f.write(head)
        f.truncate(len(head) + 256 * MIB)  # sparse: zeros on no disk
    code, err, peak = _run_and_measure(
        [
            sys.executable, "-m", "cmr", "run", "examples/wordcount.py", "-i", str(data),
            "-o", str(tmp_path / "out"), "--memory-mb", "64", "--workers", "1",
            "--max-task-attempts", "1",
        ],
        tmp_path,
    )  # fmt: skip
    print(f"exit {code}, peak RSS {peak:.0f} MiB\n{err[-2000:]}")
    assert code != 0
    assert f"input b.txt: the line at byte {len(head):,} is longer than 33,554,432" in err
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    # An idle cmr run with its worker and pool is ~100-150 MiB; holding the line is 256+.
    assert peak < 230, peak


# ------------------------------------------------------------- side files, ranged reads


async def _create(s: AwsSettings) -> None:
    async with open_backend("aws", s):
        pass  # the bucket, table and queues, made


def _spool_bytes(top: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):  # a part renamed or removed meanwhile
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
def test_a_side_file_grown_after_submit_is_never_fetched_past_its_size(tmp_path: Path) -> None:
    """Submit with --file stop.txt (9 bytes), put 64 MiB at its key, run a worker: its spool
    never holds more than a few MiB (its spills: none here), and the job fails naming the
    file."""
    tag = os.urandom(4).hex()
    s = AwsSettings(bucket=f"cmr-br-{tag}", table=f"cmr-br-{tag}", queue_prefix=f"cmrbr-{tag}-")
    names = ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]
    stop = tmp_path / "stop.txt"
    stop.write_bytes(b"w1 w2 w3\n")
    try:
        asyncio.run(_create(s))
        s3 = boto3.client("s3")
        s3.put_object(Bucket=s.bucket, Key="in/a.txt", Body=b"w1 w4 w5\n" * 50)
        sub = subprocess.run(
            [
                sys.executable, "-m", "cmr", "run", "examples/wordcount.py",
                "--backend", "aws", "-i", f"s3://{s.bucket}/in/",
                "-o", f"s3://{s.bucket}/out/", "--file", str(stop), "--detach",
                "--max-task-attempts", "1", *names,
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.strip().splitlines()[-1]
        listed = s3.list_objects_v2(Bucket=s.bucket)["Contents"]
        (key,) = [o["Key"] for o in listed if o["Key"].endswith("/stop.txt")]
        s3.put_object(Bucket=s.bucket, Key=key, Body=b"\0" * (64 * MIB))

        spool = tmp_path / "spool"
        spool.mkdir()
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _spool_bytes(spool))
                done.wait(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code, err, _ = _run_and_measure(
                [
                    sys.executable, "-m", "cmr", "worker", "--backend", "aws",
                    "--job", job_id, "--idle-exit", "30", "--jobs-from", str(ROOT),
                    *names,
                ],
                tmp_path,
                env={"TMPDIR": str(spool)},  # its spool: a directory of its own under it
            )  # fmt: skip
        finally:
            done.set()
            sampler.join()
        table = boto3.resource("dynamodb").Table(s.table)
        item = {"pk": job_pk(job_id), "sk": "job"}
        record = table.get_item(Key=item, ConsistentRead=True)["Item"]
        print(f"worker exit {code}, spool peak {peak[0]:,} bytes\n{err[-2000:]}")
        assert record.get("state") == "failed", (record.get("state"), err[-2000:])
        error = str(record.get("error", ""))
        assert "side file stop.txt" in error and "changed after submit" in error, error
        assert len(error.splitlines()[0]) < 1000
        assert peak[0] < 8 * MIB, peak[0]  # not the 64 MiB object
    finally:
        remove_test_resources(s.bucket, s.table, s.queue_prefix)


# -------------------------------------------------- local inputs, as they were at submit

ECHO = """
import cmr


class Echo(cmr.Job):
    def map(self, key, value):
        yield value, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""
SECRET = b"SECRET-42\n"  # one 10-byte record, or line


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with api.cpu_pool(2) as p:
        yield p


@pytest.mark.parametrize("fmt", ["fixed:10:2", "lines"])
@in_virtual_time
async def test_a_link_swapped_into_the_input_after_submit_is_never_read(
    tmp_path: Path, pool: Executor, fmt: str
) -> None:
    """fixed: the worker reads a file's head (is it compressed?), then the pool process its
    slices; lines: the worker reads the lines. Either way the job fails naming c.bin, and
    no output holds the outside file."""
    data = tmp_path / "in"
    data.mkdir()
    for name in ("a.bin", "b.bin", "c.bin"):
        (data / name).write_bytes(b"".join(b"%s-%05d\n" % (name[:1].encode() * 3, i)
                                           for i in range(50)))  # fmt: skip
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(SECRET * 50)  # the same size: only its identity tells
    job = tmp_path / "echo.py"
    job.write_text(ECHO)

    async def swap(be: Backend, spec: JobSpec) -> None:
        (data / "c.bin").unlink()
        (data / "c.bin").symlink_to(outside)

    result = await chaos_run(
        f"{job}:Echo", data, tmp_path / "out", seed=1, pool=pool, plan=FaultPlan(seed=1),
        hooks=[None], workers=1, reducers=2, clientless=True, split_bytes=None,
        job_options={"input_format": fmt, "max_task_attempts": 1}, after_submit=swap,
    )  # fmt: skip
    assert result.record["state"] == "failed"
    error = result.record["error"]
    first = error.splitlines()[0]
    assert "input c.bin" in first and "changed since the job was submitted" in first, error
    assert "it is now a link to another file" in first and len(first) < 1000, error
    for f in (tmp_path / "out").rglob("*") if (tmp_path / "out").exists() else ():
        assert not f.is_file() or b"SECRET" not in f.read_bytes(), f


@pytest.mark.parametrize("swap", ["link", "other file", "grown"])
def test_a_file_slice_reads_only_the_file_submitted(tmp_path: Path, swap: str) -> None:
    """What the pool process does with a slice (fixed records, in place): the file at the
    path now is compared with the one submitted before a byte is read."""
    data = tmp_path / "in"
    data.mkdir()
    path = data / "c.bin"
    path.write_bytes(b"c" * 100)
    check = identity(path)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(SECRET * 10)
    if swap == "link":
        path.unlink()
        path.symlink_to(outside)
    elif swap == "other file":
        path.rename(tmp_path / "old.bin")  # kept: a deleted file's inode may be reused
        path.write_bytes(b"d" * 100)
    else:
        with path.open("ab") as f:
            f.write(b"c" * 10)
    piece = FileSlice(str(path), 10, 30, "c.bin", check)
    with pytest.raises(InputGone) as caught:
        slice_bytes("c.bin", piece)
    what = {
        "link": "it is now a link to another file",
        "other file": "it is now another file",
        "grown": "it now holds 110 bytes, not 100",
    }[swap]
    said = str(caught.value)
    assert f"input c.bin ({path}) changed since the job was submitted ({what})" in said
