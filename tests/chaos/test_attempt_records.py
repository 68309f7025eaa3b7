"""Task attempts and worker rows (cmr.attempts, cmr.workers): what the dashboard draws and
straggler backups judge. Each chaos run also checks its timeline (cmr.testing
.timeline_problems): one committed attempt per task, whatever was killed."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from cmr import attempts, workers
from cmr.backends.embedded import temporary_backend
from cmr.backends.faults import FaultPlan
from cmr.clock import wall
from cmr.records import WORKERS_PK, job_pk
from cmr.runtime import Runtime
from cmr.testing import chaos_run, timeline_problems
from cmr.virtualtime import in_virtual_time

WORDCOUNT = "examples/wordcount.py"


def _data(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for n in range(4):
        (src / f"{n}.txt").write_text(f"w{n} common\n" * 300)
    return src


@in_virtual_time
async def test_a_job_keeps_its_timeline_and_shows_its_attempts_live(
    tmp_path: Path, pool: Executor
) -> None:
    """While a map attempt runs, its row says who runs it since when; the worker's row lists
    the job; once cleaned up, the job keeps one committed attempt per task, each ended."""
    seen: dict[str, Any] = {}

    async def look(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "map.partly_sent" and "live" not in seen:
            seen["live"] = await attempts.attempts(rt.backend, context["job"])
            seen["workers"] = await workers.seen(rt.backend)
            seen["me"] = rt.worker_id

    result = await chaos_run(
        WORDCOUNT,
        _data(tmp_path),
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[look, None],
        workers=2,
        reducers=2,
        split_bytes=1024,
        clientless=True,
    )
    assert result.record["state"] == "succeeded"
    live = [a for a in seen["live"] if a.kind == "m" and a.running]
    assert any(a.worker == seen["me"] and a.outcome == "running" for a in live), seen["live"]
    assert all(a.started <= wall() for a in seen["live"])
    mine = [w for w in seen["workers"] if w.worker == seen["me"]]
    assert mine and result.job_id in mine[0].jobs, seen["workers"]
    # After cleanup: the timeline, from the table alone.
    assert timeline_problems(result) == []
    maps = [a for a in result.attempts if a.kind == "m" and a.outcome == "committed"]
    assert sorted(a.task for a in maps) == list(range(int(result.record["maps"])))
    assert all(a.ended is not None and a.ended >= a.started for a in result.attempts)
    # Every attempt was run by one of the two workers, each known by its row.
    assert {a.worker for a in result.attempts} <= {w.worker for w in seen["workers"]}
    assert result.leftovers == []


@in_virtual_time
async def test_a_failed_attempt_keeps_its_reason(tmp_path: Path, pool: Executor) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("bad line\n")
    job = tmp_path / "boom.py"
    job.write_text(
        "from cmr import Job\n"
        "class Boom(Job):\n"
        "    def map(self, key, value):\n"
        "        raise ValueError('cannot handle ' + repr(value))\n"
        "        yield key, value\n"
        "    def reduce(self, key, values):\n"
        "        yield key, sum(values)\n"
    )
    result = await chaos_run(
        str(job),
        src,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        steps=None,
        hooks=[None],
        workers=1,
        reducers=1,
        clientless=True,
    )
    assert result.record["state"] == "failed"
    failed = [a for a in result.attempts if a.outcome == "failed"]
    # One failed attempt per failure the job allowed, and the job's reason in each.
    assert len(failed) == int(result.record["max_task_failures"]) == 3, result.attempts
    assert all("Boom.map raised ValueError: cannot handle 'bad line'" in a.error for a in failed)


async def test_rows_from_strangers_are_skipped_not_trusted() -> None:
    async with temporary_backend("cmr-attempts-") as be:
        pk = job_pk("j1")
        good = {"worker": "w1", "host": "h", "started": 1.0, "outcome": "running"}
        await be.table.put(pk, attempts.row_sk("m", 3, "abc"), {**good, "backup": True})
        for n, junk in enumerate(
            [
                {**good, "outcome": "<script>"},
                {**good, "started": "soon"},
                {**good, "worker": "x" * 10_000},
                {**good, "backup": "yes"},
                {**good, "ended": -5},
            ]
        ):
            await be.table.put(pk, attempts.row_sk("r", n, "t"), junk)
        await be.table.put(pk, "att#mnotanumber#x", good)
        got = await attempts.attempts(be, "j1")
        assert [(a.kind, a.task, a.attempt, a.backup) for a in got] == [("m", 3, "abc", True)]
        # A timeline is read only once the rows are gone; its junk rows are skipped too.
        for item in await be.table.query(pk, prefix="att#"):
            await be.table.delete(pk, str(item["sk"]))
        row = ["m", 1, "a", "w", "h", 1.0, 2.0, "committed", "", False]
        await be.table.put(pk, "timeline#0000", {"rows": [row, ["m"], [*row[:7], "??", "", 1]]})
        assert [a.task for a in await attempts.attempts(be, "j1")] == [1]
        await be.table.put(WORKERS_PK, "w-junk", {"host": "h", "pid": "one"})
        assert await workers.seen(be) == []


async def test_rows_of_workers_silent_for_an_hour_are_swept() -> None:
    async with temporary_backend("cmr-workers-") as be:
        beat = workers.Beat(be, "w-live", 2, 1)
        await beat.write(1, ["j1"], 5, stopped=False)
        old = {"host": "h", "pid": 1, "started": 1.0, "beat": wall() - workers.FORGET_S - 5}
        old |= {"busy": 0, "map_slots": 1, "reduce_slots": 1, "jobs": [], "tasks_done": 0}
        await be.table.put(WORKERS_PK, "w-gone", old)
        assert [w.worker for w in await workers.seen(be, within_s=10 * workers.FORGET_S)] == [
            "w-live",
            "w-gone",
        ]
        await beat.sweep()
        rows = await workers.seen(be, within_s=10 * workers.FORGET_S)
        assert [(w.worker, w.busy, w.jobs, w.tasks_done) for w in rows] == [
            ("w-live", 1, ("j1",), 5)
        ]
        await beat.write(0, [], 6, stopped=True)
        (row,) = await workers.seen(be)
        assert row.stopped is not None and row.to_json()["slots"] == {"map": 2, "reduce": 1}


async def test_a_worker_stopping_says_so_in_its_row(tmp_path: Path, pool: Executor) -> None:
    from cmr.settings import WorkerSettings
    from cmr.worker import Worker

    async with temporary_backend("cmr-workers-") as be:
        w = Worker(be, WorkerSettings(map_slots=1, reduce_slots=1, processes=1), pool)
        run = asyncio.create_task(w.run())
        for _ in range(100):
            if await workers.seen(be):
                break
            await asyncio.sleep(0.05)
        (row,) = await workers.seen(be)
        assert row.worker == w.rt.worker_id and row.stopped is None
        w.done.set()
        await run
        (row,) = await workers.seen(be)
        assert row.stopped is not None
