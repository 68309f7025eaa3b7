"""Kills aimed at the streams of a large sort, against real `cmr worker` processes on the
local AWS stack.

A map task of fixed records larger than ``rangefile.STREAM_FROM`` streams its split from the
store into its pool process through FIFOs; a reducer streams its output to the store as its
pool process writes it, through a FIFO of its own, as a multipart upload. Here each kill
lands in the middle of one: a worker is SIGKILLed while its spool holds a split's FIFOs,
and another while the store holds its unfinished multipart upload of a partition's output
(its claim names the upload's token). The survivor must end the job on its own (the test
process only submits and watches) with every row sorted exactly once, and the job's
cleanup must leave no object, queue, record or unfinished upload behind.
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


def _uploading(
    s3: Any, bucket: str, prefix: str, reduces: dict[str, Item]
) -> tuple[str, int] | None:
    """An unfinished multipart upload of a partition's output under ``prefix`` and the pid
    of the worker whose claim it is (the key carries the claim's partition and token)."""
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    for upload in listed.get("Uploads", []):
        m = re.search(r"/out/p(\d{5})-e(\d+)-([0-9a-f]+)$", upload["Key"])
        if m is None:
            continue
        claim = reduces.get(reduce_sk(int(m.group(1))))
        if claim is not None and str(claim.get("token")) == m.group(3):
            return upload["Key"], owner_pid(str(claim["owner"]))
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
    with fleet_of(3, settings, tmp_path, spools=tmp_path / "spools") as fleet:
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
            while len(killed) < 2 and not run.done():
                assert time.monotonic() < deadline, f"no stream to kill in: {killed}"
                if "split" not in killed:
                    for w in fleet.running():
                        fifos = _streaming_split(fleet, w)
                        if fifos:
                            fleet.signal(w, signal.SIGKILL)
                            killed["split"] = (w.pid, fifos)
                            break
                elif "output" not in killed:
                    reduces = {str(i["sk"]): i for i in await be.table.query(pk, prefix="reduce#")}
                    found = _uploading(s3, settings.bucket, scratch_key, reduces)
                    live = {w.pid: w for w in fleet.running()}
                    if found is not None and found[1] in live:
                        fleet.signal(live[found[1]], signal.SIGKILL)
                        killed["output"] = (found[1], found[0])
                await asyncio.sleep(0.01)
            result = await asyncio.wait_for(run, JOB_TIMEOUT_S)
        finally:
            if not run.done():
                run.cancel()
        print(f"killed: {killed}")
        assert set(killed) == {"split", "output"}, killed
        for pid, _ in killed.values():
            assert fleet.by_pid(pid).proc.wait() == -signal.SIGKILL
        assert len(fleet.running()) == 1, "the survivor died"
    assert result.record["state"] == "succeeded", result.record.get("error")
    parts = sorted(out.glob("part-*"))
    assert len(parts) == REDUCERS
    data = b"".join(p.read_bytes() for p in parts)
    assert data == b"".join(sorted(rows))
    await assert_cleaned(be, settings, job_id)
