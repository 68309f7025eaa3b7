"""Side files (``Job.files``, ``--file PATH[#NAME]``): checked at submit (one error line
naming the file), staged once, fetched once per worker and verified (a file changed after
submit fails the job, naming it), read through ``self.file(name)`` in setup and in map, on
the embedded backend and on the local stack, and deleted with the job."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr import api, sidefiles
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import UsageError, WireError
from cmr.records import JobSpec
from cmr.settings import AwsSettings
from cmr.testing import chaos_run
from cmr.virtualtime import in_virtual_time

ROOT = Path(__file__).resolve().parents[2]

# Reads stop words in setup (its class's file) and a lookup table in map (given by --file).
JOB = """\
import cmr

class Tagged(cmr.Job):
    files = ["data/stop.txt"]
    reducers = 2

    def setup(self):
        with open(self.file("stop.txt")) as f:
            self.stop = set(f.read().split())

    def map(self, key, line):
        with open(self.file("colours")) as f:
            colours = dict(row.split("=") for row in f.read().split())
        for word in line.split():
            if word not in self.stop:
                yield colours.get(word, "other"), 1

    def reduce(self, key, values):
        yield key, sum(values)
"""
EXPECTED = {"red": 3, "blue": 1, "other": 2}


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    """The job file, its class's side file next to it, a --file side file elsewhere, input."""
    (tmp_path / "code" / "data").mkdir(parents=True)
    (tmp_path / "code" / "job.py").write_text(JOB)
    (tmp_path / "code" / "data" / "stop.txt").write_text("the a\n")
    (tmp_path / "colours.txt").write_text("apple=red\ncherry=red\nsky=blue\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.txt").write_text("the apple\na cherry sky\napple grass sea\n")
    return {
        "job": tmp_path / "code" / "job.py",
        "colours": tmp_path / "colours.txt",
        "in": tmp_path / "in",
        "out": tmp_path / "out",
    }


def counts(out: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for part in sorted(out.glob("part-*")):
        for line in part.read_text().splitlines():
            key, n = line.split("\t")
            found[key] = int(n)
    return found


async def test_files_read_in_setup_and_map_embedded(job: dict[str, Path]) -> None:
    async with api.open_backend("embedded", AwsSettings()) as be:
        result = await api.run_on(
            be, str(job["job"]), str(job["in"]), str(job["out"]),
            files=[f"{job['colours']}#colours"], workers=2, split_bytes=16,
        )  # fmt: skip
        assert counts(job["out"]) == EXPECTED
        assert result.record["maps"] > 1  # several tasks read the same files
        # Deleted with the job, as its scratch is.
        assert await be.blobs.list(sidefiles.side_files_url(be.scratch, result.job_id)) == []


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_files_read_in_setup_and_map_on_the_local_stack(
    aws: tuple[Backend, AwsSettings], job: dict[str, Path]
) -> None:
    be, settings = aws
    result = await api.run_on(
        be, str(job["job"]), str(job["in"]), str(job["out"]),
        files=[f"{job['colours']}#colours"], workers=2, aws=settings, split_bytes=16,
        visibility_timeout=10,
    )  # fmt: skip
    assert counts(job["out"]) == EXPECTED
    assert await be.blobs.list(sidefiles.side_files_url(be.scratch, result.job_id)) == []


@pytest.mark.slow
def test_cli_file_with_a_name(job: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cmr", "run", str(job["job"]), "--input", str(job["in"]),
         "--output", str(job["out"]), "--file", f"{job['colours']}#colours"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert counts(job["out"]) == EXPECTED


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["{tmp}/nope.txt"], "side file {tmp}/nope.txt (--file) does not exist"),
        (["{tmp}/in"], "side file {tmp}/in (--file) is a directory"),
        (["{tmp}/colours.txt#stop.txt"], "two side files are named 'stop.txt'"),
        (["{tmp}/colours.txt#a/b"], "its name 'a/b' is not a plain file name"),
        (["{tmp}/colours.txt#.."], "its name '..' is not a plain file name"),
        (["{tmp}/colours.txt#x", "{tmp}/colours.txt#x"], "two side files are named 'x'"),
    ],
)
def test_bad_side_files_are_refused_at_submit_in_one_line(
    job: dict[str, Path], files: list[str], message: str
) -> None:
    tmp = str(job["in"].parent)
    with pytest.raises(UsageError) as caught:
        api.run(
            str(job["job"]), str(job["in"]), str(job["out"]),
            files=[f.format(tmp=tmp) for f in files],
        )  # fmt: skip
    text = str(caught.value)
    assert message.format(tmp=tmp) in text
    assert "\n" not in text
    assert not job["out"].exists()  # refused before anything was made


def test_a_class_file_that_is_missing_is_named(job: dict[str, Path]) -> None:
    (job["job"].parent / "data" / "stop.txt").unlink()
    with pytest.raises(UsageError, match=r"data/stop.txt \(Tagged.files\) does not exist"):
        api.run(str(job["job"]), str(job["in"]), str(job["out"]), files=[str(job["colours"])])


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with api.cpu_pool(2) as p:
        yield p


class CountingBlobs:
    """The blob store, counting downloads of side files."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.downloads: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        # A side file is fetched in ranged reads (never more than its size): its first.
        if "/files/" in url and start == 0:
            self.downloads[url.rsplit("/", 1)[1]] += 1
        data: bytes = await self.inner.get_range(url, start, end)
        return data


@pytest.mark.parametrize("tamper", ["other size", "same size"])
@in_virtual_time
async def test_a_file_changed_after_submit_fails_the_job_naming_it(
    job: dict[str, Path], pool: Executor, tamper: str
) -> None:
    async def change(be: Backend, spec: JobSpec) -> None:
        [stop] = [f for f in spec.files if f.name == "stop.txt"]
        await be.blobs.put(stop.url, b"x\n" if tamper == "other size" else b"xyz a\n")

    result = await chaos_run(
        str(job["job"]), job["in"], job["out"], seed=1, pool=pool, plan=FaultPlan(seed=1),
        hooks=[None], workers=1, reducers=2, clientless=True,
        job_options={"files": (f"{job['colours']}#colours",)}, after_submit=change,
    )  # fmt: skip
    assert result.record["state"] == "failed"
    error = result.record["error"]
    assert "side file stop.txt" in error and "changed after submit" in error, error
    assert result.leftovers == []


@in_virtual_time
async def test_each_worker_fetches_a_jobs_files_once(job: dict[str, Path], pool: Executor) -> None:
    counted: list[CountingBlobs] = []

    def wrap(be: Backend) -> Backend:
        blobs = CountingBlobs(be.blobs)
        counted.append(blobs)
        return Backend(be.name, be.queues, blobs, be.table, be.scratch, local_blobs=be.local_blobs)

    result = await chaos_run(
        str(job["job"]), job["in"], job["out"], seed=1, pool=pool, plan=FaultPlan(seed=1),
        hooks=[None], workers=1, reducers=2, split_bytes=16, wrap=wrap,
        job_options={"files": (f"{job['colours']}#colours",)},
    )  # fmt: skip
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert counts(job["out"]) == EXPECTED
    assert result.record["maps"] > 2  # tasks ran concurrently (two map slots), and in turn
    assert counted[0].downloads == {"stop.txt": 1, "colours": 1}


def _files_item(rows: Any) -> dict[str, Any]:
    return {
        "job": "x.py", "digest": "0" * 64, "params": {}, "maps": 1, "partitions": 1,
        "output": "file:///o/", "scratch": "file:///s", "queue_prefix": "cmr-",
        "visibility_s": 60, "max_task_failures": 3, "input_root": "file:///i", "files": rows,
    }  # fmt: skip


JOB_ID = "20260101-000000-0123456789abcdef"
OWN = f"file:///s/files/{JOB_ID}/"
SHA = "a" * 64


def test_the_records_files_are_read_back() -> None:
    spec = JobSpec.from_item(JOB_ID, _files_item([["stop.txt", OWN + "stop.txt", SHA, 6]]))
    assert spec.files == (sidefiles.SideFile("stop.txt", OWN + "stop.txt", SHA, 6),)
    assert JobSpec.from_item(JOB_ID, spec.to_item()).files == spec.files


@pytest.mark.parametrize(
    "rows",
    [
        "stop.txt",  # not a list
        [["stop.txt", OWN + "stop.txt", SHA]],  # three fields
        [["stop.txt", "file:///etc/passwd", SHA, 6]],  # not this job's
        [["stop.txt", "file:///s/files/20260101-000000-fedcba9876543210/stop.txt", SHA, 6]],
        [["../x", OWN + "../x", SHA, 6]],  # not a plain name
        [["a/b", OWN + "a/b", SHA, 6]],
        [["stop.txt", OWN + "stop.txt", "A" * 64, 6]],  # no sha256
        [["stop.txt", OWN + "stop.txt", SHA, -1]],  # no size
        [["stop.txt", OWN + "stop.txt", SHA, 2**31]],  # past 1 GiB
        [["s", OWN + "s", SHA, 1], ["s", OWN + "s", SHA, 1]],  # twice
        [[f"f{i}", OWN + f"f{i}", SHA, 1] for i in range(101)],  # too many
    ],
)
def test_forged_side_files_in_a_job_record_are_refused(rows: Any) -> None:
    with pytest.raises(WireError, match="field 'files'"):
        JobSpec.from_item(JOB_ID, _files_item(rows))
