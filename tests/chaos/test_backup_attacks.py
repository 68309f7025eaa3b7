"""Attacks on straggler backups and attempt rows (cmr.backup, cmr.attempts, cmr.tracking):
races of a backup with its straggler, with the job's end and with other backups, and rows
of the table that nobody should trust. On the embedded backend and the virtual clock."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr import clock
from cmr.backends.base import Backend, Table, TxWrite, Update
from cmr.backends.faults import FaultPlan
from cmr.records import job_pk
from cmr.runtime import Runtime, WorkerCrashed
from cmr.settings import WorkerSettings
from cmr.testing import (
    ChaosResult,
    chaos_run,
    timeline_problems,
)
from cmr.virtualtime import in_virtual_time
from tests.chaos.test_backups import REDUCERS, STALL_S, WORDCOUNT, _backups, _exact


@pytest.fixture
def data(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for n in range(8):
        (src / f"{n}.txt").write_text(f"w{n} common x{n % 3}\n" * 200)
    return src


class _GatedTable:
    """The table, but a backup's take-over write (cmr.backup.take_over) first waits for
    ``before`` to be set, after setting ``taking``."""

    def __init__(self, table: Table, taking: asyncio.Event, before: asyncio.Event) -> None:
        self._table = table
        self._taking = taking
        self._before = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    async def transact(self, writes: list[TxWrite], **kw: Any) -> None:
        if any(isinstance(w, Update) and (w.set_ or {}).get("backup") is True for w in writes):
            self._taking.set()
            await asyncio.wait_for(self._before.wait(), 600)
        await self._table.transact(writes, **kw)


async def _chaos(data: Path, out: Path, pool: Executor, hooks: list[Any], **kw: Any) -> ChaosResult:
    return await chaos_run(
        WORDCOUNT,
        data,
        out,
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=hooks,
        workers=3,
        reducers=REDUCERS,
        visibility_s=60,
        split_bytes=2048,
        clientless=True,
        timeout_s=kw.pop("timeout_s", 3_000),
        settings=WorkerSettings(map_slots=1, reduce_slots=2, processes=1, memory_mb=1),
        **kw,
    )


@in_virtual_time
async def test_a_takeover_racing_the_stragglers_commit_never_reopens_the_partition(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """The backup reads the straggler's claim (claimed, its token), the straggler commits,
    then the backup's take-over write lands. Conditional on the token alone, it turned the
    committed partition back into a claim of the backup's: a decision someone acted on
    (the commit was counted) changed, and the backup reduced a partition whose batches were
    gone."""
    taking, committed = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    async def straggler(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "reduce.output_written" and "partition" not in seen:
            seen["partition"], seen["worker"] = context["partition"], rt.worker_id
            await asyncio.wait_for(taking.wait(), 600)  # slow, until the backup moves
        elif at == "reduce.committed" and context["partition"] == seen.get("partition"):
            committed.set()

    result = await _chaos(
        data,
        tmp_path / "out",
        pool,
        [straggler, straggler, straggler],
        wrap=lambda be: dataclasses.replace(be, table=_GatedTable(be.table, taking, committed)),
    )
    assert taking.is_set() and committed.is_set()
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    # The straggler's commit stands: the backup never held the partition.
    assert not [b for b in _backups(result, "r") if b.outcome == "committed"]
    assert timeline_problems(result) == [] and result.leftovers == []


@in_virtual_time
async def test_a_failed_reduce_backup_does_not_count_as_a_lost_start(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """A live straggler's partition is taken over by a backup, whose attempt fails (once).
    The straggler was fenced out, the backup raised: neither start was lost. Yet the
    take-over bumped the partition's epoch, so the next claim (epoch 3) counted three
    starts and no raise, and a job allowing two attempts failed: "started 3 times without
    finishing or raising". Backups must not make a job fail that would succeed without."""
    seen: dict[str, Any] = {}

    async def hook(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at != "reduce.draining":
            return
        if "partition" not in seen:
            seen["partition"], seen["worker"] = context["partition"], rt.worker_id
            await asyncio.sleep(STALL_S)  # the straggler: slow, alive, its leases renewed
        elif (
            context["partition"] == seen["partition"]
            and rt.worker_id != seen["worker"]
            and "failed" not in seen
        ):
            seen["failed"] = rt.worker_id  # the backup: it fails, once
            raise RuntimeError("the backup's attempt failed")

    result = await _chaos(
        data,
        tmp_path / "out",
        pool,
        [hook, hook, hook],
        job_options={"max_task_attempts": 2},
        timeout_s=3 * STALL_S,
    )
    assert "failed" in seen
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert timeline_problems(result) == [] and result.leftovers == []


def _straggle_at(step: str) -> tuple[Any, dict[str, Any]]:
    seen: dict[str, Any] = {}

    async def hook(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == step and "context" not in seen:
            seen["context"], seen["worker"] = context, rt.worker_id
            await asyncio.sleep(STALL_S)

    return hook, seen


@pytest.mark.parametrize("kind", ["m", "r"])
@in_virtual_time
async def test_a_forged_attempt_row_of_no_task_of_the_job_wastes_no_backup(
    data: Path, pool: Executor, tmp_path: Path, kind: str
) -> None:
    """A row in the job's partition naming a task the job does not have (task 999), running
    since long ago, by a worker nobody knows. It was the oldest 'straggler', so it took the
    job's only backup (a tenth of its tasks, at least one): the real straggler then kept the
    job waiting for its whole stall."""

    async def forge(be: Backend, spec: Any) -> None:
        await be.table.put(
            job_pk(spec.job_id),
            f"att#{kind}000999#forged",
            {"worker": "ghost", "host": "h", "started": 1.0, "outcome": "running"},
        )

    hook, seen = _straggle_at("map.partly_sent" if kind == "m" else "reduce.draining")
    started = clock.monotonic()
    result = await _chaos(
        data, tmp_path / "out", pool, [hook, None, None], after_submit=forge, timeout_s=2 * STALL_S
    )
    took = clock.monotonic() - started
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert took < STALL_S / 10, took
    (b,) = _backups(result, kind)  # of the real straggler
    assert b.task == seen["context"]["task" if kind == "m" else "partition"]
    assert result.leftovers == []


@pytest.mark.parametrize("sk", ["map#\u00b2", "reduce#\u00b2"])
@in_virtual_time
async def test_a_forged_task_record_never_stops_the_cleanup_that_folds_the_timeline(
    data: Path, pool: Executor, tmp_path: Path, sk: str
) -> None:
    """A record 'map#²' (or 'reduce#²') in the job's partition as its cleanup runs: '²'
    passes str.isdigit() but not int(), so the timeline's fold raised ValueError, every
    cleanup of the job after it too, and its records stayed forever (the workers never
    finished their duty: the run timed out)."""
    forged: list[str] = []

    async def forge(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "cleanup.scratch" and not forged:
            forged.append(sk)
            await rt.backend.table.put(
                job_pk(context["job"]), sk, {"state": "committed", "attempt": "a", "token": "t"}
            )

    result = await _chaos(data, tmp_path / "out", pool, [forge, forge, forge], timeout_s=600)
    assert forged
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert timeline_problems(result) == [] and result.leftovers == []


@in_virtual_time
async def test_a_timeline_of_long_attempt_rows_never_stops_the_cleanup(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """300 attempt rows, each as long as a row may be (a 300-character error headline in
    4-byte characters, as a job whose users' messages are not ASCII writes when its tasks
    keep failing; or a stranger's rows). The fold packed them into one timeline item of
    ~480 KB, past the table's 400 KB item limit: refused, every cleanup of the job failed
    on it, and its records stayed."""
    rows = 300

    async def forge(be: Backend, spec: Any) -> None:
        for n in range(rows):
            await be.table.put(
                job_pk(spec.job_id),
                f"att#m000000#{'a' * 110}{n:04d}",
                {
                    "worker": "w" * 120,
                    "host": "h" * 120,
                    "started": 1.0,
                    "ended": 2.0,
                    "outcome": "failed",
                    "error": "\U0001f4a5" * 300,
                },
            )

    result = await _chaos(data, tmp_path / "out", pool, [None, None, None], after_submit=forge)
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert result.leftovers == []
    assert len([a for a in result.attempts if a.worker == "w" * 120]) == rows
    assert timeline_problems(result) == []


@in_virtual_time
async def test_a_dead_map_straggler_is_backed_up_before_its_lease_lapses(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """A worker dies in a map attempt (WorkerCrashed: nothing after it runs). Its attempt
    row must stay 'running', as a killed process leaves it, so a backup runs it again long
    before its message's lease (60 s) lapses. The map attempt's error handler caught the
    crash as a failure and ended the row 'failed' from beyond the grave: no backup ever saw
    a straggler (the task waited for its lease), and the timeline said it failed."""
    seen: dict[str, Any] = {}

    async def crash(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "map.partly_sent" and "context" not in seen:
            seen["context"], seen["worker"] = context, rt.worker_id
            raise WorkerCrashed(at)

    result = await _chaos(data, tmp_path / "out", pool, [crash, None, None])
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    task = seen["context"]["task"]
    dead = [a for a in result.attempts if a.kind == "m" and a.worker == seen["worker"]]
    (d,) = [a for a in dead if a.task == task]
    assert d.outcome == "abandoned"
    (b,) = _backups(result, "m")
    assert (b.task, b.outcome) == (task, "committed")
    assert b.started - d.started < 60  # (the job then waits for the dead worker's claims)
    assert timeline_problems(result) == [] and result.leftovers == []


@in_virtual_time
async def test_a_map_that_died_after_its_commit_wastes_no_backup(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """A worker dies between a map's commit and its row's end (the row says 'running'
    forever), and a reduce straggles. The map is done: it must take no backup, and the
    reduce must get its own. The rows alone made the map look like the oldest straggler
    (a backup was reserved, the job's whole map allowance, found the commit and did
    nothing), and reduce backups waited for every map row to end: never (found by review,
    2026-11-29)."""
    seen: dict[str, Any] = {}

    async def crash(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "map.committed" and "crashed" not in seen:
            seen["crashed"], seen["dead"] = context, rt.worker_id
            raise WorkerCrashed(at)

    async def stall(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "reduce.output_written" and "stalled" not in seen:
            seen["stalled"] = context
            await asyncio.sleep(STALL_S)

    result = await _chaos(data, tmp_path / "out", pool, [crash, stall, None])
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert "backups_map" not in result.record and not _backups(result, "m")
    (b,) = _backups(result, "r")
    assert (b.task, b.outcome) == (seen["stalled"]["partition"], "committed")
    # The timeline still names the dead worker's attempt the winner: the commit says so.
    (won,) = [
        a
        for a in result.attempts
        if a.kind == "m" and a.task == seen["crashed"]["task"] and a.outcome == "committed"
    ]
    assert won.worker == seen["dead"]
    assert timeline_problems(result) == [] and result.leftovers == []
