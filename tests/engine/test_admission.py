"""Whoever can write one item to the table must not decide what a worker imports or where
it writes (issue 12, item 4): job records are validated as untrusted input, and a worker
serves only jobs whose code, scratch and output lie where it was told to take them."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

from cmr import submit, watch
from cmr.admission import Admission
from cmr.api import job_ref
from cmr.backends.base import Backend, Update
from cmr.errors import JobCodeError, UsageError, WireError
from cmr.job import JobRef, load_job_class, module_source
from cmr.lifecycle import record_submit
from cmr.pool import cpu_pool
from cmr.records import JobSpec, job_pk, new_job_id, reduce_sk
from cmr.settings import WorkerSettings
from cmr.submit import JobOptions
from cmr.worker import Worker

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = str(REPO / "examples" / "wordcount.py")

MARKER_JOB = """
import pathlib
import cmr
pathlib.Path({marker!r}).write_text("imported")

class Evil(cmr.Job):
    def map(self, key, line):
        yield line, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


def _spec(**changes: Any) -> JobSpec:
    base = JobSpec(
        new_job_id(),
        JobRef(WORDCOUNT, "0" * 64),
        {},
        3,
        2,
        "s3://cmr-data/out/",
        "s3://cmr-data/cmr/",
        "cmr-",
        60,
        3,
        plan_digest="1" * 64,
        input_root="s3://cmr-data/in/",
    )
    return dataclasses.replace(base, **changes)


# --- the record itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partitions", 10**9),  # every worker would allocate a billion queue names
        ("partitions", 0),
        ("maps", -1),
        ("maps", 10**12),
        ("maps", True),
        ("visibility_s", float("inf")),
        ("visibility_s", "60"),
        ("max_task_attempts", 10**9),
        ("digest", "not-a-sha"),
        ("plan_digest", "../../etc"),
        ("output", "http://evil.example/"),
        ("output", "s3://cmr-data/out/../../other/"),
        ("scratch", "s3://cmr-data/\x00"),
        ("queue_prefix", "cmr-;rm -rf"),
        ("params", {"k" * 70_000: "v"}),
        ("params", {str(i): "v" for i in range(1_000)}),
        ("params", ["not", "a", "map"]),
        ("job", "x" * 5_000),
        ("input_root", "ftp://elsewhere/"),
        ("input_root", None),
    ],
)
def test_a_hostile_job_record_is_refused_field_by_field(field: str, value: Any) -> None:
    item = _spec().to_item()
    item[field] = value
    with pytest.raises(WireError, match=f"field {field!r}|params|digest|queue_prefix"):
        JobSpec.from_item(_spec().job_id, item)


def test_a_valid_record_reads_back_as_written() -> None:
    spec = _spec(params={"a": "1"}, task_timeout_s=30, replaces="etag-1")
    assert JobSpec.from_item(spec.job_id, spec.to_item()) == spec


def test_a_record_under_a_foreign_job_id_is_refused() -> None:
    with pytest.raises(WireError, match="not a job id"):
        JobSpec.from_item("../../x", _spec().to_item())


# --- job code: nothing imported before the checks ---------------------------------------


def _package_with_marker(root: Path, marker: Path) -> None:
    pkg = root / "evilpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    (pkg / "job.py").write_text(MARKER_JOB.format(marker=str(marker) + ".job"))


def test_finding_a_dotted_module_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``importlib.util.find_spec("a.b")`` runs ``a/__init__.py``: the old resolver imported a
    package named by the table before comparing any digest."""
    marker = tmp_path / "imported"
    _package_with_marker(tmp_path, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_source("evilpkg.job") == tmp_path / "evilpkg" / "job.py"
    with pytest.raises(JobCodeError, match="differs"):
        load_job_class(JobRef("evilpkg.job", "0" * 64))
    assert not marker.exists()
    assert "evilpkg" not in sys.modules


def test_jobs_from_allows_directories_and_modules_only(tmp_path: Path) -> None:
    allowed = tmp_path / "jobs"
    allowed.mkdir()
    (allowed / "ok.py").write_text("")
    outside = tmp_path / "outside.py"
    outside.write_text("")
    (allowed / "link.py").symlink_to(outside)  # a link inside that leads out
    adm = Admission.of([str(allowed), "examples_pkg.sub"], [], "s3://b/cmr")
    assert adm.code_refusal(JobRef(str(allowed / "ok.py"), "")) is None
    assert adm.code_refusal(JobRef(str(allowed / "ok.py") + ":Job", "")) is None
    assert "--jobs-from" in (adm.code_refusal(JobRef(str(outside), "")) or "")
    assert "--jobs-from" in (adm.code_refusal(JobRef(str(allowed / "link.py"), "")) or "")
    # A module inside an allowed package is allowed by name; a sibling with a shared prefix
    # is not.
    assert adm.code_refusal(JobRef("examples_pkg.sub.wc", "")) is None
    assert adm.code_refusal(JobRef("examples_pkg.subway", "")) is not None
    assert adm.code_refusal(JobRef("json.decoder", "")) is not None
    with pytest.raises(UsageError, match="neither a directory nor a module"):
        Admission.of(["/no/such/dir"], [], "s3://b/cmr")
    # A __main__ module runs when imported, whoever allowed its package.
    assert "__main__" in (Admission.of(["cmr"], [], "s3://b/c").code_refusal(
        JobRef("cmr.__main__", "")) or "")  # fmt: skip


def test_a_module_name_is_never_taken_for_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fleet the worker's cwd is its spool, which it writes: a module name that happens
    to name a directory there must not allow that directory's files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fleetjobs").mkdir()
    (tmp_path / "fleetjobs" / "planted.py").write_text("")
    adm = Admission.of(["fleetjobs"], [], "s3://b/cmr")
    assert adm.modules == ("fleetjobs",) and adm.directories == ()
    assert adm.code_refusal(JobRef(str(tmp_path / "fleetjobs" / "planted.py"), "")) is not None
    assert Admission.of(["./fleetjobs"], [], "s3://b/cmr").directories == (tmp_path / "fleetjobs",)


def test_outputs_and_scratch_are_confined() -> None:
    adm = Admission.of([str(REPO / "examples")], [], "s3://cmr-data/cmr/")
    ok = _spec(output="s3://cmr-data/out/", scratch="s3://cmr-data/cmr/")
    assert adm.refusal(ok) is None
    assert "outside" in (adm.refusal(_spec(output="s3://victim-bucket/x/")) or "")
    assert "scratch" in (adm.refusal(_spec(scratch="s3://cmr-data/other/")) or "")
    narrow = Admission.of([str(REPO / "examples")], ["s3://cmr-data/out"], "s3://cmr-data/cmr")
    assert narrow.refusal(ok) is None
    assert narrow.refusal(_spec(output="s3://cmr-data/out2/")) is not None
    assert narrow.refusal(_spec(output="s3://cmr-data/cmr/")) is not None


# --- end to end: a worker serving every job meets a forged one ---------------------------


async def _wordcount(be: Backend, source: Path, out: Path, **options: Any) -> JobSpec:
    """Submit word count and start no worker: each test serves it its own way."""
    return await submit.submit(
        be,
        job_ref(WORDCOUNT),
        str(source),
        str(out),
        JobOptions(**options),
        queue_prefix="cmr-",
        parallelism=1,
    )


async def _serve_alone(be: Backend, spec: JobSpec, **settings: Any) -> None:
    """One worker serving only ``spec``, taking code from the checkout, until it stops."""
    ws = WorkerSettings(processes=1, poll_s=0.1, jobs_from=(str(REPO),), **settings)
    with cpu_pool(1) as pool:
        await asyncio.wait_for(Worker(be, ws, pool, only_job=spec.job_id).run(), 120)


async def test_a_worker_never_imports_a_forged_jobs_code(embedded: Backend, tmp_path: Path) -> None:
    """A record written straight into the table names code outside --jobs-from, with a
    matching digest: the worker refuses it without importing it, and serves the real job."""
    (tmp_path / "in.txt").write_text("a b\nb\n")
    real = await _wordcount(embedded, tmp_path / "in.txt", tmp_path / "out", partitions=2)
    marker = tmp_path / "evil-ran"
    evil = tmp_path / "evil.py"
    evil.write_text(MARKER_JOB.format(marker=str(marker)))
    forged = dataclasses.replace(
        real,
        job_id=new_job_id(),
        ref=JobRef(str(evil), hashlib.sha256(evil.read_bytes()).hexdigest()),
        output=f"file://{tmp_path}/forged-out/",
    )
    await record_submit(embedded, forged, {})
    ws = WorkerSettings(processes=1, poll_s=0.1, jobs_from=(str(REPO / "examples"),))
    with cpu_pool(1) as pool:
        worker = Worker(embedded, ws, pool)
        run = asyncio.create_task(worker.run())
        try:
            record = await asyncio.wait_for(watch.wait(embedded, real, poll_s=0.1), 120)
        finally:
            worker.done.set()
            await run
    assert record["state"] == "succeeded"
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert not marker.exists()
    assert forged.job_id in worker._refused
    job = await embedded.table.get(job_pk(forged.job_id), "job")
    assert job is not None and job["state"] == "running"  # refused, not failed: not ours


async def test_forged_commit_records_fail_the_job_instead_of_publishing(
    embedded: Backend, tmp_path: Path
) -> None:
    """A commit record that names another object (here: another file the worker can read)
    would have been copied into the output; the finalizer fails the job with the reason."""
    secret = tmp_path / "secret.txt"
    secret.write_text("do not publish\n")
    (tmp_path / "in.txt").write_text("a\n")
    spec = await _wordcount(embedded, tmp_path / "in.txt", tmp_path / "out", partitions=1)
    await embedded.table.update(
        Update(
            job_pk(spec.job_id),
            reduce_sk(0),
            set_={
                "state": "committed",
                "output": f"file://{secret}",
                "records": 1,
                "bytes": secret.stat().st_size,
            },
        )
    )
    await _serve_alone(embedded, spec, janitor_s=0.2)
    job = await embedded.table.get(job_pk(spec.job_id), "job")
    assert job is not None and job["state"] == "failed"
    assert "not one of the job's own reduce outputs" in str(job["error"])
    out = tmp_path / "out"
    assert not any("do not publish" in p.read_text() for p in out.glob("part-*"))
    assert not (out / "_SUCCESS").exists()


# --- the plan: every range under the job's recorded input --------------------------------


@pytest.mark.parametrize(
    ("root", "url", "owned"),
    [
        ("s3://b/in/", "s3://b/in/x/part-1", True),
        ("s3://b/in/", "s3://b/in2/x", False),
        ("s3://b/in/", "s3://other/in/x", False),
        ("s3://b/in/one.txt", "s3://b/in/one.txt", True),
        ("s3://b/in/one.txt", "s3://b/in/one.txt2", False),
        ("file:///data/in/", "file:///data/in/a/b.txt", True),
        ("file:///data/in/", "file:///data/in/../secret", False),
        ("file:///data/in/", "file:///data/in/%2e%2e/secret", False),
        ("file:///data/in/", "file:///data/in2/x", False),
        ("file:///data/in/", "s3://b/data/in/x", False),
        ("", "s3://b/in/x", False),
    ],
)
def test_a_range_is_the_jobs_only_under_its_recorded_input(
    root: str, url: str, owned: bool
) -> None:
    assert _spec(input_root=root).owns_input(url) is owned


async def test_a_plan_naming_data_outside_the_input_fails_the_job(
    embedded: Backend, tmp_path: Path
) -> None:
    """Someone who can write the scratch and the table swaps in a plan (and its digest) that
    reads another file: the task refuses it, and the job fails with the reason instead of
    publishing that file's words."""
    from cmr.lifecycle import job_scratch
    from cmr.plan import Plan, plan_url
    from cmr.wire import Range

    secret = tmp_path / "secret.txt"
    secret.write_text("topsecret\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a\n")
    spec = await _wordcount(
        embedded, tmp_path / "in", tmp_path / "out", partitions=1, max_task_failures=1
    )
    assert spec.input_root == f"file://{tmp_path}/in/"
    forged = Plan(((Range(f"file://{tmp_path}/in/../secret.txt", 0, 10, "a.txt"),),))
    data = forged.to_bytes()
    await embedded.blobs.put(plan_url(job_scratch(spec.scratch, spec.job_id)), data)
    await embedded.table.update(
        Update(job_pk(spec.job_id), "job", set_={"plan_digest": Plan.digest(data)})
    )
    await _serve_alone(embedded, spec)
    job = await embedded.table.get(job_pk(spec.job_id), "job")
    assert job is not None and job["state"] == "failed"
    assert "outside its input" in str(job["error"])
    assert not (tmp_path / "out" / "_SUCCESS").exists()
