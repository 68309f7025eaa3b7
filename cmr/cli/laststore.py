"""Where the last ``cmr run`` ran: so ``cmr status`` (and wait, cancel, cleanup) given no
store looks there, not in a default the user never used.

One small JSON file under ``$XDG_STATE_HOME/cmr/`` (``~/.local/state/cmr/`` by default),
written atomically with mode 0600 (store URLs may name a profile and an account). It is read
back as untrusted input: anything missing, unreadable or malformed is ignored, and the
caller falls back to the default store, as if no run had been remembered.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmr.errors import UsageError
from cmr.settings import Store
from cmr.text import inert
from cmr.wire import is_job_id

FILE_NAME = "last-run.json"
VERSION = 1
MAX_FILE_BYTES = 16 * 1024  # a record is a few hundred bytes; more is not ours
MAX_TEXT = 4096  # longest store URL or output we take back


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


def remember(store: Store, job_id: str, output: str) -> None:
    """Note the store a job was just submitted to. Best effort: a state directory that
    cannot be written must never fail the run itself."""
    doc = {
        "cmr_last_run": VERSION,
        "store": store.url,
        "job": job_id,
        "output": _output_place(output),
        "at": time.time(),
    }
    directory = state_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written beside the target and renamed over it: a reader sees the old record or the
        # new one, never half of one; mkstemp creates it 0600.
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


def recall() -> LastRun | None:
    """The last run remembered, or None when there is none or it does not read back as one
    (missing, not a regular file, too large, not JSON, a field missing or of a wrong kind)."""
    path = state_dir() / FILE_NAME
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("cmr_last_run") != VERSION:
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
