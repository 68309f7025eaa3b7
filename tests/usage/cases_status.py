"""Looking after jobs: `cmr status`/`wait` look in the store each recent job was submitted to
(not only the last run's), say plainly that an embedded job lived in its own `cmr run`, and
`cmr wait --timeout` takes a positive number of seconds."""

from __future__ import annotations

import json
from pathlib import Path

from tests.usage.cases import Case, Setup

EMBEDDED_JOB = "20260101-000000-00000000000000e1"
AWS_JOB = "20260101-000000-00000000000000a2"
GONE = "aws://cmr-usage-gone-bucket/cmr-usage-gone-table?prefix=cmr-usage-gone-"


def remembered(*jobs: tuple[str, str]) -> Setup:
    """A setup: the state directory remembers these (job, store) submits, the last one last
    (the file `cmr run` writes: the last run, and the recent jobs)."""

    def setup(tmp: Path) -> None:
        entries = [
            {"store": store, "job": job, "output": str(tmp / "out"), "at": 1.7e9 + n}
            for n, (job, store) in enumerate(jobs)
        ]
        state = tmp / "state" / "cmr"
        state.mkdir(parents=True)
        doc = {"cmr_last_run": 1, **entries[-1], "jobs": entries}
        (state / "last-run.json").write_text(json.dumps(doc))

    return setup


CASES: list[Case] = [
    Case(
        "status-embedded-job-later",
        "`cmr status JOB` of a job that ran on the embedded backend, after a later run elsewhere",
        ("status", EMBEDDED_JOB),
        code=0,
        names=(EMBEDDED_JOB, "ran on the embedded backend", "its own `cmr run` process"),
        setup=remembered((EMBEDDED_JOB, "embedded"), (AWS_JOB, "aws://cmr-b/cmr-t")),
    ),
    Case(
        "status-job-store-gone",
        "`cmr status JOB` of a job whose store (bucket) was removed since",
        ("status", AWS_JOB),
        names=("cmr-usage-gone-bucket", "does not exist"),
        setup=remembered((AWS_JOB, GONE), (EMBEDDED_JOB, "embedded")),
        needs_stack=True,
    ),
    Case(
        "wait-timeout-not-positive",
        "`cmr wait --timeout` of zero or less",
        ("wait", AWS_JOB, "--timeout", "0"),
        names=("--timeout", "positive"),
    ),
]
