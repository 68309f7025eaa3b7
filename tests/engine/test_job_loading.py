"""A submission loads its job once per process: the client reads, hashes, imports and checks
the job file once (``cmr.jobload.load_job``) and hands the loaded class to everything that
asks it something (an mrjob job's arguments, the steps and their partitions, the formats,
side files, total order's sampling); each pool process imports it once too. Before, one
`cmr run` went through the loader six times (the CLI, the api twice, submit three times)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner

from cmr import api, job
from cmr.cli import app
from cmr.settings import WorkerSettings

# Total order (sampling asks the class) and a side file (so does gathering them): every
# question a submission asks the class is asked of this job.
JOB = """
import os

import cmr

# {tag}: a file of its own per test (the loader keeps what it loaded, by digest)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports.log"), "a") as f:
    f.write(f"{{os.getpid()}}\\n")  # each import of this module: the process that made it


class Counted(cmr.Job):
    total_order = True
    files = ["stop.txt"]

    def map(self, key, line):
        for word in line.split():
            yield word, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


# `cmr run` and `cmr.run` configure structlog (under CliRunner, onto its stderr): restored
# after each test (tests/engine/conftest.py).
pytestmark = pytest.mark.usefixtures("logs_restored")


@contextlib.contextmanager
def loader_calls() -> Iterator[list[str]]:
    """Every call of ``cmr.job.load_job_class`` in this process, in any thread, while
    inside (its callers' names): told by the function's code object, however a caller
    imported it."""
    code = job.load_job_class.__code__
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            calls.append(frame.f_back.f_code.co_qualname if frame.f_back else "?")

    sys.setprofile(profile)
    threading.setprofile(profile)  # submit gathers side files in a thread
    try:
        yield calls
    finally:
        threading.setprofile(None)
        sys.setprofile(None)


def job_files(tmp_path: Path) -> tuple[Path, Path]:
    """(the job file, its input) in a directory of their own."""
    path = tmp_path / "counted.py"
    path.write_text(JOB.format(tag=uuid.uuid4().hex))
    (tmp_path / "stop.txt").write_text("the\n")
    data = tmp_path / "in.txt"
    data.write_text("a b c\nb c d\nc d e\n" * 50)
    return path, data


def imports(tmp_path: Path) -> Counter[int]:
    """How often each process imported the job module."""
    return Counter(int(line) for line in (tmp_path / "imports.log").read_text().split())


def assert_once_per_process(tmp_path: Path, calls: list[str]) -> None:
    assert calls == ["load_job"], calls  # the client: one load, handed along from there
    by_process = imports(tmp_path)
    assert by_process[os.getpid()] == 1, by_process
    assert len(by_process) > 1, by_process  # the pool processes ran tasks of it ...
    assert set(by_process.values()) == {1}, by_process  # ... each importing it once


def test_cmr_run_loads_the_job_once_per_process(tmp_path: Path) -> None:
    path, data = job_files(tmp_path)
    with loader_calls() as calls:
        result = api.run(
            str(path),
            str(data),
            str(tmp_path / "out"),
            reducers=2,
            worker_settings=WorkerSettings(processes=2, poll_s=0.1),
        )
    assert len(result.parts) == 2
    assert_once_per_process(tmp_path, calls)


def test_cmr_run_command_loads_the_job_once_per_process(tmp_path: Path) -> None:
    path, data = job_files(tmp_path)
    with loader_calls() as calls:
        got = CliRunner().invoke(
            app,
            ["run", str(path), "--input", str(data), "--output", str(tmp_path / "out"),
             "--reducers", "2", "--no-progress"],
        )  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "succeeded" in got.stderr
    assert_once_per_process(tmp_path, calls)
