"""The workers seen lately: each worker's row in the table, beaten every BEAT_S.

    pk=workers  sk=<worker id>  host, pid, started, beat, busy, slots, jobs, tasks_done,
                                stopped (when it stopped in order)

Nothing depends on these rows: no protocol reads them, so a worker that cannot write its
row carries on. They are for people (`cmr dashboard`) and for sizing a fleet. Each worker
writes only its own row, whole (a repeated write changes nothing); rows whose beat is older
than FORGET_S are deleted by any worker's occasional sweep, conditionally on the very beat
it read, so a worker that beats again meanwhile keeps its row. Rows are strangers' data to
their readers: checked and bounded, and a row that fails is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

from cmr import clock, usage
from cmr.backends.base import Backend, Eq
from cmr.errors import BackendError, ConditionFailed
from cmr.records import WORKERS_PK

BEAT_S = 10.0  # one write a worker every 10 s: 8,640 a day, ~$0.005 a day on DynamoDB
FORGET_S = 3600.0  # a row silent this long is a worker gone: swept
SWEEP_EVERY = 30  # beats between a worker's sweeps (5 minutes)
MAX_JOBS = 20  # job ids a row lists
MAX_TEXT = 120


@dataclass(frozen=True)
class WorkerRow:
    worker: str
    host: str
    pid: int
    started: float
    beat: float  # the worker's wall clock at its last beat
    busy: int  # tasks running
    map_slots: int
    reduce_slots: int
    jobs: tuple[str, ...]
    tasks_done: int
    stopped: float | None = None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = clock.wall() if now is None else now
        return {
            "worker": self.worker,
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "beat": self.beat,
            "silent_s": round(max(0.0, now - self.beat), 1),
            "busy": self.busy,
            "slots": {"map": self.map_slots, "reduce": self.reduce_slots},
            "jobs": list(self.jobs),
            "tasks_done": self.tasks_done,
            "stopped": self.stopped,
        }


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise ValueError("not a count")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e11:
        raise ValueError("not a time")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError("not a bounded string")
    return value


def from_item(item: dict[str, Any]) -> WorkerRow | None:
    """The row's worker, or None if it is not one (a stranger's or damaged row)."""
    try:
        jobs = item.get("jobs", [])
        if not isinstance(jobs, list) or len(jobs) > MAX_JOBS:
            raise ValueError("not a list of jobs")
        stopped = item.get("stopped")
        return WorkerRow(
            _text(item.get("sk")),
            _text(item.get("host")),
            _count(item.get("pid")),
            _time(item.get("started")),
            _time(item.get("beat")),
            _count(item.get("busy")),
            _count(item.get("map_slots")),
            _count(item.get("reduce_slots")),
            tuple(_text(j) for j in jobs),
            _count(item.get("tasks_done")),
            None if stopped is None else _time(stopped),
        )
    except (ValueError, TypeError):
        return None


async def seen(backend: Backend, within_s: float = FORGET_S) -> list[WorkerRow]:
    """The workers that beat within ``within_s`` (by their own clocks, against ours: for
    people, not protocols), the latest beat first."""
    now = clock.wall()
    rows = [w for w in map(from_item, await backend.table.query(WORKERS_PK)) if w is not None]
    return sorted((w for w in rows if now - w.beat <= within_s), key=lambda w: w.beat, reverse=True)


class Beat:
    """A worker's row, written every BEAT_S while it runs and once more as it stops."""

    def __init__(self, backend: Backend, worker_id: str, map_slots: int, reduce_slots: int) -> None:
        self.backend = backend
        self.worker_id = worker_id[:MAX_TEXT]
        self.started = clock.wall()
        self.fixed = {
            "host": socket.gethostname()[:MAX_TEXT],
            "pid": os.getpid(),
            "started": self.started,
            "map_slots": map_slots,
            "reduce_slots": reduce_slots,
        }
        self.beats = 0

    async def write(self, busy: int, jobs: list[str], tasks_done: int, *, stopped: bool) -> None:
        item: dict[str, Any] = {
            **self.fixed,
            "beat": clock.wall(),
            "busy": busy,
            "jobs": [j[:MAX_TEXT] for j in jobs[:MAX_JOBS]],
            "tasks_done": tasks_done,
            # The fleet's overhead (cmr.usage): this process's requests for no job, and its
            # idle seconds, as of the last beat. cmr.cost.fleet_overhead reads them.
            "usage": usage.overhead(),
            "usage_process": usage.process_id(),
        }
        if stopped:
            item["stopped"] = item["beat"]
        await self.backend.table.put(WORKERS_PK, self.worker_id, item)
        self.beats += 1
        if self.beats % SWEEP_EVERY == 1 and not stopped:
            await self.sweep()

    async def sweep(self) -> None:
        """Delete the rows of workers silent for FORGET_S."""
        now = clock.wall()
        for item in await self.backend.table.query(WORKERS_PK, consistent=False):
            beat = item.get("beat")
            if isinstance(beat, int | float) and now - beat > FORGET_S:
                with contextlib.suppress(ConditionFailed):
                    await self.backend.table.delete(
                        WORKERS_PK, str(item["sk"]), condition=Eq("beat", beat)
                    )

    async def loop(self, state: Any) -> None:
        """Beat until cancelled, reading ``state`` (the worker: busy, jobs, tasks_done); the
        last beat says it stopped. A failed beat is skipped: nothing depends on the row."""
        try:
            while True:
                with contextlib.suppress(BackendError):
                    await self.write(state.busy, state.job_ids(), state.tasks_done, stopped=False)
                await asyncio.sleep(BEAT_S)
        except asyncio.CancelledError:
            with contextlib.suppress(BackendError):
                await asyncio.shield(
                    self.write(state.busy, state.job_ids(), state.tasks_done, stopped=True)
                )
            raise
