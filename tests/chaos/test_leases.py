"""Lease renewal: a task that runs much longer than its visibility timeout, in a healthy
worker, is never handed to a second worker."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from cmr.backends.faults import FaultPlan
from cmr.testing import chaos_run, diff_outputs, read_output, sequential

SLOW_JOB = """
import time
import cmr

class Slow(cmr.Job):
    def map(self, key, line):
        time.sleep(float(self.params.get("map_s", "0")))
        for word in line.split():
            yield word, 1

    def reduce(self, word, counts):
        time.sleep(float(self.params.get("reduce_s", "0")))
        yield word, sum(counts)
"""


async def test_slow_tasks_keep_their_leases(pool: Executor, tmp_path: Path) -> None:
    job = tmp_path / "slow.py"
    job.write_text(SLOW_JOB)
    src = tmp_path / "in.txt"
    src.write_text("a b\nc a\n")
    params = {"map_s": "2.5", "reduce_s": "1.5"}  # each task takes > 2x its 2 s lease
    result = await chaos_run(
        str(job),
        src,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[None, None, None],
        workers=3,
        reducers=2,
        visibility_s=2,
        params=params,
    )
    assert (
        diff_outputs(sequential(str(job), src, 2, params), read_output(tmp_path / "out", 2)) == []
    )
    rec = result.record
    # Nobody else ever got the tasks: no second attempt, no second claim, no lost lease.
    # (Batches may reappear to their own reducer, which drops them by tag: they are never
    # renewed, so that a successor can find them if the reducer dies.)
    for counter in (
        "map_attempts_filtered",
        "map_duplicates_skipped",
        "reduce_conflicts",
        "leases_lost",
        "batches_filtered",
    ):
        assert rec.get(counter, 0) == 0, counter
