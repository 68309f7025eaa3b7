"""Where the last ``cmr run`` ran, and where each recent job was submitted: so ``cmr status
JOB`` (and wait, cancel, cleanup) given no store looks in that job's store, and given no job
either in the last run's, not in a default the user never used.

One small JSON file under ``$XDG_STATE_HOME/cmr/`` (``~/.local/state/cmr/`` by default): the
last run, and the last MAX_JOBS jobs (id, store, output, when). Two terminals may submit at
once: each read-modify-write holds an exclusive lock on a lock file beside it, and the file is
written atomically with mode 0600 (store URLs may name a profile and an account). It is read
back as untrusted input: anything missing, unreadable or malformed is ignored (a bad entry
alone, or the whole file), and the caller falls back to the default store, as if no run had
been remembered.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmr.errors import UsageError
from cmr.logs import inert
from cmr.settings import Store
from cmr.wire import is_job_id

FILE_NAME = "last-run.json"
LOCK_NAME = "last-run.lock"  # held while a run updates FILE_NAME (never replaced itself)
VERSION = 1
MAX_JOBS = 100  # recent jobs whose store is remembered
MAX_TEXT = 4096  # longest store URL or output we take back
# A record is a few hundred bytes; MAX_JOBS of them with the longest texts, and no more.
MAX_FILE_BYTES = (MAX_JOBS + 1) * (2 * MAX_TEXT + 256)


@dataclass(frozen=True)
class LastRun:
    store: Store
    job_id: str
    output: str  # as `cmr run` resolved it: an absolute local path, or an s3:// URL
    at: float  # when it was submitted (seconds since the epoch)


def state_dir() -> Path:
    """``$XDG_STATE_HOME/cmr``; an unset, empty or relative value means ~/.local/state (the
    XDG spec says relative paths are to be ignored)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "cmr"


def _output_place(output: str) -> str:
    """A local output as an absolute path (status may run from another directory)."""
    if "://" in output and not output.startswith("file://"):
        return output
    return str(Path(output.removeprefix("file://")).absolute())


def _entry(store: Store, job_id: str, output: str, at: float) -> dict[str, Any]:
    return {"store": store.url, "job": job_id, "output": _output_place(output), "at": at}


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold the state directory's lock: one writer at a time reads, changes and replaces the
    file, so two terminals submitting at once both keep their job. Where there is no flock
    (Windows) the write is still atomic; one of two simultaneous jobs may then be lost."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def remember(store: Store, job_id: str, output: str) -> None:
    """Note the store a job was just submitted to: the last run, and one of the recent jobs.
    Best effort: a state directory that cannot be written must never fail the run itself."""
    entry = _entry(store, job_id, output, time.time())
    directory = state_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(directory):
            jobs = [e for e in _read_jobs(_read()) if e["job"] != job_id][-(MAX_JOBS - 1) :]
            doc = {"cmr_last_run": VERSION, **entry, "jobs": [*jobs, entry]}
            # Written beside the target and renamed over it: a reader sees the old record or
            # the new one, never half of one; mkstemp creates it 0600.
            fd, tmp = tempfile.mkstemp(prefix=".last-run-", suffix=".json", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f)
                os.replace(tmp, directory / FILE_NAME)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        return None
    return value if inert(value) == value else None  # no control characters


def _read() -> dict[str, Any] | None:
    """The file's document, or None (missing, not a regular file, too large, not JSON, not
    of this version)."""
    path = state_dir() / FILE_NAME
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("cmr_last_run") != VERSION:
        return None
    return doc


def _run(doc: Any) -> LastRun | None:
    """One remembered job, or None when it does not read back as one (a field missing or of
    a wrong kind)."""
    if not isinstance(doc, dict):
        return None
    url, output, job_id, at = (
        _text(doc, "store"),
        _text(doc, "output"),
        doc.get("job"),
        doc.get("at"),
    )
    if url is None or output is None or not is_job_id(job_id):
        return None
    if not isinstance(at, int | float) or isinstance(at, bool) or not 0 <= at < float("inf"):
        return None
    try:
        store = Store.parse(url)
    except UsageError:
        return None
    return LastRun(store, str(job_id), output, float(at))


def _read_jobs(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The recent jobs a document lists, oldest first, the bad ones left out (a file written
    before jobs were remembered lists its last run alone)."""
    if doc is None:
        return []
    listed = doc.get("jobs")
    entries = listed[-MAX_JOBS:] if isinstance(listed, list) else [doc]
    good = []
    for e in entries:
        run = _run(e)
        if run is not None:
            good.append(_entry(run.store, run.job_id, run.output, run.at))
    return good


def recall() -> LastRun | None:
    """The last run remembered, or None when there is none or it does not read back as one
    (missing, not a regular file, too large, not JSON, a field missing or of a wrong kind)."""
    return _run(_read())


def recall_job(job_id: str) -> LastRun | None:
    """Where job ``job_id`` was submitted, when it is one of the last MAX_JOBS remembered."""
    for entry in reversed(_read_jobs(_read())):
        if entry["job"] == job_id:
            return _run(entry)
    return None
