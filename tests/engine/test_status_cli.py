"""`cmr status` (and wait, cancel, cleanup) meet the user where the last `cmr run` ran: the
store it used, or, after an embedded run, where its output is; job ids are never cut; a
missing bucket is reported as what it means to status, which creates nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from cmr.cli import laststore
from cmr.cli.tables import keep_whole, print_table
from cmr.settings import BackendName, Store
from tests.stack import remove_test_resources

ROOT = Path(__file__).resolve().parents[2]
JOB = "20260101-000000-0123456789abcdef"


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test remembers its runs in its own state directory; no $CMR_STORE of the caller."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.delenv("CMR_STORE", raising=False)
    return home / "cmr"


def cmr(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``cmr ARGS`` in a subprocess, its stdout a pipe (not a terminal), 60 columns wide."""
    return subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        env={**os.environ, "COLUMNS": "60", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- the last run's store, remembered -----------------------------------------------------


def test_remember_writes_a_private_file_recall_reads_back(state_home: Path) -> None:
    store = Store.parse("aws://my-bucket/my-table?prefix=p-&region=eu-west-1")
    laststore.remember(store, JOB, "out/wc")
    assert (state_home / laststore.FILE_NAME).stat().st_mode & 0o777 == 0o600
    last = laststore.recall()
    assert last is not None
    assert (last.store, last.job_id) == (store, JOB)
    assert last.output == str(Path("out/wc").absolute())  # status may run elsewhere
    # A second run replaces the first.
    laststore.remember(Store(BackendName.embedded), "20260102-000000-ffff", "s3://b/o/")
    last = laststore.recall()
    assert last is not None
    assert (last.store.backend, last.job_id, last.output) == (
        "embedded",
        "20260102-000000-ffff",
        "s3://b/o/",
    )
    left = {p.name for p in state_home.iterdir()} - {laststore.LOCK_NAME}
    assert left == {laststore.FILE_NAME}  # no temp left


def _record(**change: object) -> bytes:
    doc = {"cmr_last_run": 1, "store": "aws://b/t", "job": JOB, "output": "/o", "at": 1.0}
    doc.update(change)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b"\xff\xfe",
        _record(cmr_last_run=2),
        _record(store="ftp://somewhere"),
        _record(store="aws://b/t?owner=12"),
        _record(store=7),
        _record(job="../../etc"),
        _record(job=None),
        _record(output="/o\x1b[2J"),
        _record(output=""),
        _record(at=True),
        _record(at="yesterday"),
        b" " * (laststore.MAX_FILE_BYTES + 1),
    ],
    ids=lambda c: repr(c[:40]),
)
def test_a_bad_record_is_ignored(state_home: Path, content: bytes) -> None:
    state_home.mkdir(parents=True)
    (state_home / laststore.FILE_NAME).write_bytes(content)
    assert laststore.recall() is None


def test_a_directory_in_place_of_the_record_is_ignored(state_home: Path) -> None:
    (state_home / laststore.FILE_NAME).mkdir(parents=True)
    assert laststore.recall() is None
    laststore.remember(Store(BackendName.embedded), JOB, "/o")  # and never fails a run


def test_status_with_nothing_remembered_says_where_it_looks(state_home: Path) -> None:
    state_home.mkdir(parents=True)
    (state_home / laststore.FILE_NAME).write_text("{garbage")
    proc = cmr("status")  # no credentials in tests: it fails, but after saying where
    assert proc.stderr.startswith(
        "looking in aws://cmr-data/cmr?prefix=cmr- (the default store: no `cmr run` "
        "remembered; --store names another)\n"
    ), proc.stderr
    assert "credentials" in one_error_line(proc)


# -- after an embedded run ----------------------------------------------------------------


def _embedded_run(tmp_path: Path) -> tuple[str, Path]:
    out = tmp_path / "wordcount"
    proc = cmr("run", "examples/wordcount.py", "--input", "examples/data", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    job = proc.stderr.split("submitted job ", 1)[1].split()[0]
    return job, out


@pytest.mark.slow
def test_status_after_the_readmes_embedded_run(tmp_path: Path) -> None:
    job, out = _embedded_run(tmp_path)
    proc = cmr("status")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no credentials asked for, nothing looked up
    [line] = proc.stdout.splitlines()  # one line, however narrow the terminal
    assert line.startswith(f"job {job} ran on the embedded backend, in `cmr run` itself, and ")
    manifest = json.loads((out / "_SUCCESS").read_text())
    assert f"succeeded: {manifest['records']} records in {len(manifest['parts'])} parts" in line
    assert f"its output and _SUCCESS manifest are in {out}." in line
    assert line.endswith("for a store that keeps them, run with --store aws://BUCKET/TABLE")

    for args in (["status", "--json"], ["status", job, "--json"]):
        proc = cmr(*args)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        doc = doc[0] if isinstance(doc, list) else doc
        assert doc == {
            "job": job,
            "store": "embedded",
            "state": "succeeded",
            "output": str(out),
            "published": {"place": str(out), "manifest": f"{out}/_SUCCESS"},
            "records_out": manifest["records"],
            "parts": len(manifest["parts"]),
        }
    assert isinstance(json.loads(cmr("status", "--json").stdout), list)

    # wait: it ended already, and succeeded; cancel: nothing to cancel; cleanup: nothing left
    assert cmr("wait", job).returncode == 0
    assert "nothing to cancel" in one_error_line(cmr("cancel", job))
    cleaned = cmr("cleanup", job)
    assert cleaned.returncode == 0 and "nothing to clean up" in cleaned.stderr

    # Another job id cannot be on the embedded backend: one line says where to look.
    other = "20260101-000000-abc"
    line = one_error_line(cmr("status", other))
    assert f"job {other} is not known here" in line and f"your last run, job {job}" in line
    assert "--store aws://" in line

    # Its output replaced by another run's (or removed): said, not claimed to have succeeded.
    (out / "_SUCCESS").unlink()
    proc = cmr("status", "--json")
    assert json.loads(proc.stdout)[0]["state"] == "unknown"
    assert f"{out} holds no _SUCCESS manifest of it" in cmr("status").stdout
    assert "no _SUCCESS" in one_error_line(cmr("wait", job))


# -- tables: ids never cut ------------------------------------------------------------------


def _jobs_table(ids: list[str]) -> Table:
    t = Table("job", "state", "created", "maps", "reduces", "input")
    for i in ids:
        t.add_row(i, "running", "2026-01-01 00:00:00", "1/9", "0/4", "s3://b/" + "x/" * 40)
    keep_whole(t, 0, ids)
    return t


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("width", [30, 60, 80, 200])
def test_a_table_never_cuts_an_id(terminal: bool, width: int) -> None:
    ids = [f"2026010{n}-000000-{uuid.uuid4().hex}" for n in range(3)]
    console = Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None)
    print_table(console, _jobs_table(ids))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    for i in ids:
        assert i in shown, shown


# -- on the local stack: the last run's aws store --------------------------------------------


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
def test_status_looks_in_the_store_of_the_last_run(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    store = f"aws://cmr-ls-{tag}/cmr-ls-{tag}?prefix=cmrls-{tag}-"
    try:
        run = cmr(
            "run", "examples/wordcount.py", "--input", "examples/data",
            "--output", str(tmp_path / "out"), "--store", store,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        job = run.stderr.split("submitted job ", 1)[1].split()[0]

        # No store given: the last run's, said on stderr; the id whole in a 60-column pipe.
        listing = cmr("status")
        assert listing.returncode == 0, listing.stderr
        assert listing.stderr == (
            f"looking in {store} (the store of your last `cmr run`, job {job})\n"
        )
        assert job in listing.stdout, listing.stdout
        single = cmr("status", job)
        assert single.returncode == 0 and job in single.stdout, single.stderr
        assert cmr("wait", job).returncode == 0

        # --json: one document on stdout, the list and the single job.
        [doc] = json.loads(cmr("status", "--json").stdout)
        assert (doc["job"], doc["state"]) == (job, "succeeded")
        assert json.loads(cmr("status", job, "--json").stdout)["job"] == job

        # $CMR_STORE comes before the last run, and says so; a bucket no job has made is
        # not a store status could create.
        absent = f"aws://cmr-none-{tag}/cmr-none-{tag}?prefix=cmrno-{tag}-"
        proc = cmr("status", CMR_STORE=absent)
        assert proc.stderr.startswith(f"looking in {absent} (from $CMR_STORE)\n")
        assert one_error_line(proc) == (
            f"error: bucket cmr-none-{tag} does not exist: no job has run in this store "
            f"({absent}) yet; check --store/--bucket"
        )
        # A flag comes before both, and needs no explanation.
        proc = cmr("status", "--bucket", f"cmr-none-{tag}", CMR_STORE=absent)
        assert "looking in" not in proc.stderr
        assert "enable bucket creation" not in one_error_line(proc)
        assert "no job has run in this store" in one_error_line(proc)
    finally:
        remove_test_resources(f"cmr-ls-{tag}", f"cmr-ls-{tag}", f"cmrls-{tag}-")
