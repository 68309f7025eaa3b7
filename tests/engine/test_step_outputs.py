"""What one pipeline step hands the next is verified (issue 26, item 2): each reduce commit
records its output's size and sha256, the next step's plan carries them, and a map task
reads a part only if it is still those bytes, compared before anything decodes it. A bucket
writer who replaces a committed part (a zstd bomb, or bytes of the same size), or a table
writer who names another digest, makes the job fail with a bounded reason; and the
decoders themselves stop a bomb by its ratio, in bounded memory."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import boto3
import msgpack
import pytest
import zstandard

from cmr.backends.base import Backend, Update
from cmr.pipeline import current
from cmr.pool import cpu_pool
from cmr.records import JobState, job_pk, reduce_sk
from cmr.runtime import Runtime
from cmr.settings import AwsSettings
from cmr.virtualtime import in_virtual_time
from tests.procs import Peaks, stopped

from .corpus import edge_cases
from .tampering import TOPWORDS, topwords_tampered

ROOT = Path(__file__).resolve().parent.parent.parent
REASON = "is not what its commit recorded"


def pairs_bomb(decoded: int, value: int = 1000) -> bytes:
    """A small zstd frame of valid pairs (["w...", 1]) that decodes to ``decoded`` bytes,
    made in pieces: the test never holds what it decodes to."""
    pair = msgpack.packb(["w" * value, 1])
    piece = pair * (4 * 1024 * 1024 // len(pair))
    out = zstandard.ZstdCompressor(level=3).compressobj()
    frame = [out.compress(piece) for _ in range(decoded // len(piece))]
    frame.append(out.flush())
    return b"".join(frame)


class Tamper:
    """At step 1's first reduce commit, act as a stranger with the bucket or the table:
    replace the committed output (``bomb``: a zstd bomb; ``same_size``: other bytes of the
    same size), or rewrite the commit record's digest (``wrong_digest``; ``no_digest``:
    remove it, as a record of before digests, or of before BLAKE3: its field was sha256)."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.done = False

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != "reduce.committed" or self.done:
            return
        self.done = True
        be, url = rt.backend, context["output"]
        key = (job_pk(context["job"]), reduce_sk(context["partition"]))
        if self.how == "bomb":
            await be.blobs.put(url, pairs_bomb(256 * 1024 * 1024))
        elif self.how == "same_size":
            data = bytearray(await be.blobs.get(url))
            data[-1] ^= 1  # still msgpack pairs: a count changed by one
            await be.blobs.put(url, bytes(data))
        elif self.how == "wrong_digest":
            other = hashlib.sha256(b"someone else's part").hexdigest()  # well-formed
            await be.table.update(Update(*key, set_={"blake3": other}))
        else:
            item = await be.table.get(*key)
            assert item is not None and len(str(item["blake3"])) == 64
            kept = {k: v for k, v in item.items() if k not in ("pk", "sk", "blake3")}
            kept["sha256"] = item["blake3"]  # the field of before, as an older worker wrote
            await be.table.put(*key, kept)


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with cpu_pool(2) as p:
        yield p


@pytest.mark.parametrize("how", ["bomb", "same_size", "wrong_digest"])
@in_virtual_time
async def test_a_replaced_step_output_fails_the_next_step(
    how: str, pool: Executor, tmp_path: Path
) -> None:
    tamper = Tamper(how)
    result = await topwords_tampered(tmp_path, pool, tamper, 120)
    assert tamper.done, "step 1 never committed"
    record = result.record
    assert record["step"] == 1, record  # step 1 handed over; step 2 refused the part
    assert record["state"] == JobState.FAILED.value
    error = str(record["error"])
    # The reason; the lines after it say where (a traceback).
    reason = error.split("\n", maxsplit=1)[0]
    assert REASON in reason and "written by someone else" in reason, error
    assert "would fail again" in reason and len(reason) < 700, reason
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    # Only step 1's committed outputs are left: kept for a resume (--from-step).
    assert all(f"{result.job_id}/out/p" in x for x in result.leftovers), result.leftovers


@in_virtual_time
async def test_a_commit_record_without_a_digest_is_refused(pool: Executor, tmp_path: Path) -> None:
    """A commit record of before digests (or a stranger's without one) is malformed: the
    step fails instead of handing over a part nobody can check."""
    tamper = Tamper("no_digest")
    result = await topwords_tampered(tmp_path, pool, tamper, 120)
    record = result.record
    assert record["step"] == 0 and record["state"] == JobState.FAILED.value, record
    error = str(record["error"])
    assert "names no blake3 digest" in error and len(error) < 1000, error
    assert result.leftovers == []


# --- the decoder alone: a bomb whose digest would match ---------------------------------

DECODER = """
import json, os, sys
from cmr import formats
from tests.procs import vm_hwm_mib
bomb = open(sys.argv[1], "rb").read()
chunk = formats.Chunk("part-00000", bomb, formats.sniff(bomb[:512]))
n, error = 0, ""
try:
    for _ in formats.records(formats.parse_input("pairs"), chunk, 1 << 20):
        n += 1
except formats.InputError as exc:
    error = str(exc)
rss = vm_hwm_mib(os.getpid())  # its own peak (ru_maxrss would carry pytest's over exec)
print(json.dumps({"pairs": n, "error": error, "rss_mib": rss}))
"""


def test_read_pairs_stops_a_zstd_bomb_by_its_ratio_in_bounded_memory(tmp_path: Path) -> None:
    """read_pairs over 2 GiB of valid pairs in a frame of a few hundred KiB (as a step's
    digest would match, were the bomb its own output): it stops at the ratio's bound with
    a reason, and the process's peak RSS stays far below what the bomb decodes to."""
    bomb = tmp_path / "bomb.zst"
    bomb.write_bytes(pairs_bomb(2 * 1024**3, value=100_000))
    assert bomb.stat().st_size < 1024 * 1024
    run = subprocess.run(
        [sys.executable, "-c", DECODER, str(bomb)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert "decode to more than" in got["error"] and "bomb" in got["error"], got
    assert len(got["error"]) < 500, got
    assert got["rss_mib"] < 400, got  # the bound: 64 MiB decoded, read a block at a time


# --- the reproduction: real processes on the local stack ------------------------

MEMORY_MB = 512
BASE_MIB = 200  # a worker and its pool process, idle: ~90 MiB


def _attacked_worker(s: AwsSettings, job_id: str, tmp_path: Path) -> dict[int, float]:
    """Run one worker on the job, frozen once step 1 has committed (finalize.begin); then,
    as a stranger with S3 alone, overwrite step 1's committed part 0 with a zstd bomb and
    let the worker go on until it ends by itself. Its and its pool's peak RSS, by pid."""
    names = ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cmr", "worker", "--backend", "aws", "--job", job_id,
             "--processes", "1", "--memory-mb", str(MEMORY_MB), "--idle-exit", "60",
             "--jobs-from", str(ROOT / "examples"), *names],
            env={**os.environ, "CMR_STOP_AT": "finalize.begin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
        )  # fmt: skip
    peaks = Peaks(proc.pid)
    try:
        with peaks.sampling():
            deadline = time.monotonic() + 120
            while not (stopped(proc.pid) and "stopping at finalize.begin" in log.read_text()):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            s3 = boto3.client("s3")
            listed = s3.list_objects_v2(Bucket=s.bucket, Prefix=f"cmr/jobs/{job_id}/out/p00000-")
            keys = [o["Key"] for o in listed.get("Contents", [])]
            assert len(keys) == 1, keys
            s3.put_object(Bucket=s.bucket, Key=keys[0], Body=pairs_bomb(1024**3))
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(240)
            except subprocess.TimeoutExpired:
                raise AssertionError(log.read_text()[-3000:]) from None
        return peaks.by_pid
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


def _cmr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_topwords_step_output_replaced_by_a_bomb_on_the_stack(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """The issue's reproduction: topwords on the stack; once step 1 has committed (the
    worker frozen at finalize.begin), a bucket writer overwrites a committed output with a
    zstd bomb (S3 put only). Step 2 fails with the digest's reason, and the worker's peak
    RSS (it and its pool) stays within its --memory-mb budget."""
    be, s = aws
    names = ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]
    data = edge_cases(tmp_path / "in")
    # Enough distinct words that each of step 1's parts (~130 KB) is larger than the bomb
    # (~100 KB): a reader of the recorded size alone reads all of it, as in the issue.
    (data / "many.txt").write_text(" ".join(f"word{i:06d}" for i in range(40_000)) + "\n")
    output = f"s3://{s.bucket}/out/top/"
    sub = await asyncio.to_thread(
        _cmr, "run", TOPWORDS, "--backend", "aws", "--input", str(data), "--output", output,
        "--detach", *names,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr[-3000:]
    job_id = sub.stdout.strip().splitlines()[-1]
    peaks = await asyncio.to_thread(_attacked_worker, s, job_id, tmp_path)
    assert max(peaks.values()) < MEMORY_MB + BASE_MIB, peaks
    _, record = await current(be, job_id)
    assert record["step"] == 1 and record["state"] == JobState.FAILED.value, record
    reason = str(record["error"]).split("\n", maxsplit=1)[0]
    assert REASON in reason and "written by someone else" in reason, record["error"]
    assert "would fail again" in reason and len(reason) < 700, reason
    # Step 1's outputs are kept for a resume (--from-step) until `cmr cleanup`.
    store = f"aws://{s.bucket}/{s.table}?prefix={s.queue_prefix}"
    clean = await asyncio.to_thread(_cmr, "cleanup", job_id, "--store", store)
    assert clean.returncode == 0, clean.stderr[-3000:]
