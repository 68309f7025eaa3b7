"""Live counters from user code (Job.progress) reach the job record while the job runs."""

from __future__ import annotations

from pathlib import Path

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.records import job_pk
from cmr.watch import Progress

COUNTING_JOB = """
import time
import cmr

class Counting(cmr.Job):
    def map(self, key, line):
        for i in range(5):
            self.progress(lines_seen=1, ticks=2)
            time.sleep(0.4)
        yield line, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


async def test_counters_reported_by_user_code_arrive_while_tasks_run(
    embedded: Backend, tmp_path: Path
) -> None:
    job = tmp_path / "counting.py"
    job.write_text(COUNTING_JOB)
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n")
    seen: list[tuple[int, int]] = []

    def watch(p: Progress) -> None:
        seen.append((p.maps_done, p.stats.get("c_ticks", 0)))

    result = await run_on(
        embedded, str(job), str(src), str(tmp_path / "out"), reducers=1, on_progress=watch
    )
    # Counters grew before the (single) map task finished, and all of them arrived.
    assert any(maps == 0 and ticks > 0 for maps, ticks in seen), seen
    # Every report arrives, the last ones when the workers stop.
    record = await embedded.table.get(job_pk(result.job_id), "job")
    assert record is not None
    assert record["c_lines_seen"] == 10
    assert record["c_ticks"] == 20
