"""A job's life on the local AWS stack with real processes and nobody waiting: submit with
``--detach``, workers that come and die, ``cmr status --json``, ``cmr wait``, Ctrl-C, and the
rules of an ``s3://`` output place. After each test the ``aws`` fixture checks that nothing
was left behind (queues, records, scratch objects)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cli.worker import JOB_REFRESH
from cmr.errors import UsageError
from cmr.publish import Manifest
from cmr.settings import AwsSettings
from tests.stack import LOCALSTACK_URL

from .corpus import edge_cases
from .reference import word_count

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("aws_stack")


def names(s: AwsSettings) -> list[str]:
    return ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]


def cmr(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cmr", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def status_json(s: AwsSettings, job_id: str) -> dict[str, Any]:
    code, out, err = finish(cmr("status", job_id, "--json", *names(s)))
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


async def read_s3_output(be: Backend, output: str) -> tuple[Manifest, dict[str, int]]:
    manifest = Manifest.from_bytes(await be.blobs.get(output + "_SUCCESS"))
    counts: dict[str, int] = {}
    for part in manifest.parts:
        for line in (await be.blobs.get(output + part.name)).decode().splitlines():
            word, _, n = line.rpartition("\t")
            counts[word] = int(n)
    return manifest, counts


@pytest.mark.slow
async def test_detached_job_survives_a_worker_killed_while_publishing(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """Submit with --detach and walk away; a worker is killed (SIGKILL) in the middle of
    publishing; the other worker, alone, finishes the job: exact output, nothing leaked."""
    be, s = aws
    data = edge_cases(tmp_path / "in")
    output = f"s3://{s.bucket}/out/wc/"
    code, out, err = finish(
        cmr(
            "run", "examples/wordcount.py", "--backend", "aws", "--input", str(data),
            "--output", output, "--reducers", "3", "--visibility-timeout", "5", "--detach",
            *names(s),
        )
    )  # fmt: skip
    assert code == 0, err
    job_id = out.strip().splitlines()[-1]  # the last line of its output: the job id
    assert status_json(s, job_id)["state"] == "running"
    worker = ["worker", "--backend", "aws", "--job", job_id, "--processes", "1", *names(s)]
    doomed = cmr(*worker, env={"CMR_STOP_AT": "publish.copied"})
    procs = [doomed]
    try:
        # The doomed worker runs the job alone up to the middle of publishing, and freezes.
        assert doomed.stderr is not None
        while "stopping at publish.copied" not in (line := doomed.stderr.readline()):
            assert line, "the worker ended before it published"
        state = status_json(s, job_id)
        assert state["state"] == "running" and "publishing" in state
        survivor = cmr(*worker)
        procs.append(survivor)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        code, _, err = finish(survivor)  # a --job worker stops once its job is cleaned up
        assert code == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()  # closes its pipes, killed or not
    code, _, err = finish(cmr("wait", job_id, *names(s)))
    assert code == 0, err
    doc = status_json(s, job_id)
    assert doc["state"] == "succeeded"
    assert doc["published"]["manifest"] == output + "_SUCCESS"
    manifest, counts = await read_s3_output(be, output)
    assert manifest.job == job_id
    assert counts == word_count(data)
    objects = {b.url for b in await be.blobs.list(output)}
    assert objects == {output + "_SUCCESS", *(output + p.name for p in manifest.parts)}


@pytest.mark.slow
async def test_wait_exits_non_zero_unless_the_job_succeeded(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    _, s = aws
    job = tmp_path / "boom.py"
    job.write_text(
        "import cmr\nclass Boom(cmr.Job):\n    def map(self, k, line):\n"
        "        raise RuntimeError('no thanks')\n        yield\n"
        "    def reduce(self, k, vs):\n        yield k, 0\n"
    )
    (tmp_path / "in.txt").write_text("a\n")
    code, out, err = finish(
        cmr(
            "run", str(job), "--backend", "aws", "--input", str(tmp_path / "in.txt"),
            "--output", f"s3://{s.bucket}/out/boom/", "--detach", *names(s),
        )
    )  # fmt: skip
    assert code == 0, err
    job_id = out.strip().splitlines()[-1]
    worker = cmr(
        "worker", "--backend", "aws", "--job", job_id, "--processes", "1",
        "--jobs-from", str(tmp_path), *names(s),
    )  # fmt: skip
    code, _, err = finish(cmr("wait", job_id, *names(s)))
    assert code == 1
    assert "failed" in err and "RuntimeError: no thanks" in err
    assert finish(worker)[0] == 0
    assert status_json(s, job_id)["state"] == "failed"


@pytest.mark.slow
async def test_ctrl_c_on_an_aws_run_cancels_its_job(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    _, s = aws
    job = tmp_path / "slow.py"
    job.write_text(
        "import time\nimport cmr\nclass Slow(cmr.Job):\n    def map(self, k, line):\n"
        "        time.sleep(1)\n        yield line, 1\n"
        "    def reduce(self, k, vs):\n        yield k, sum(vs)\n"
    )
    (tmp_path / "in.txt").write_text("a\n" * 100)
    run = cmr(
        "run", str(job), "--backend", "aws", "--input", str(tmp_path / "in.txt"),
        "--output", str(tmp_path / "out"), "--workers", "1", *names(s),
    )  # fmt: skip
    assert run.stderr is not None
    line = run.stderr.readline()
    assert "submitted job" in line, line
    job_id = line.split()[2]
    await asyncio.sleep(3)  # its worker is busy mapping
    run.send_signal(signal.SIGINT)
    code, _, err = finish(run)
    assert code == 130, err
    assert f"job {job_id} was cancelled" in err and "Traceback" not in err
    doc = status_json(s, job_id)
    assert doc["state"] == "cancelled"
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.slow
async def test_an_s3_output_follows_the_rules_of_a_directory(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, s = aws
    src = tmp_path / "in.txt"
    src.write_text("one two two\n")
    output = f"s3://{s.bucket}/out/rules/"
    first = await run_on(be, "examples/wordcount.py", str(src), output, reducers=2, aws=s)
    _, counts = await read_s3_output(be, output)
    assert counts == {"one": 1, "two": 2}
    assert first.parts == [output + p.name for p in (await read_s3_output(be, output))[0].parts]
    # Not empty: refused without --overwrite, and nothing is touched.
    with pytest.raises(UsageError, match="not empty; remove it or pass --overwrite"):
        await run_on(be, "examples/wordcount.py", str(src), output, reducers=2, aws=s)
    src.write_text("three\n")
    second = await run_on(
        be, "examples/wordcount.py", str(src), output, reducers=1, overwrite=True, aws=s
    )
    manifest, counts = await read_s3_output(be, output)
    assert manifest.job == second.job_id and counts == {"three": 1}
    objects = {b.url for b in await be.blobs.list(output)}
    assert objects == {output + "_SUCCESS", *(output + p.name for p in manifest.parts)}


@pytest.mark.slow
async def test_a_second_job_into_a_busy_s3_output_is_refused(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, s = aws
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    output = f"s3://{s.bucket}/out/busy/"
    detached = await run_on(
        be, "examples/wordcount.py", str(src), output, reducers=1, aws=s, workers=0, detach=True
    )
    with pytest.raises(UsageError, match=f"belongs to job {detached.job_id}, which is still"):
        await run_on(be, "examples/wordcount.py", str(src), output, reducers=1, aws=s)
    # A worker serves the first job; then the place is free again.
    worker = cmr("worker", "--backend", "aws", "--job", detached.job_id, *names(s))
    assert finish(worker)[0] == 0
    await run_on(be, "examples/wordcount.py", str(src), output, reducers=1, aws=s, overwrite=True)


async def test_job_queues_keep_messages_fourteen_days(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """A job waiting days for a fleet must not lose its tasks to the queues' retention."""
    be, s = aws
    await be.queues.create(f"{s.queue_prefix}retention", visibility_s=30)
    sqs = boto3.client("sqs", endpoint_url=LOCALSTACK_URL)
    url = sqs.get_queue_url(QueueName=f"{s.queue_prefix}retention")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod"])
    assert attrs["Attributes"]["MessageRetentionPeriod"] == str(14 * 24 * 3600)
    await be.queues.delete(f"{s.queue_prefix}retention")


@pytest.mark.slow
async def test_a_worker_refuses_a_job_whose_code_is_outside_jobs_from(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """`cmr worker` takes job code only from --jobs-from (default: its current directory): a
    job naming a file elsewhere is refused with the reason, and its code never runs."""
    be, s = aws
    marker = tmp_path / "ran"
    job = tmp_path / "elsewhere.py"
    job.write_text(
        f"import pathlib\nimport cmr\npathlib.Path({str(marker)!r}).touch()\n"
        "class Elsewhere(cmr.Job):\n    def map(self, k, line):\n        yield line, 1\n"
        "    def reduce(self, k, vs):\n        yield k, sum(vs)\n"
    )
    (tmp_path / "in.txt").write_text("a\n")
    detached = await run_on(
        be, str(job), str(tmp_path / "in.txt"), f"s3://{s.bucket}/out/x/", reducers=1, aws=s,
        workers=0, detach=True,
    )  # fmt: skip
    marker.unlink()  # the client imported it to submit: the worker is what is tested
    code, _, err = finish(cmr("worker", "--backend", "aws", "--job", detached.job_id, *names(s)))
    assert code == 1
    assert "not serving it" in err and "--jobs-from" in err and "Traceback" not in err
    assert not marker.exists()
    # Told where the code lives, a worker runs it.
    worker = cmr(
        "worker", "--backend", "aws", "--job", detached.job_id, "--jobs-from", str(tmp_path),
        *names(s),
    )  # fmt: skip
    assert finish(worker)[0] == 0
    assert status_json(s, detached.job_id)["state"] == "succeeded"


def test_a_run_with_worker_processes_ends_when_its_job_does(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """`cmr run --workers 2`: the worker that cleans the job up stops first, and the run
    pokes the other, which stops then, rather than at its next look at the job or when its
    queues answer that they are gone (every such run on the stack ended 5 s late; with the
    workers looking only every 10 minutes, as here, ~30 s late)."""
    _, s = aws
    (tmp_path / "in.txt").write_text("a b b\nc a\n")
    code, _, err = finish(
        cmr(
            "run", str(REPO / "examples" / "wordcount.py"), "--backend", "aws", "--input",
            str(tmp_path / "in.txt"), "--output", str(tmp_path / "out"), "--workers", "2",
            *names(s), env={JOB_REFRESH: "600"},
        ),
        timeout=300,
    )  # fmt: skip
    returned = time.time()
    assert code == 0, err
    job_id = err.split("submitted job ", 1)[1].split()[0]
    late = returned - status_json(s, job_id)["ended"]
    assert late < 15, f"the run returned {late:.0f} s after its job ended: it waited for a worker"
    lines = sorted((tmp_path / "out").glob("part-*"))
    assert sorted(line for p in lines for line in p.read_text().splitlines()) == [
        "a\t2", "b\t2", "c\t1",
    ]  # fmt: skip


def test_what_a_worker_runs_takes_sigusr1_as_it_would_anywhere(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """A `cmr worker` takes SIGUSR1 as a poke; the user's code it runs, in its pool, and any
    program that code starts, keep the signal's default (an ignored signal would have
    stayed ignored in all of them)."""
    _, s = aws
    job = tmp_path / "sig.py"
    job.write_text(
        "import signal, subprocess, sys\nimport cmr\n\n\nclass Sig(cmr.Job):\n"
        "    def map(self, key, line):\n"
        "        yield 'pool', signal.getsignal(signal.SIGUSR1).name\n"
        "        child = [sys.executable, '-c', 'import signal; "
        "print(signal.getsignal(signal.SIGUSR1).name)']\n"
        "        yield 'child', subprocess.check_output(child, text=True).strip()\n\n"
        "    def reduce(self, key, values):\n        yield key, sorted(set(values))[0]\n"
    )
    (tmp_path / "in.txt").write_text("x\n")
    code, _, err = finish(
        cmr(
            "run", str(job), "--backend", "aws", "--input", str(tmp_path / "in.txt"),
            "--output", str(tmp_path / "out"), "--workers", "1", "--reducers", "1", *names(s),
        ),
        timeout=300,
    )  # fmt: skip
    assert code == 0, err
    [part] = (tmp_path / "out").glob("part-*")
    assert part.read_text().splitlines() == ["child\tSIG_DFL", "pool\tSIG_DFL"]
