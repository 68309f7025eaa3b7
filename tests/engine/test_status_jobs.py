"""`cmr run --detach`, `status` and `wait` as a user meets them: a job nothing serves is
said to be unserved (with the command that serves it) rather than waited on in silence;
status shows when a job (a pipeline: its whole run) started, ended and how long it took; and
each recent job is looked up in the store it was submitted to, whatever ran since."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cmr.cli import laststore
from cmr.settings import BackendName, Store
from tests.engine.test_status_cli import ROOT, cmr, state_home
from tests.stack import remove_test_resources

TOPWORDS = "examples/topwords.py"  # two steps: a pipeline
WAIT_S = 12  # longer than cmr.cli.jobs.HINT_GRACE_S: a job this old is said to be unserved
# How cmr.cli.jobs says a duration: "4.2 s", or "1 min 2 s" on a slow machine
DURATION = r"(?:\d+ h )?(?:\d+ min )?[\d.]+ s"


# Each test remembers its runs in its own state directory (autouse, shared).
__all__ = ["state_home"]


def job_of(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.split("submitted job ", 1)[1].split()[0]


# -- each recent job's store, remembered ------------------------------------------------------


def _job(n: int) -> str:
    return f"20260101-000000-{n:016x}"


def test_each_recent_job_is_looked_up_in_its_own_store(state_home: Path) -> None:
    a = Store.parse("aws://bucket-a/table-a?prefix=a-")
    b = Store.parse("aws://bucket-b/table-b?prefix=b-&region=eu-west-1")
    laststore.remember(a, _job(1), "out/one")
    laststore.remember(b, _job(2), "s3://bucket-b/two/")
    laststore.remember(Store(BackendName.embedded), _job(3), "out/three")
    got = [laststore.recall_job(_job(n)) for n in (1, 2, 3)]
    assert [(r.store, r.job_id) for r in got if r is not None] == [
        (a, _job(1)),
        (b, _job(2)),
        (Store(BackendName.embedded), _job(3)),
    ]
    assert laststore.recall_job(_job(4)) is None
    last = laststore.recall()
    assert last is not None and last.job_id == _job(3)  # the last run is still the last
    # Submitting a job again (same id) moves it to the end, never lists it twice.
    laststore.remember(b, _job(1), "out/one")
    again = laststore.recall_job(_job(1))
    assert again is not None and again.store == b
    doc = json.loads((state_home / laststore.FILE_NAME).read_text())
    assert [e["job"] for e in doc["jobs"]] == [_job(2), _job(3), _job(1)]
    assert (state_home / laststore.FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_the_memory_is_bounded(state_home: Path) -> None:
    store = Store.parse("aws://b/t")
    for n in range(laststore.MAX_JOBS + 20):
        laststore.remember(store, _job(n), "/o")
    assert laststore.recall_job(_job(19)) is None  # the oldest are forgotten
    assert laststore.recall_job(_job(20)) is not None
    assert laststore.recall_job(_job(laststore.MAX_JOBS + 19)) is not None
    doc = json.loads((state_home / laststore.FILE_NAME).read_text())
    assert len(doc["jobs"]) == laststore.MAX_JOBS
    assert (state_home / laststore.FILE_NAME).stat().st_size < laststore.MAX_FILE_BYTES


def test_a_bad_entry_is_skipped_the_others_kept(state_home: Path) -> None:
    good = {"store": "aws://b/t", "job": _job(1), "output": "/o", "at": 1.0}
    bad = [
        {**good, "job": "../../etc"},
        {**good, "store": "ftp://x"},
        {**good, "output": "/o\x1b[2J"},
        "not an entry",
        None,
    ]
    state_home.mkdir(parents=True)
    doc = {"cmr_last_run": 1, **good, "jobs": [*bad, good]}
    (state_home / laststore.FILE_NAME).write_text(json.dumps(doc))
    found = laststore.recall_job(_job(1))
    assert found is not None and found.store == Store.parse("aws://b/t")
    # A file written before jobs were remembered: its last run is the one job it knows.
    (state_home / laststore.FILE_NAME).write_text(json.dumps({"cmr_last_run": 1, **good}))
    assert laststore.recall_job(_job(1)) is not None
    laststore.remember(Store.parse("aws://c/u"), _job(2), "/p")  # and is carried on
    assert laststore.recall_job(_job(1)) is not None


def _submit_many(home: str, first: int, count: int) -> None:
    os.environ["XDG_STATE_HOME"] = home
    for n in range(first, first + count):
        laststore.remember(Store.parse(f"aws://bucket-{n}/t"), _job(n), "/o")


@pytest.mark.slow
def test_terminals_submitting_at_once_keep_every_job(state_home: Path) -> None:
    """Four processes (terminals) remembering jobs at the same time: none is lost."""
    home, each = str(state_home.parent), 20
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_submit_many, args=(home, k * each, each)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for n in range(4 * each):
        found = laststore.recall_job(_job(n))
        assert found is not None, n
        assert found.store == Store.parse(f"aws://bucket-{n}/t")
    names = {p.name for p in state_home.iterdir()}
    assert names == {laststore.FILE_NAME, laststore.LOCK_NAME}  # no temporary file left


# -- a pipeline's run summary -------------------------------------------------------------------


def test_a_pipelines_run_summary_gives_its_real_input(tmp_path: Path) -> None:
    proc = cmr("run", TOPWORDS, "--input", "examples/data", "--output", str(tmp_path / "o"))
    job_of(proc)
    size = sum(p.stat().st_size for p in (ROOT / "examples" / "data").rglob("*") if p.is_file())
    said = re.search(rf"succeeded in {DURATION}: ([\d.]+) MB in", proc.stderr)
    assert said is not None, proc.stderr
    assert float(said.group(1)) == round(size / 1e6, 1) > 0, proc.stderr


# -- on the local stack: detach, nothing serves the job, then a worker does ---------------------


def _worker(store: str, job: str, log: Path) -> subprocess.Popen[bytes]:
    """`cmr worker` serving the job, its output in ``log`` (the child keeps its own copy)."""
    with log.open("wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "cmr", "worker", "--store", store, "--job", job],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
def test_a_detached_job_nothing_serves_is_said_to_be_unserved(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    store = f"aws://cmr-dt-{tag}/cmr-dt-{tag}?prefix=cmrdt-{tag}-"
    worker: subprocess.Popen[bytes] | None = None
    try:
        # An embedded run first: a job asked about later lives in its own `cmr run` alone.
        wc = ("run", "examples/wordcount.py", "--input", "examples/data", "--output")
        emb = job_of(cmr(*wc, str(tmp_path / "e")))

        run = cmr(
            "run", TOPWORDS, "--input", "examples/data", "--output", str(tmp_path / "out"),
            "--store", store, "--detach",
        )  # fmt: skip
        job = job_of(run)
        # The submit line says nothing will run it, and the exact command that will.
        serve = f"`cmr worker --store {store}`"
        assert f"no worker was started (--detach): nothing runs job {job}" in run.stderr
        assert serve in run.stderr, run.stderr

        # status: unserved, for how long, how to serve it; started, elapsed, no end yet.
        shown = cmr("status", job, COLUMNS="200")
        assert shown.returncode == 0, shown.stderr
        hint = re.search(
            rf"no worker has taken a task of job {job} yet, ([\d.]+) s after it was submitted",
            shown.stdout,
        )
        assert hint is not None, shown.stdout
        assert serve in shown.stdout
        assert re.search(r"│ started\s+│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown.stdout)
        assert re.search(rf"│ elapsed\s+│ {DURATION} \(running\)", shown.stdout), shown.stdout
        assert "ended" not in shown.stdout and "first_step" not in shown.stdout
        doc = json.loads(cmr("status", job, "--json").stdout)
        assert doc["worker_seen"] is False and doc["ended"] is None
        assert doc["duration_s"] >= 0 and doc["started"] == doc["created"]
        listing = cmr("status", COLUMNS="200")
        assert "running (no worker yet)" in listing.stdout, listing.stdout

        # An embedded job asked about: it lived in its own `cmr run` only, said plainly.
        asked = cmr("status", emb)
        assert asked.returncode == 0, asked.stderr
        assert f"job {emb} ran on the embedded backend" in asked.stdout

        # wait: never silent; it keeps waiting (a fleet may be starting) up to --timeout.
        waited = cmr("wait", job, "--timeout", str(WAIT_S))
        assert waited.returncode == 124, waited.stderr
        assert f"no worker has taken a task of job {job} yet" in waited.stderr
        assert serve in waited.stderr and "; waiting" in waited.stderr
        assert f"gave up waiting after {WAIT_S} s (--timeout); job {job} goes on" in waited.stderr

        # Another run since (elsewhere): the job is still looked up in its own store.
        job_of(cmr(*wc, str(tmp_path / "e2")))

        worker = _worker(store, job, tmp_path / "worker.log")
        done = cmr("wait", job, "--timeout", "120")
        assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()
        assert f"(the store job {job} was submitted to)" in done.stderr
        assert f"job {job} succeeded" in done.stderr
        assert worker.wait(60) == 0

        shown = cmr("status", job, COLUMNS="200")
        assert shown.returncode == 0, shown.stderr
        assert "no worker has taken" not in shown.stdout
        for field in ("started", "ended", "duration"):
            assert re.search(rf"│ {field}\s+│ \S", shown.stdout), shown.stdout
        assert re.search(rf"│ step 1\s+│ succeeded in {DURATION}: {job}, ", shown.stdout)
        assert re.search(rf"│ step 2\s+│ succeeded in {DURATION}: {job}-s2, ", shown.stdout)
        assert re.search(r"│ input size\s+│ \d+\.\d kB", shown.stdout), shown.stdout
        for internal in ("first_step", "last_step", "job_steps", "input_bytes"):
            assert internal not in shown.stdout

        doc = json.loads(cmr("status", job, "--json").stdout)
        first, last = doc["steps"]
        # The pipeline's own start and input (its first step's), not its last step's.
        assert doc["started"] == doc["created"] == first["started"] < last["started"]
        assert doc["ended"] == last["ended"]
        assert doc["duration_s"] == pytest.approx(doc["ended"] - doc["started"], abs=0.01)
        assert doc["input_bytes"] == first["input_bytes"] != last["input_bytes"]
        assert doc["worker_seen"] is True
        assert all(s["duration_s"] > 0 for s in doc["steps"])
        listing = json.loads(cmr("status", "--json", "--store", store).stdout)
        assert [(d["job"], d["started"], d["input_bytes"]) for d in listing] == [
            (job, first["started"], first["input_bytes"])
        ]

        # An explicit store still wins over the job's remembered one.
        elsewhere = f"aws://cmr-none-{tag}/cmr-none-{tag}?prefix=cmrno-{tag}-"
        proc = cmr("status", job, "--store", elsewhere)
        assert proc.returncode == 1 and f"cmr-none-{tag} does not exist" in proc.stderr
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
        remove_test_resources(f"cmr-dt-{tag}", f"cmr-dt-{tag}", f"cmrdt-{tag}-")
