"""Lease renewal: a task that runs much longer than its visibility timeout, in a healthy
worker, is never handed to a second worker."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from cmr.backends.faults import FaultPlan
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time

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


@in_virtual_time
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
    # And a reducer waiting for the slow maps keeps the batches it holds invisible (renewing
    # them by their receipts), so it never receives its own partition again: nothing
    # dropped as a repeat.
    for counter in (
        "map_attempts_filtered",
        "map_duplicates_skipped",
        "reduce_conflicts",
        "leases_lost",
        "batches_filtered",
        "batches_dropped",
        "tasks_restarted",
    ):
        assert rec.get(counter, 0) == 0, counter


WAITING_JOB = """
import time
import cmr

class OneSlowTask(cmr.Job):
    def map(self, key, line):
        if line == "SLOW":
            time.sleep(7)  # three and a half leases
        for word in line.split():
            yield word, 1

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


@in_virtual_time
async def test_a_waiting_reducer_does_not_receive_its_partition_again(
    pool: Executor, tmp_path: Path
) -> None:
    """The fast task's batches reach the reducer at once; the slow task commits leases
    later. Meanwhile the reducer keeps the batches it holds (one receipt per message): it
    must not receive them again every lease, as it did."""
    job = tmp_path / "wait.py"
    job.write_text(WAITING_JOB)
    data = tmp_path / "in"
    data.mkdir()
    (data / "a-fast.txt").write_text("".join(f"w{i} x{i % 7}\n" for i in range(3000)))
    (data / "b-slow.txt").write_text("SLOW\n")
    result = await chaos_run(
        str(job),
        data,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[None],
        workers=1,
        reducers=1,
        visibility_s=2,
        split_bytes=8 * 1024,  # several fast tasks; the slow line shares the last one
        clientless=True,
    )
    assert diff_outputs(sequential(str(job), data, 1), read_output(tmp_path / "out", 1)) == []
    assert result.record["maps"] >= 2
    assert result.record.get("batches_dropped", 0) == 0
    assert result.leftovers == []
