"""A stranger who can write the job's bucket or its table, during real jobs on the local stack.

The hostile queue writer of tests/chaos/test_aws_processes.py has two siblings here:

* a **bucket writer** (S3 puts only, plain boto3, on the job's bucket) who overwrites what
  it finds: the plan blob, a side file, a spilled shuffle body, a pipeline step's committed
  outputs (a zstd bomb, or another partition's genuine output) and the input itself;
* a **table writer** (DynamoDB PutItem/UpdateItem only) who rewrites the job record, map and
  reduce commit records, a reduce claim and a pipeline's next-step record.

Each case submits the job detached (nobody waits on it: ``run_on(detach=True)``, what ``cmr
run --detach`` calls, in the test's process) and runs one real ``cmr worker --job`` process.
The attack happens between submit and the worker's start, or while the worker is frozen at
an exact point of the protocol (``CMR_STOP_AT``: it SIGSTOPs itself
there, the adversary writes, the test SIGCONTs it). The worker must end on its own, and the
run must end in one of two ways: the job succeeded with exactly the reference output, or it
did not run the stranger's bytes: the job failed, or the worker refused it, with a reason
under 1,000 characters that names what was wrong. Either way no worker process's peak RSS
(VmHWM sampled while it lives, and the kernel's ru_maxrss of it and its pool at its exit)
passes its ``--memory-mb`` plus the interpreter's base.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import msgpack
import pytest
import zstandard

from cmr.api import open_backend, run_on
from cmr.backends.base import Backend
from cmr.records import job_pk
from cmr.settings import AwsSettings
from tests.everyday import spread
from tests.procs import Peaks, stopped
from tests.stack import remove_test_resources

pytestmark = pytest.mark.usefixtures("aws_stack")

ROOT = Path(__file__).resolve().parent.parent.parent
MEMORY_MB = 64  # each worker's --memory-mb
BASE_MIB = 200  # an idle worker with its pool process: ~90 MiB; the bombs here are GiBs
WORKER_DEADLINE_S = 120.0  # a worker that has not ended by then did not end on its own
REASON_CHARS = 1000
TOP = 15
SPILL_VALUE = 200_000  # bytes: past half a message, so every pair goes to a spill blob

JOBS = '''
import cmr


class StopWords(cmr.Job):
    """Word count without the words of the side file stop.txt (--file)."""

    def setup(self):
        with open(self.file("stop.txt")) as f:
            self.stop = set(f.read().split())

    def map(self, key, line):
        for word in line.split():
            if word not in self.stop:
                yield word, 1

    def reduce(self, word, counts):
        yield word, sum(counts)


class BigValues(cmr.Job):
    """Each word's pair carries a value too large for a message: its batch is spilled."""

    def map(self, key, line):
        for word in line.split()[:1]:
            yield word, "v" * SPILL_VALUE

    def reduce(self, word, values):
        yield word, sum(len(v) for v in values)
'''.replace("SPILL_VALUE", str(SPILL_VALUE))


# ---------------------------------------------------------------------------- the data


def corpus() -> dict[str, bytes]:
    """Three small text files (plain words: their counts are easy to state)."""
    files = {}
    for i in range(3):
        lines = [" ".join(f"w{(i * 7 + j * k) % 41}" for k in range(1, 9)) for j in range(60)]
        files[f"in/f{i}.txt"] = ("\n".join(lines) + "\n").encode()
    # One input compressed (a codec sniffed at submit): its decoder is bounded too.
    files["in/f2.txt.zst"] = zstandard.compress(files.pop("in/f2.txt"))
    return files


def text_of(name: str, data: bytes) -> str:
    return (zstandard.decompress(data) if name.endswith(".zst") else data).decode()


def words_of(files: dict[str, bytes]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, data in files.items():
        counts.update(text_of(name, data).split())
    return counts


def replaced(data: bytes) -> bytes:
    """Other words, the same size."""
    return data.replace(b"w", b"v")


STOP = b"w1 w2 w3\n"


def expected(kind: str, files: dict[str, bytes]) -> list[tuple[str, int]]:
    """The reference output, sorted: what a sequential run of the job writes."""
    counts = words_of(files)
    if kind == "topwords":
        return sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:TOP]
    if kind == "stopwords":
        stop = set(STOP.decode().split())
        return sorted((w, n) for w, n in counts.items() if w not in stop)
    if kind == "bigvalues":
        firsts: Counter[str] = Counter()
        for name, data in files.items():
            lines = text_of(name, data).splitlines()
            firsts.update(line.split()[0] for line in lines if line.split())
        return sorted((w, n * SPILL_VALUE) for w, n in firsts.items())
    return sorted(counts.items())


@functools.cache
def zstd_bomb() -> bytes:
    """A zstd frame of valid pairs (["a", 1] over and over) that decodes to 4 GiB:
    ~130 KiB on the wire, made in pieces so the test never holds what it decodes to."""
    pair = msgpack.packb(["a", 1])
    piece = pair * (4 * 1024 * 1024 // len(pair))
    out = zstandard.ZstdCompressor(level=3).compressobj()
    frame = [out.compress(piece) for _ in range(4 * 1024 * 1024 * 1024 // len(piece))]
    frame.append(out.flush())
    return b"".join(frame)


# ---------------------------------------------------------------------------- plumbing


@pytest.fixture
async def store(aws_stack: dict[str, str]) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    tag = uuid.uuid4().hex[:8]
    settings = AwsSettings(
        bucket=f"cmr-hostile-{tag}", table=f"cmr-hostile-{tag}", queue_prefix=f"cmrh-{tag}-"
    )
    other = f"cmr-other-{tag}"
    try:
        async with open_backend("aws", settings) as be:
            yield be, settings
    finally:
        remove_test_resources(settings.bucket, settings.table, settings.queue_prefix)
        remove_test_resources(other, f"cmr-other-{tag}", f"cmro-{tag}-")


def names(s: AwsSettings) -> list[str]:
    return ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]


@dataclass
class Worker:
    """One ``cmr worker --job`` process; its and its descendants' peak RSS are sampled."""

    proc: subprocess.Popen[bytes]
    log: Path
    peaks: Peaks

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_stopped_at(self, step: str) -> bool:
        """Whether the worker froze itself at ``step`` (False: it ended before reaching it)."""
        deadline = time.monotonic() + WORKER_DEADLINE_S
        while time.monotonic() < deadline:
            if f"stopping at {step}" in self.text() and stopped(self.proc.pid):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        raise AssertionError(f"the worker never reached {step}:\n{self.text()[-3000:]}")

    def finish(self) -> int:
        """Wait for the worker to end on its own; its exit code."""
        try:
            return self.proc.wait(WORKER_DEADLINE_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker did not end on its own:\n{self.text()[-3000:]}"
            ) from None

    def peak_mib(self) -> float:
        return self.peaks.most()


@contextlib.contextmanager
def worker(s: AwsSettings, job_id: str, logs: Path, jobs: Path, at: str | None) -> Iterator[Worker]:
    log = logs / "worker.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "cmr", "worker", "--backend", "aws", "--job", job_id,
                "--processes", "1", "--map-slots", "1", "--reduce-slots", "1",
                "--memory-mb", str(MEMORY_MB), "--idle-exit", "20",
                "--jobs-from", str(ROOT), "--jobs-from", str(jobs), *names(s),
            ],
            env={**os.environ, **({"CMR_STOP_AT": at} if at else {})},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    w = Worker(proc, log, Peaks(proc.pid))
    try:
        with w.peaks.sampling():
            try:
                yield w
            finally:
                if proc.poll() is None and proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGCONT)
                        proc.kill()
                    with contextlib.suppress(ChildProcessError):
                        proc.wait(30)
    finally:
        for pid in w.peaks.by_pid:  # a pool process the killed worker left behind
            if pid != proc.pid and b"multiprocessing" in _cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass
class Adversary:
    """What the stranger holds: plain boto3 clients on the job's bucket and table."""

    s: AwsSettings
    job_id: str
    other_bucket: str
    s3: Any = None
    table: Any = None
    did: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.s3 = boto3.client("s3")
        self.table = boto3.resource("dynamodb").Table(self.s.table)

    def keys(self, prefix: str) -> list[str]:
        got = self.s3.list_objects_v2(Bucket=self.s.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in got.get("Contents", []))

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.s.bucket, Key=key, Body=body)
        self.did.append(f"put s3://{self.s.bucket}/{key} ({len(body):,} bytes)")

    def get(self, key: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=self.s.bucket, Key=key)["Body"].read()
        return body

    def scratch(self, job_id: str | None = None) -> str:
        """The key prefix of a job's scratch (its plan, spills, reduce outputs)."""
        return f"{self.scratch_root()}jobs/{job_id or self.job_id}/"

    def scratch_root(self) -> str:
        # A bucket writer lists the bucket; the record only saves the test the guessing.
        url = str(self.record("job")["scratch"])
        bucket, _, key = url.removeprefix("s3://").partition("/")
        assert bucket == self.s.bucket, url
        return key.rstrip("/") + "/" if key else ""

    def record(self, sk: str, job_id: str | None = None) -> dict[str, Any]:
        key = {"pk": job_pk(job_id or self.job_id), "sk": sk}
        item: dict[str, Any] = self.table.get_item(Key=key, ConsistentRead=True)["Item"]
        return item

    def rewrite(self, sk: str, job_id: str | None = None, **values: Any) -> None:
        """UpdateItem: SET each of ``values`` on the record."""
        key = {"pk": job_pk(job_id or self.job_id), "sk": sk}
        names_ = {f"#f{i}": k for i, k in enumerate(values)}
        vals = {f":v{i}": v for i, v in enumerate(values.values())}
        expr = "SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(values)))
        self.table.update_item(
            Key=key, UpdateExpression=expr, ExpressionAttributeNames=names_,
            ExpressionAttributeValues=vals,
        )  # fmt: skip
        self.did.append(f"rewrote {key['pk']}/{sk}: {sorted(values)}")

    def secret(self) -> str:
        """A private object in a bucket that is not the job's: what a forger wants read."""
        with contextlib.suppress(Exception):
            self.s3.create_bucket(Bucket=self.other_bucket)
        self.s3.put_object(
            Bucket=self.other_bucket, Key="private/secret.txt", Body=b"topsecret " * 500
        )
        return f"s3://{self.other_bucket}/private/"


# ---------------------------------------------------------------------------- the attacks


def plan_bomb(a: Adversary) -> None:
    a.put(a.scratch() + "plan", zstd_bomb())


def input_replaced(a: Adversary) -> None:
    # The user's own data: whoever may write it decides what the job reads (the same size,
    # other words), but a change after submit must not be read half old, half new.
    a.put("in/f1.txt", replaced(corpus()["in/f1.txt"]))


def input_bomb(a: Adversary) -> None:
    # A compressed input (zstd at submit) whose object becomes a frame of 4 GiB.
    a.put("in/f2.txt.zst", zstd_bomb())


def side_file_huge(a: Adversary) -> None:
    files = a.keys(f"{a.scratch_root()}files/{a.job_id}/")
    assert files, "no side file was staged"
    (key,) = [k for k in files if k.endswith("stop.txt")] or files[:1]
    a.put(key, b"w4 " * (100 * 1024 * 1024 // 3))  # 100 MiB where 9 bytes were staged


def spill_bomb(a: Adversary) -> None:
    spills = a.keys(a.scratch() + "spill/")
    assert spills, "the map attempt spilled nothing"
    for key in spills:
        a.put(key, zstd_bomb())


def spill_swapped(a: Adversary) -> None:
    # Valid pairs, as many as the batch says it holds: only a digest tells them apart.
    spills = a.keys(a.scratch() + "spill/")
    assert spills, "the map attempt spilled nothing"
    for key in spills:
        a.put(key, msgpack.packb(["forged", "v" * 7]))


def step_output_bomb(a: Adversary) -> None:
    outs = a.keys(a.scratch() + "out/")
    assert outs, "step 1 committed no output"
    for key in outs:
        a.put(key, zstd_bomb())


def step_output_swapped(a: Adversary) -> None:
    # Genuine output of the same step, another partition's: the words counted twice.
    outs = a.keys(a.scratch() + "out/")
    assert len(outs) >= 2, outs
    a.put(outs[0], a.get(outs[1]))


def job_input_root(a: Adversary) -> None:
    a.rewrite("job", input_root=a.secret())


def job_plan_digest(a: Adversary) -> None:
    a.rewrite("job", plan_digest=hashlib.sha256(b"another plan").hexdigest())


def job_queue_prefix(a: Adversary) -> None:
    # Queues the worker would create, send to and delete at cleanup: another tenant's.
    a.rewrite("job", queue_prefix="cmrevil-")


def job_output(a: Adversary) -> None:
    a.rewrite("job", output=f"s3://{a.other_bucket}/stolen/")


def map_counts(a: Adversary) -> None:
    (sk,) = [i["sk"] for i in _query(a, "map#")][:1]
    item = a.record(sk)
    rows = msgpack.unpackb(bytes(item["counts"].value))
    a.rewrite(sk, counts=msgpack.packb([[p, b + 1, r + 1] for p, b, r in rows]))


def map_attempt(a: Adversary) -> None:
    (sk,) = [i["sk"] for i in _query(a, "map#")][:1]
    a.rewrite(sk, attempt="0badc0de")


def committed_reduce(a: Adversary) -> dict[str, Any]:
    (item,) = [i for i in _query(a, "reduce#") if i.get("state") == "committed"][:1]
    return item


def reduce_commit_output(a: Adversary) -> None:
    a.secret()
    sk = str(committed_reduce(a)["sk"])
    a.rewrite(sk, output=f"s3://{a.other_bucket}/private/secret.txt")


def reduce_commit_counts(a: Adversary) -> None:
    # Names stay right; counts, size and any digest the commit carries are made wrong.
    item = committed_reduce(a)
    wrong: dict[str, Any] = {"records": 1, "bytes": 3}
    for name in ("digest", "blake3"):
        if name in item:
            wrong[name] = hashlib.sha256(b"not this").hexdigest()
    a.rewrite(str(item["sk"]), **wrong)


def claim_stolen(a: Adversary) -> None:
    (item,) = [i for i in _query(a, "reduce#") if i.get("state") == "claimed"][:1]
    a.rewrite(str(item["sk"]), owner="w1-badc0de", token="f" * 32)


def next_step_input(a: Adversary) -> None:
    a.rewrite("job", job_id=a.job_id + "-s2", input_root=a.secret())


def next_step_plan(a: Adversary) -> None:
    a.rewrite("job", job_id=a.job_id + "-s2", maps=1, plan_digest="0" * 64)


def _query(a: Adversary, prefix: str) -> list[dict[str, Any]]:
    from boto3.dynamodb.conditions import Key

    got = a.table.query(
        KeyConditionExpression=Key("pk").eq(job_pk(a.job_id)) & Key("sk").begins_with(prefix),
        ConsistentRead=True,
    )
    items: list[dict[str, Any]] = got["Items"]
    return items


@dataclass(frozen=True)
class Attack:
    act: Callable[[Adversary], None]
    job: str  # wordcount, topwords, stopwords, bigvalues
    at: str | None  # the worker's CMR_STOP_AT; None: before the worker starts
    because: tuple[str, ...]  # a refusal's or failure's reason names one of these


ATTACKS = {
    # the bucket writer
    "bucket-plan-bomb": Attack(plan_bomb, "wordcount", None, ("plan",)),
    "bucket-input-replaced": Attack(input_replaced, "wordcount", None, ("f1.txt",)),
    "bucket-input-bomb": Attack(input_bomb, "wordcount", None, ("f2.txt.zst",)),
    "bucket-side-file-huge": Attack(side_file_huge, "stopwords", None, ("stop.txt",)),
    "bucket-spill-bomb": Attack(spill_bomb, "bigvalues", "map.committed", ("spill",)),
    "bucket-spill-swapped": Attack(spill_swapped, "bigvalues", "map.committed", ("spill",)),
    "bucket-step-output-bomb": Attack(
        step_output_bomb, "topwords", "pipeline.handed_over", ("p0000",)
    ),
    "bucket-step-output-swapped": Attack(
        step_output_swapped, "topwords", "pipeline.handed_over", ("p0000",)
    ),
    # the table writer
    "table-job-input-root": Attack(job_input_root, "wordcount", None, ("input",)),
    "table-job-plan-digest": Attack(job_plan_digest, "wordcount", None, ("plan",)),
    "table-job-queue-prefix": Attack(job_queue_prefix, "wordcount", None, ("queue",)),
    "table-job-output": Attack(job_output, "wordcount", None, ("output",)),
    "table-map-counts": Attack(map_counts, "wordcount", "map.committed", ("map", "count")),
    "table-map-attempt": Attack(map_attempt, "wordcount", "map.committed", ("map", "attempt")),
    "table-reduce-commit-output": Attack(
        reduce_commit_output, "wordcount", "reduce.committed", ("commit record",)
    ),
    "table-reduce-commit-counts": Attack(
        reduce_commit_counts, "topwords", "reduce.committed", ("p0000", "commit")
    ),
    "table-claim-stolen": Attack(claim_stolen, "wordcount", "reduce.draining", ("claim",)),
    "table-next-step-input": Attack(
        next_step_input, "topwords", "pipeline.handed_over", ("input",)
    ),
    "table-next-step-plan": Attack(
        next_step_plan, "topwords", "pipeline.handed_over", ("plan", "next step")
    ),
}


# What `cmr run JOB ... --detach` is given for each job: the job and its run's options.
SUBMIT: dict[str, tuple[str, dict[str, Any]]] = {
    "wordcount": ("examples/wordcount.py", {"reducers": 2}),
    "topwords": ("examples/topwords.py", {"params": {"top": str(TOP)}}),
    "stopwords": ("{jobs}/jobs.py:StopWords", {"reducers": 2, "files": ["{jobs}/stop.txt"]}),
    "bigvalues": ("{jobs}/jobs.py:BigValues", {"reducers": 2}),
}


async def published(be: Backend, output: str) -> list[tuple[str, int]]:
    from cmr.publish import Manifest

    manifest = Manifest.from_bytes(await be.blobs.get(output + "_SUCCESS"))
    rows = []
    for part in manifest.parts:
        for line in (await be.blobs.get(output + part.name)).decode().splitlines():
            word, _, n = line.rpartition("\t")
            rows.append((word, int(n)))
    return sorted(rows)


def attacked(
    attack: Attack, adversary: Adversary, tmp_path: Path, jobs: Path
) -> tuple[Worker, int, str]:
    """Run the job's worker with the attack at its point; (the worker, its exit, its log)."""
    with worker(adversary.s, adversary.job_id, tmp_path, jobs, attack.at) as w:
        if attack.at is None:
            attack.act(adversary)
        elif w.wait_stopped_at(attack.at):
            attack.act(adversary)
            w.proc.send_signal(signal.SIGCONT)
        return w, w.finish(), w.text()


@pytest.mark.parametrize("name", spread(list(ATTACKS), list(ATTACKS), every=20))  # everyday: 1
async def test_a_stranger_writing_the_bucket_or_the_table(
    name: str, store: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """The job succeeds with exact output, or it fails (or its worker refuses it) with a
    short reason naming what was wrong; the worker ends on its own, within its memory."""
    attack = ATTACKS[name]
    be, s = store
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "jobs.py").write_text(JOBS)
    (jobs / "stop.txt").write_bytes(STOP)
    s3 = boto3.client("s3")
    files = corpus()
    for key, body in files.items():
        s3.put_object(Bucket=s.bucket, Key=key, Body=body)
    output = f"s3://{s.bucket}/out/{name}/"
    # Submitted here, as `cmr run ... --detach` submits (run_on with detach: the same call,
    # without a process's start-up and clients): only the worker process runs the job.
    job, options = SUBMIT[attack.job]
    if "files" in options:
        options = {**options, "files": [f.format(jobs=jobs) for f in options["files"]]}
    submitted = await run_on(
        be, job.format(jobs=jobs), f"s3://{s.bucket}/in/", output, detach=True, workers=0,
        visibility_timeout=5, task_timeout=15, max_task_attempts=2, aws=s, **options,
    )  # fmt: skip
    job_id = submitted.job_id
    adversary = Adversary(s, job_id, f"cmr-other-{s.bucket.rsplit('-', 1)[1]}")
    w, code, log = await asyncio.to_thread(attacked, attack, adversary, tmp_path, jobs)
    print(f"{name}: {adversary.did}; worker exit {code}; peak RSS {w.peak_mib():.0f} MiB")
    print(log[-4000:])
    assert adversary.did, "the attack never happened"
    assert w.peak_mib() < MEMORY_MB + BASE_MIB, (w.peak_mib(), w.peaks.by_pid)
    last = job_id + "-s2" if attack.job == "topwords" else job_id
    record = await be.table.get(job_pk(last), "job") or await be.table.get(job_pk(job_id), "job")
    assert record is not None
    state = record.get("state")
    if code != 0:  # the worker refused the job: its reason, on its last line
        reason = log.strip().splitlines()[-1]
    elif state == "succeeded":
        got = await published(be, output)
        if attack.act is input_replaced:  # the user's data, as it is now: all of it
            new = {**files, "in/f1.txt": replaced(files["in/f1.txt"])}
            assert got in (expected(attack.job, files), expected(attack.job, new))
        else:
            assert got == expected(attack.job, files)
        return
    else:
        assert state == "failed", f"the job ended {state!r} with worker exit {code}"
        # The reason's first line; a traceback may follow it (the record keeps 8,000).
        reason = str(record.get("error", "")).splitlines()[0]
    assert len(reason) < REASON_CHARS, reason
    assert any(word in reason for word in attack.because), reason
