"""Fenced publication: a reader of an output place sees one job's whole output or nothing new.

Issue 10's reproductions: a publisher paused mid-copy wrote a stale part over a later job's
output; two `cmr run` into one directory both succeeded with a mix of parts; ``--overwrite``
deleted the old output before a job that then failed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.api import open_backend, run_on
from cmr.backends.faults import FaultPlan
from cmr.errors import JobFailed
from cmr.publish import MANIFEST, Manifest
from cmr.runtime import Runtime
from cmr.settings import AwsSettings
from cmr.testing import chaos_run, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.reference import counts_from_parts

WORDCOUNT = "examples/wordcount.py"
REDUCERS = 2


class PauseAt:
    """Pause the first worker that reaches ``step`` for ``seconds`` (a SIGSTOP's model)."""

    def __init__(self, step: str, seconds: float) -> None:
        self.step, self.seconds = step, seconds
        self.paused = asyncio.Event()
        self.woke = asyncio.Event()

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != self.step or self.paused.is_set():
            return
        self.paused.set()
        try:
            await rt.pause(self.seconds)
        finally:
            self.woke.set()


def corpus(root: Path, word: str) -> Path:
    root.mkdir(parents=True)
    for i in range(6):
        (root / f"f{i}.txt").write_text(f"{word} {word}{i} common\n" * 200)
    return root


@pytest.mark.parametrize("step", ["publish.marked", "publish.copied"])
@in_virtual_time
async def test_a_paused_publisher_never_overwrites_a_later_jobs_output(
    step: str, pool: Executor, tmp_path: Path
) -> None:
    a, b = corpus(tmp_path / "a", "apple"), corpus(tmp_path / "b", "banana")
    out = tmp_path / "out"
    pause = PauseAt(step, seconds=12)
    # Job A: the first of its two workers to publish freezes; the other finishes the job.
    job_a = asyncio.create_task(
        chaos_run(
            WORDCOUNT,
            a,
            out,
            seed=1,
            pool=pool,
            plan=FaultPlan(seed=1),
            hooks=[pause, pause],
            workers=2,
            reducers=REDUCERS,
            split_bytes=4096,
            clientless=True,
        )
    )
    await asyncio.wait_for(pause.paused.wait(), 60)
    for _ in range(1200):  # A's other worker publishes it: a file to poll, no event
        if (out / MANIFEST).exists():
            break
        await asyncio.sleep(0.05)
    # Job B replaces A's output while A's publisher is still frozen.
    job_b = await chaos_run(
        WORDCOUNT,
        b,
        out,
        seed=2,
        pool=pool,
        plan=FaultPlan(seed=2),
        hooks=[None],
        workers=1,
        reducers=REDUCERS,
        split_bytes=4096,
        clientless=True,
        job_options={"overwrite": True},
    )
    assert not pause.woke.is_set(), "the publisher woke too early for this test to mean much"
    assert job_b.record["state"] == "succeeded"
    # A's publisher wakes and finishes what it was doing; then A's last worker stops.
    result_a = await asyncio.wait_for(job_a, 120)
    assert pause.woke.is_set()
    assert result_a.record["state"] == "succeeded"
    assert result_a.leftovers == [] and job_b.leftovers == []
    # The output is B's, whole: A's late publisher wrote nothing over it.
    manifest = Manifest.from_bytes((out / MANIFEST).read_bytes())
    assert manifest.job == job_b.job_id
    assert read_output(out, REDUCERS) == sequential(WORDCOUNT, b, REDUCERS)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, *(p.name for p in manifest.parts)]
    )


def cmr_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "cmr", "run", *args]


SLOW_JOB = """
import time
import cmr

class Slow(cmr.Job):
    def map(self, key, line):
        time.sleep(0.2)
        for word in line.split():
            yield word, 1

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


def test_two_runs_into_one_output_have_one_winner(tmp_path: Path) -> None:
    """Two `cmr run` processes (each with its own embedded backend) into one directory:
    exactly one succeeds; the other fails saying so; the directory holds the winner's
    output and nothing of the loser's."""
    job = tmp_path / "slow.py"
    job.write_text(SLOW_JOB)
    inputs = [tmp_path / "x.txt", tmp_path / "y.txt"]
    inputs[0].write_text("x1 x2\n" * 6)
    inputs[1].write_text("y1 y2\n" * 6)
    out = tmp_path / "out"
    runs = [
        subprocess.Popen(
            cmr_run(str(job), "--input", str(i), "--output", str(out), "--reducers", "2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in inputs
    ]
    results = [r.communicate(timeout=120) for r in runs]
    codes = [r.returncode for r in runs]
    assert sorted(codes) == [0, 1], results
    winner = codes.index(0)
    _, loser_err = results[1 - winner]
    assert "output" in loser_err and ("published by job" in loser_err or "not empty" in loser_err)
    assert "Traceback" not in loser_err
    expected = {"x1": 6, "x2": 6} if winner == 0 else {"y1": 6, "y2": 6}
    assert counts_from_parts(out, 2) == expected  # the winner's parts, and nothing else


@in_virtual_time
async def test_overwrite_keeps_the_old_output_when_the_new_job_fails(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("keep me\n")
    out = tmp_path / "out"
    async with open_backend("embedded", AwsSettings()) as be:
        await run_on(be, WORDCOUNT, str(src), str(out), reducers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    job = tmp_path / "boom.py"
    job.write_text(
        "import cmr\nclass Boom(cmr.Job):\n    def map(self, k, line):\n        yield line, 1\n"
        "    def reduce(self, k, vs):\n        raise RuntimeError('no')\n        yield\n"
    )
    async with open_backend("embedded", AwsSettings()) as be:
        with pytest.raises(JobFailed, match="RuntimeError: no"):
            await run_on(
                be, str(job), str(src), str(out), reducers=1, overwrite=True, visibility_timeout=2
            )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert counts_from_parts(out, 1) == {"keep": 1, "me": 1}


def test_ctrl_c_cancels_the_job_and_leaves_nothing(tmp_path: Path) -> None:
    """Ctrl-C on `cmr run`: the job is cancelled, the command says so and exits 130, no
    traceback, no leaked semaphores, no temporary directories, no partial output."""
    job = tmp_path / "slow.py"
    job.write_text(SLOW_JOB)
    src = tmp_path / "in.txt"
    src.write_text("a b\n" * 200)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = subprocess.Popen(
        cmr_run(str(job), "--input", str(src), "--output", str(tmp_path / "out")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert run.stderr is not None
    first = run.stderr.readline()  # "submitted job ..."
    assert "submitted job" in first, first
    run.send_signal(2)  # SIGINT, as Ctrl-C sends it
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "cancelled" in err
    assert "Traceback" not in err and "leaked" not in err, err
    assert list(tmp.iterdir()) == []
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_detach_needs_a_backend_that_outlives_the_process(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    run = subprocess.run(
        cmr_run(WORDCOUNT, "--input", str(src), "--output", str(tmp_path / "out"), "--detach"),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "--detach needs a backend that outlives this process" in run.stderr
