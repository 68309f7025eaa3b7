"""One pool process serves tasks of many jobs in turn: nothing of one job reaches another.

The review proved that a reduce's live counters were credited to whichever job last ran a
map in the same pool process, and set-up instances were shared by jobs running the same
code. These run real tasks in a real one-process pool, in the order that exposed it.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import msgpack

from cmr.cpu.mapping import run_map
from cmr.cpu.reducing import run_reduce
from cmr.cpu.specs import MapSpec, ReduceSpec
from cmr.job import JobRef
from cmr.pool import CpuPool

COUNTING = """
import cmr

class Counting(cmr.Job):
    def setup(self):
        self.calls = 0

    def map(self, key, line):
        self.progress(mapped=1)
        yield line, 1

    def reduce(self, key, values):
        self.calls += 1  # state on the instance: must be this job's alone
        self.progress(reduced=1)
        yield key, self.calls
"""


def _spool(path: Path, pairs: list[tuple[str, int]]) -> str:
    path.write_bytes(b"".join(msgpack.packb([k, v]) for k, v in pairs))
    return str(path)


def _drain(channel: Any) -> list[tuple[str, dict[str, int]]]:
    got = []
    while True:
        try:
            got.append(channel.get(timeout=2))
        except queue.Empty:
            return got


def test_a_reduce_credits_its_own_job_and_keeps_its_own_instance(tmp_path: Path) -> None:
    job = tmp_path / "counting.py"
    job.write_text(COUNTING)
    ref = JobRef.parse(str(job))
    spill = tmp_path / "spill"
    spill.mkdir()
    pool = CpuPool(1)
    try:
        mapped = pool.submit(
            run_map,
            ref,
            {},
            [("in", b"x\ny")],
            MapSpec("job-a", 0, "ab12", 1, 64 * 1024, str(spill)),
        ).result()
        assert mapped.error == ""
        outputs = {}
        for job_id, keys in (("job-a", ["k1", "k2", "k3"]), ("job-b", ["k1"])):
            out = tmp_path / f"{job_id}.out"
            spool = _spool(tmp_path / f"{job_id}.spool", [(k, 1) for k in keys])
            result = pool.submit(
                run_reduce, ref, {}, [spool], ReduceSpec(job_id, str(out), 1 << 20, str(spill))
            ).result()
            assert result.error == ""
            outputs[job_id] = out.read_text().splitlines()
        reports = _drain(pool.progress)
    finally:
        pool.shutdown()
    by_job: dict[str, dict[str, int]] = {}
    for job_id, counters in reports:
        for name, n in counters.items():
            by_job.setdefault(job_id, {}).setdefault(name, 0)
            by_job[job_id][name] += n
    # job-b ran no map: only its own reduce's counter may reach it, and job-a gets none of it.
    assert by_job == {"job-a": {"mapped": 2, "reduced": 3}, "job-b": {"reduced": 1}}
    # The same code and params, two jobs: job-b's instance starts fresh.
    assert outputs["job-a"] == ["k1\t1", "k2\t2", "k3\t3"]
    assert outputs["job-b"] == ["k1\t1"]


def test_progress_outside_a_task_goes_nowhere(tmp_path: Path) -> None:
    """After a task, the process belongs to no job: a report from a thread the user's code
    left behind, or from setup of the next job, is not credited to the last one."""
    from cmr import taskprogress

    sink: queue.Queue[Any] = queue.Queue()
    taskprogress.attach(sink)
    try:
        with taskprogress.running("job-a"):
            taskprogress.report(ops=1)
        taskprogress.report(ops=5)
    finally:
        taskprogress.attach(None)
    assert [sink.get_nowait()] == [("job-a", {"ops": 1})]
    assert sink.empty()
