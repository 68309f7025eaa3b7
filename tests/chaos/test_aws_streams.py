"""Kills aimed at the streams of a large sort, against real `cmr worker` processes on the
local AWS stack.

A map task of fixed records larger than ``rangefile.STREAM_FROM`` streams its split from the
store into its pool process through FIFOs, and its shuffle object from its spool to the
store as a multipart upload; a reducer streams its output to the store as its pool process
writes it, through a FIFO of its own, as a multipart upload. Here each kill lands in the
middle of one: a worker is SIGKILLed while its spool holds a split's FIFOs, another while
the store holds its unfinished upload of a shuffle object, and a third while the store
holds its unfinished upload of a partition's output (its claim names the upload's token).
The survivor must end the job on its own (the test process only submits and watches) with
every row sorted exactly once, and the job's cleanup must leave no object, queue, record or
unfinished upload behind.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from cmr import rangefile
from cmr.api import RunResult, run_on
from cmr.backends.base import Backend, Item
from cmr.records import job_pk, reduce_sk
from cmr.settings import AwsSettings
from tests.chaos.test_aws_processes import (
    VISIBILITY_S,
    Fleet,
    WorkerProc,
    assert_cleaned,
    fleet_of,
    owner_pid,
)
from tests.stack import stack_backend

pytestmark = [pytest.mark.usefixtures("aws_stack"), pytest.mark.slow]

ROW = 100
FILES = 2
# Each file one map task, over STREAM_FROM: its split streams. 70 MB each.
ROWS_PER_FILE = 700_000
SPLIT_BYTES = ROWS_PER_FILE * ROW
REDUCERS = 2  # 70 MB of output each: a multipart upload of several parts
JOB_TIMEOUT_S = 300.0
KILLS = ("split", "object", "output")  # what a worker is killed in the middle of streaming


@pytest.fixture
async def aws(aws_stack: dict[str, str]) -> Any:
    async with stack_backend("streams", "cmrs") as made:
        yield made


def _rows(seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(10) + b"%088d\r\n" % i for i in range(FILES * ROWS_PER_FILE)]


def _streaming_split(fleet: Fleet, w: WorkerProc) -> list[str]:
    """The FIFOs of a split the worker is streaming into its pool process right now."""
    return [p.name for p in fleet.spool(w).rglob("*.range")]


def _uploads(s3: Any, bucket: str, prefix: str) -> list[str]:
    """The keys of the unfinished multipart uploads under ``prefix``."""
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return [u["Key"] for u in listed.get("Uploads", [])]


def _uploading_output(uploads: list[str], reduces: dict[str, Item]) -> tuple[str, int] | None:
    """An unfinished upload of a partition's output and the pid of the worker whose claim it
    is (the key carries the claim's partition and token)."""
    for key in uploads:
        m = re.search(r"/out/p(\d{5})-e(\d+)-([0-9a-f]+)$", key)
        if m is None:
            continue
        claim = reduces.get(reduce_sk(int(m.group(1))))
        if claim is not None and str(claim.get("token")) == m.group(3):
            return key, owner_pid(str(claim["owner"]))
    return None


def _uploading_object(uploads: list[str], fleet: Fleet) -> tuple[str, WorkerProc] | None:
    """An unfinished upload of a map attempt's shuffle object, and the worker sending it:
    the one live worker whose spool holds a map task's spool (the attempt's name is random;
    while two workers hold one, neither is told)."""
    keys = [k for k in uploads if "/shuffle/" in k]
    mapping = [w for w in fleet.running() if any(fleet.spool(w).rglob("map-*.spool"))]
    if keys and len(mapping) == 1:
        return keys[0], mapping[0]
    return None


async def test_sigkill_mid_split_stream_and_mid_output_upload(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    assert rangefile.streams(SPLIT_BYTES)
    rows = _rows(28)
    s3 = boto3.client("s3")
    root = f"{tmp_path.name}/in/"
    for f in range(FILES):
        body = b"".join(rows[f * ROWS_PER_FILE : (f + 1) * ROWS_PER_FILE])
        s3.put_object(Bucket=settings.bucket, Key=f"{root}part-m-{f:05d}", Body=body)
    out = tmp_path / "out"
    with fleet_of(len(KILLS) + 1, settings, tmp_path, spools=tmp_path / "spools") as fleet:
        got: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        run: asyncio.Task[RunResult] = asyncio.create_task(
            run_on(
                be,
                "examples/terasort.py",
                f"s3://{settings.bucket}/{root}",
                str(out),
                workers=0,
                visibility_timeout=VISIBILITY_S,
                reducers=REDUCERS,
                aws=settings,
                split_bytes=SPLIT_BYTES,
                shuffle="blob",
                on_submit=got.set_result,
            )
        )
        first: list[asyncio.Future[Any]] = [got, run]
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not got.done():
            run.result()  # submission failed: its error
        job_id = got.result()
        pk = job_pk(job_id)
        job = await be.table.get(pk, "job")
        assert job is not None and int(job["maps"]) == FILES
        scratch_key = be.scratch.removeprefix(f"s3://{settings.bucket}/")
        killed: dict[str, tuple[int, Any]] = {}
        deadline = time.monotonic() + JOB_TIMEOUT_S
        try:
            while len(killed) < len(KILLS) and not run.done():
                assert time.monotonic() < deadline, f"no stream to kill in: {killed}"
                if "split" not in killed:
                    for w in fleet.running():
                        fifos = _streaming_split(fleet, w)
                        if fifos:
                            fleet.signal(w, signal.SIGKILL)
                            killed["split"] = (w.pid, fifos)
                            break
                uploads = _uploads(s3, settings.bucket, scratch_key)
                if "object" not in killed and (found := _uploading_object(uploads, fleet)):
                    fleet.signal(found[1], signal.SIGKILL)
                    killed["object"] = (found[1].pid, found[0])
                if "output" not in killed:
                    reduces = {str(i["sk"]): i for i in await be.table.query(pk, prefix="reduce#")}
                    owner = _uploading_output(uploads, reduces)
                    live = {w.pid: w for w in fleet.running()}
                    if owner is not None and owner[1] in live:
                        fleet.signal(live[owner[1]], signal.SIGKILL)
                        killed["output"] = (owner[1], owner[0])
                await asyncio.sleep(0.01)
            result = await asyncio.wait_for(run, JOB_TIMEOUT_S)
        finally:
            if not run.done():
                run.cancel()
        print(f"killed: {killed}")
        assert set(killed) == set(KILLS), killed
        for pid, _ in killed.values():
            assert fleet.by_pid(pid).proc.wait() == -signal.SIGKILL
        assert len(fleet.running()) == 1, "the survivor died"
    assert result.record["state"] == "succeeded", result.record.get("error")
    parts = sorted(out.glob("part-*"))
    assert len(parts) == REDUCERS
    data = b"".join(p.read_bytes() for p in parts)
    assert data == b"".join(sorted(rows))
    await assert_cleaned(be, settings, job_id)
