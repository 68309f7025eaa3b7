"""Backup attempts for stragglers (cmr.backup): a worker alive but far slower than its
peers (it keeps every lease, so nothing is ever redelivered) must not hold the job back.
On the virtual clock: the straggler sleeps STALL_S inside its task, leases renewed; with
backups the job ends long before that, exact; without them it waits it out."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr import backup, clock
from cmr.attempts import Attempt
from cmr.backends.faults import FaultPlan
from cmr.runtime import Runtime
from cmr.settings import WorkerSettings
from cmr.testing import (
    ChaosResult,
    chaos_run,
    diff_outputs,
    read_output,
    sequential,
    timeline_problems,
)
from cmr.virtualtime import in_virtual_time

WORDCOUNT = "examples/wordcount.py"
STALL_S = 3_000.0  # the straggler's stall: 50 leases of 60 s, renewed all along
REDUCERS = 4


@pytest.fixture
def data(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for n in range(8):
        (src / f"{n}.txt").write_text(f"w{n} common x{n % 3}\n" * 200)
    return src


def straggle_at(step: str) -> tuple[Any, dict[str, Any]]:
    """A hook that stalls the first task reaching ``step`` for STALL_S, leases renewed."""
    seen: dict[str, Any] = {}

    async def hook(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == step and "context" not in seen:
            seen["context"], seen["worker"] = context, rt.worker_id
            await asyncio.sleep(STALL_S)

    return hook, seen


async def _run(
    data: Path, out: Path, pool: Executor, step: str, *, backups: bool, shuffle: str = "queue"
) -> tuple[ChaosResult, dict[str, Any], float]:
    hook, seen = straggle_at(step)
    started = clock.monotonic()
    result = await chaos_run(
        WORDCOUNT,
        data,
        out,
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[hook, None, None],
        workers=3,
        reducers=REDUCERS,
        visibility_s=60,
        split_bytes=2048,
        clientless=True,
        shuffle=shuffle,
        timeout_s=2 * STALL_S,
        settings=WorkerSettings(
            map_slots=1, reduce_slots=2, processes=1, memory_mb=1, backups=backups
        ),
    )
    return result, seen, clock.monotonic() - started


def _exact(data: Path, out: Path) -> bool:
    return diff_outputs(sequential(WORDCOUNT, data, REDUCERS), read_output(out, REDUCERS)) == []


def _backups(result: ChaosResult, kind: str) -> list[Attempt]:
    return [a for a in result.attempts if a.kind == kind and a.backup]


@pytest.mark.parametrize("shuffle", ["queue", "blob"])
@in_virtual_time
async def test_a_straggling_map_task_is_backed_up_and_the_first_commit_wins(
    data: Path, pool: Executor, tmp_path: Path, shuffle: str
) -> None:
    # Stalled with its output partly sent (queue) or stored but not committed (blob).
    step = "map.partly_sent" if shuffle == "queue" else "map.shuffle_written"
    result, seen, took = await _run(
        data, tmp_path / "out", pool, step, backups=True, shuffle=shuffle
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert took < STALL_S / 10, took
    task = seen["context"]["task"]
    (b,) = _backups(result, "m")
    assert (b.task, b.outcome) == (task, "committed") and b.worker != seen["worker"]
    straggler = [a for a in result.attempts if a.kind == "m" and a.task == task and not a.backup]
    assert [a.outcome for a in straggler] == ["abandoned"]  # it never got to end
    assert result.record["backups_map"] == 1 and "backups_reduce" not in result.record
    assert timeline_problems(result) == [] and result.leftovers == []


@pytest.mark.parametrize("shuffle", ["queue", "blob"])
# Stalled while it drains (holding batches, on the queue shuffle: they come back when its
# beat is refused), or with its output written but not committed (its commit is fenced).
@pytest.mark.parametrize("step", ["reduce.draining", "reduce.output_written"])
@in_virtual_time
async def test_a_straggling_reduce_is_taken_over_by_a_fenced_backup(
    data: Path, pool: Executor, tmp_path: Path, shuffle: str, step: str
) -> None:
    result, seen, took = await _run(
        data, tmp_path / "out", pool, step, backups=True, shuffle=shuffle
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert _exact(data, tmp_path / "out")
    assert took < STALL_S / 10, took
    p = seen["context"]["partition"]
    (b,) = _backups(result, "r")
    assert (b.task, b.outcome) == (p, "committed") and b.worker != seen["worker"]
    assert result.record["backups_reduce"] == 1
    # One committed attempt per partition: the straggler's output never counted.
    assert timeline_problems(result) == [] and result.leftovers == []


@in_virtual_time
async def test_without_backups_the_job_waits_for_its_straggler(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    result, _, took = await _run(data, tmp_path / "out", pool, "map.partly_sent", backups=False)
    assert result.record["state"] == "succeeded"
    assert took >= STALL_S
    assert not _backups(result, "m") and "backups_map" not in result.record


def _attempt(task: int, worker: str, started: float, ended: float | None, **kw: Any) -> Attempt:
    outcome = kw.pop("outcome", "committed" if ended is not None else "running")
    return Attempt("m", task, f"a{task}{worker}", worker, "h", started, ended, outcome, **kw)


def test_a_straggler_is_chosen_only_far_past_its_peers_and_never_twice() -> None:
    done = [_attempt(t, "w1", 0.0, 2.0) for t in range(6)]
    slow = _attempt(6, "w2", 2.0, None)
    slower = _attempt(7, "w2", 0.5, None)
    # Too young (under MIN_AGE_S and FACTOR x the 2 s median, 4 s): nobody yet, but soon.
    assert backup.choose([*done, slow], "m", 8, "w1", now=5.5) == backup.Verdict(None, 0.5)
    picked = backup.choose([*done, slow, slower], "m", 8, "w1", now=5.5).straggler
    assert picked is not None and picked.attempt is slower and picked.age_s == 5.0
    assert picked.peers_s == 2.0
    # Not our own, not one with a backup already, not before half the tasks are done.
    nobody = backup.Verdict(None, None)
    assert backup.choose([*done, slow], "m", 8, "w2", now=60.0) == nobody
    backed = _attempt(6, "w3", 50.0, None, backup=True)
    assert backup.choose([*done, slow, backed], "m", 8, "w1", now=60.0) == nobody
    assert backup.choose([*done[:3], slow], "m", 8, "w1", now=60.0) == nobody
    # A task someone committed needs no backup, whoever still runs it.
    committed = _attempt(6, "w3", 1.0, 3.0)
    assert backup.choose([*done, slow, committed], "m", 8, "w1", 60.0) == nobody
    # At most a tenth of a job's tasks, at least one.
    assert [backup.cap(n) for n in (1, 9, 10, 25, 1000)] == [1, 1, 1, 2, 100]


@in_virtual_time
async def test_a_paused_straggler_wakes_to_a_refused_commit(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """The straggler is paused (renewing nothing: a SIGSTOPped process) with the partition
    reduced, while a backup takes its claim over; it wakes, its commit is refused, and the
    backup's output is the one that counts."""
    pause_s = 40.0  # past the backup's threshold, within the batches' first lease
    seen: dict[str, Any] = {}

    async def pause(rt: Runtime, at: str, context: dict[str, Any]) -> None:
        if at == "reduce.output_written" and "context" not in seen:
            seen["context"], seen["worker"] = context, rt.worker_id
            rt.awake.clear()
            await asyncio.sleep(pause_s)
            rt.awake.set()

    started = clock.monotonic()
    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[pause, None, None],
        workers=3,
        reducers=REDUCERS,
        visibility_s=60,
        split_bytes=2048,
        clientless=True,
        shuffle="queue",
        settings=WorkerSettings(map_slots=1, reduce_slots=2, processes=1, memory_mb=1),
    )
    took = clock.monotonic() - started
    assert result.record["state"] == "succeeded" and _exact(data, tmp_path / "out")
    (b,) = _backups(result, "r")
    assert b.task == seen["context"]["partition"] and b.outcome == "committed"
    assert took < pause_s + 30, took
    assert timeline_problems(result) == [] and result.leftovers == []
