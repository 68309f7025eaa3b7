"""Whole jobs on the AWS backend against the local stack (LocalStack S3/SQS + DynamoDB
Local), with real `cmr worker` processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cmr import lifecycle
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobFailed, WorkersGone
from cmr.lifecycle import load_spec
from cmr.records import JobState
from cmr.settings import AwsSettings
from cmr.testing import task_records
from tests.stack import remove_test_resources

from .corpus import edge_cases, small_files
from .reference import counts_from_parts, inverted_index, word_count

pytestmark = pytest.mark.usefixtures("aws_stack")


async def assert_cleaned(be: Backend, settings: AwsSettings, job_id: str) -> None:
    assert await be.queues.list(settings.queue_prefix) == []
    assert await be.blobs.list(f"{be.scratch}/jobs/{job_id}/") == []
    assert await task_records(be, job_id) == ["job"]


@pytest.mark.slow
async def test_wordcount_with_three_worker_processes(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        be,
        "examples/wordcount.py",
        str(data),
        str(tmp_path / "out"),
        reducers=3,
        workers=3,
        visibility_timeout=10,
        aws=settings,
        split_bytes=2048,
    )
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)
    assert result.record["maps"] > 3
    assert result.calls["sqs.SendMessageBatch"] > 0
    await assert_cleaned(be, settings, result.job_id)
    assert await be.blobs.list(f"{be.scratch}/results/{result.job_id}/") == []


async def test_s3_input_and_output(aws: tuple[Backend, AwsSettings], tmp_path: Path) -> None:
    be, settings = aws
    data = edge_cases(tmp_path / "in")
    root = f"s3://{settings.bucket}/datasets/docs/"
    for p in data.rglob("*"):
        if p.is_file():
            await be.blobs.upload_file(str(p), root + p.relative_to(data).as_posix())
    out = f"s3://{settings.bucket}/results/index/"
    result = await run_on(
        be,
        "examples/invertedindex.py",
        root.rstrip("/"),
        out,
        reducers=2,
        workers=2,
        visibility_timeout=10,
        aws=settings,
    )
    got: dict[str, list[str]] = {}
    assert [url.rsplit("/", 1)[1][:10] for url in result.parts] == ["part-00000", "part-00001"]
    for url in result.parts:
        text = (await be.blobs.get(url)).decode()
        for line in text.splitlines():
            word, _, docs = line.rpartition("\t")
            got[word] = json.loads(docs)
    assert got == inverted_index(data)
    await assert_cleaned(be, settings, result.job_id)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cmr", *args],
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
async def test_external_fleet_serves_a_submitted_job_and_exits_when_idle(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = edge_cases(tmp_path / "in")
    names = [
        "--bucket",
        settings.bucket,
        "--table",
        settings.table,
        "--queue-prefix",
        settings.queue_prefix,
    ]
    fleet = [_cli("worker", "--backend", "aws", "--idle-exit", "4", *names) for _ in range(2)]
    try:
        result = await run_on(
            be,
            "examples/wordcount.py",
            str(data),
            str(tmp_path / "out"),
            reducers=2,
            workers=0,
            visibility_timeout=10,
            aws=settings,
        )
        assert counts_from_parts(tmp_path / "out", 2) == word_count(data)
        for w in fleet:  # both leave on their own once idle
            _, err = await asyncio.to_thread(w.communicate, timeout=60)
            assert w.returncode == 0, err
    finally:
        for w in fleet:
            if w.poll() is None:
                w.kill()
                w.communicate()
    await assert_cleaned(be, settings, result.job_id)


@pytest.mark.slow
async def test_failing_map_fails_the_job_and_cleans_up(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    job = tmp_path / "boom.py"
    job.write_text(
        "import cmr\nclass Boom(cmr.Job):\n    def map(self, k, line):\n"
        "        raise RuntimeError('no thanks')\n        yield\n"
        "    def reduce(self, k, vs):\n        yield k, 0\n"
    )
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    with pytest.raises(JobFailed, match="RuntimeError: no thanks") as info:
        await run_on(
            be,
            str(job),
            str(src),
            str(tmp_path / "out"),
            reducers=2,
            workers=1,
            visibility_timeout=10,
            aws=settings,
        )
    await assert_cleaned(be, settings, info.value.job_id)


def test_cli_reports_missing_credentials_without_a_traceback(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    (tmp_path / "in.txt").write_text("x\n")
    proc = _cli(
        "run",
        "examples/wordcount.py",
        "--backend",
        "aws",
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out"),
        env=env,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "credentials" in err.lower()
    assert "Traceback" not in err + out


def test_cli_reports_an_endpoint_that_is_down(aws_stack: dict[str, str], tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9",
    }
    (tmp_path / "in.txt").write_text("x\n")
    proc = _cli(
        "run",
        "examples/wordcount.py",
        "--backend",
        "aws",
        "--input",
        str(tmp_path / "in.txt"),
        "--output",
        str(tmp_path / "out"),
        env=env,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "127.0.0.1:9" in err and "stack.sh start" in err
    assert "Traceback" not in err + out


@pytest.mark.slow
def test_cmr_status_shows_a_failed_jobs_traceback_and_counters(
    aws_stack: dict[str, str], tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    names = [
        "--bucket",
        f"cmr-st-{tag}",
        "--table",
        f"cmr-st-{tag}",
        "--queue-prefix",
        f"cmrs-{tag}-",
    ]
    job = tmp_path / "poison.py"
    job.write_text(
        "import cmr\nclass Poison(cmr.Job):\n    def map(self, k, line):\n"
        "        raise KeyError('missing field ' + line)\n        yield\n"
        "    def reduce(self, k, vs):\n        yield k, 0\n"
    )
    (tmp_path / "in.txt").write_text("id42\n")
    try:
        run = _cli(
            "run",
            str(job),
            "--backend",
            "aws",
            "--input",
            str(tmp_path / "in.txt"),
            "--output",
            str(tmp_path / "out"),
            "--visibility-timeout",
            "5",
            "--max-task-attempts",
            "3",
            *names,
        )
        _, err = run.communicate(timeout=120)
        assert run.returncode == 1
        assert "KeyError: 'missing field id42'" in err and "Traceback" in err
        job_id = next(w for w in err.split() if w.count("-") == 2 and w[:8].isdigit())
        status = _cli("status", job_id, *names)
        out, _ = status.communicate(timeout=60)
        assert status.returncode == 0
        assert "failed" in out and "map task 0 failed 3 times" in out
        assert "KeyError: 'missing field id42'" in out
        assert "tasks_retried" in out
        listing = _cli("status", *names)
        out, _ = listing.communicate(timeout=60)
        assert job_id[:12] in out
    finally:
        remove_test_resources(f"cmr-st-{tag}", f"cmr-st-{tag}", f"cmrs-{tag}-")


@pytest.mark.slow
async def test_many_small_files_and_more_reducers_than_keys(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = small_files(tmp_path / "in", 120)
    (data / "empty.txt").write_bytes(b"")
    result = await run_on(
        be,
        "examples/wordcount.py",
        str(data),
        str(tmp_path / "out"),
        reducers=60,
        workers=2,
        visibility_timeout=10,
        aws=settings,
    )
    counts = counts_from_parts(tmp_path / "out", 60)
    assert counts == word_count(data)
    assert len(counts) < 60  # more reducers than distinct words: some parts are empty
    assert result.record["maps"] <= 2  # 120 small files are packed into few tasks
    await assert_cleaned(be, settings, result.job_id)


@pytest.mark.slow
async def test_client_reports_when_all_its_worker_processes_are_gone(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    job = tmp_path / "exits.py"
    job.write_text(
        "import os\nimport cmr\nclass Exits(cmr.Job):\n    def map(self, k, line):\n"
        "        os._exit(3)\n        yield\n    def reduce(self, k, vs):\n"
        "        yield k, 0\n"
    )
    src = tmp_path / "in.txt"
    src.write_text("x\n")
    with pytest.raises(WorkersGone, match="all 1 worker processes exited") as info:
        await run_on(
            be,
            str(job),
            str(src),
            str(tmp_path / "out"),
            reducers=1,
            workers=1,
            visibility_timeout=10,
            aws=settings,
        )
    assert "cmr cleanup" in str(info.value)
    # As the message says: nobody serves the job any more; remove it.
    spec, _ = await load_spec(be, info.value.args[0].split("job ")[1].split()[0])
    await lifecycle.end(be, spec, JobState.CANCELLED, reason="cancelled by the test")
    await lifecycle.cleanup(be, spec, JobState.CANCELLED)
