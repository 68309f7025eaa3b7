"""A ``cmr run`` ends when its job does: the in-process workers stop together, not each at
its next refresh of the jobs it serves (a run of two workers used to end 5 s late: only the
worker that cleaned the job up stopped at once). Timed on the virtual clock, where a nap
costs its full length and nothing else moves time: the bound is not the machine's load."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cmr.api import run_async
from cmr.virtualtime import in_virtual_time
from cmr.worker import JOB_REFRESH_S

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workers", [1, 2, 3])
@in_virtual_time
async def test_a_run_returns_once_its_job_is_cleaned_up(workers: int, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await run_async(
        str(REPO / "examples" / "wordcount.py"),
        str(REPO / "examples" / "data"),
        str(tmp_path / "out"),
        workers=workers,
        reducers=2,
    )
    took = loop.time() - started
    assert result.record["state"] == "succeeded"
    assert (tmp_path / "out" / "_SUCCESS").is_file()
    # The job of these few lines takes well under a second of (virtual) time; a worker
    # left to notice the job's end at its next refresh adds JOB_REFRESH_S.
    assert took < JOB_REFRESH_S, f"{workers} workers: the run took {took:.1f} s of virtual time"
