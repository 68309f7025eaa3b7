"""Task attempts: who ran which task, when, and how it ended; the timeline a job keeps.

Every map attempt and every reduce claim writes one row when it starts and updates it when
it ends. They are what the dashboard draws and what straggler backups (:mod:`cmr.backup`)
judge: a task running far longer than its finished peers. The rows are

    pk=job#<id>  sk=att#m<task>#<attempt>     a map attempt (its attempt id)
    pk=job#<id>  sk=att#r<partition>#<token>  a reduce claim (its claim token)

with ``worker``, ``host``, ``started``, ``ended`` (absent while it runs), ``outcome``,
``error`` (a failure's headline) and ``backup`` (started as a straggler's backup).

A job's cleanup deletes its task records; before it does, it folds the attempts into
``sk=timeline#<n>`` items (written once: the first complete fold stands), so a finished job
keeps its timeline next to its record. Rows and timelines are strangers' data to whoever
reads them: each field is checked and bounded, and a row that fails is skipped, not trusted.

Attempts write their rows through :mod:`cmr.tracking`; this module reads, checks and folds
them (and so imports nothing of the job's lifecycle, which folds them at cleanup).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from cmr.backends.base import Backend, item_absent
from cmr.backends.items import item_bytes
from cmr.errors import ConditionFailed
from cmr.records import job_pk, task_of

Kind = Literal["m", "r"]
OUTCOMES = frozenset({"running", "committed", "lost", "failed", "released", "abandoned"})
MAX_ERROR = 300  # characters of a failure's headline kept in a row
MAX_ID = 120  # worker ids, hosts, attempt ids
TIMELINE_ROWS = 2_000  # attempts per timeline item at most
TIMELINE_BYTES = 256 * 1024  # and bytes: a table item holds 400 KB (DynamoDB)
PREFIX = "att#"
TIMELINE = "timeline#"


def row_sk(kind: Kind, task: int, attempt: str) -> str:
    return f"{PREFIX}{kind}{task:06d}#{attempt}"


@dataclass(frozen=True)
class Attempt:
    kind: Kind
    task: int  # the map task, or the partition
    attempt: str  # the map attempt id, or the claim token
    worker: str
    host: str
    started: float  # wall clock of the worker that ran it
    ended: float | None
    outcome: str
    error: str = ""
    backup: bool = False

    @property
    def running(self) -> bool:
        return self.ended is None

    def seconds(self, now: float) -> float:
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "map" if self.kind == "m" else "reduce",
            "task": self.task,
            "attempt": self.attempt,
            "worker": self.worker,
            "host": self.host,
            "started": self.started,
            "ended": self.ended,
            "outcome": self.outcome,
            "error": self.error,
            "backup": self.backup,
        }

    def to_row(self) -> list[Any]:
        return [
            self.kind,
            self.task,
            self.attempt,
            self.worker,
            self.host,
            self.started,
            self.ended,
            self.outcome,
            self.error,
            self.backup,
        ]


def _text(value: Any, most: int) -> str:
    if not isinstance(value, str) or len(value) > most:
        raise ValueError("not a bounded string")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e11:
        raise ValueError("not a time")
    return float(value)


def _checked(
    kind: Any,
    task: Any,
    attempt: Any,
    worker: Any,
    host: Any,
    started: Any,
    ended: Any,
    outcome: Any,
    error: Any,
    backup: Any,
) -> Attempt:
    if kind not in ("m", "r") or isinstance(task, bool) or not isinstance(task, int):
        raise ValueError("not a task")
    if not 0 <= task < 10**6 or outcome not in OUTCOMES or not isinstance(backup, bool):
        raise ValueError("not an attempt")
    return Attempt(
        kind,
        task,
        _text(attempt, MAX_ID),
        _text(worker, MAX_ID),
        _text(host, MAX_ID),
        _time(started),
        None if ended is None else _time(ended),
        outcome,
        _text(error, MAX_ERROR),
        backup,
    )


def from_item(item: dict[str, Any]) -> Attempt | None:
    """The attempt a row holds, or None if it is not one (a stranger's or damaged row)."""
    sk = item.get("sk")
    if not isinstance(sk, str) or not sk.startswith(PREFIX) or "#" not in sk[len(PREFIX) :]:
        return None
    head, _, attempt = sk[len(PREFIX) :].partition("#")
    try:
        return _checked(
            head[:1],
            int(head[1:]) if head[1:].isdigit() else None,
            attempt,
            item.get("worker"),
            item.get("host"),
            item.get("started"),
            item.get("ended"),
            item.get("outcome"),
            item.get("error", ""),
            item.get("backup", False),
        )
    except (ValueError, TypeError):
        return None


async def attempts(
    backend: Backend, job_id: str, *, consistent: bool = True, live: bool = False
) -> list[Attempt]:
    """The job's attempts, from its rows while it has them, else (unless ``live``) from its
    timeline (after cleanup). Sorted by kind, task and start."""
    pk = job_pk(job_id)
    rows = await backend.table.query(pk, prefix=PREFIX, consistent=consistent)
    found = [a for a in map(from_item, rows) if a is not None]
    if not rows and not live:
        for item in await backend.table.query(pk, prefix=TIMELINE, consistent=consistent):
            found.extend(_unfold(item.get("rows")))
    return sorted(found, key=lambda a: (a.kind, a.task, a.started))


def _unfold(rows: Any) -> list[Attempt]:
    if not isinstance(rows, list):
        return []
    found = []
    for row in rows[:TIMELINE_ROWS]:
        if isinstance(row, list) and len(row) == 10:
            with contextlib.suppress(ValueError, TypeError):
                found.append(_checked(*row))
    return found


async def fold(backend: Backend, job_id: str) -> None:
    """Keep the ended job's attempts as its timeline, before cleanup deletes the rows. Each
    item is written once: a cleanup run again after a partial delete finds the first fold
    standing and leaves it (the rows it would read are fewer by then).

    The commit records have the last word on who won: an attempt killed between its commit
    and its row's end is the winner all the same, and the rest still 'running' when the job
    ended were abandoned (their workers died, or the job ended under them)."""
    pk = job_pk(job_id)
    # Not the whole partition: a blob job's pages alone may be tens of thousands of items.
    maps, reduces, items = await asyncio.gather(
        backend.table.query(pk, prefix="map#"),
        backend.table.query(pk, prefix="reduce#"),
        backend.table.query(pk, prefix=PREFIX),
    )
    won = {("m", task_of(str(i["sk"]))): i.get("attempt") for i in maps if _is(i, "map#")}
    won |= {
        ("r", int(str(i["sk"])[len("reduce#") :])): i.get("token")
        for i in reduces
        if _is(i, "reduce#") and i.get("state") == "committed"
    }
    rows = sorted(
        (_settled(a, won.get((a.kind, a.task))) for a in map(from_item, items) if a),
        key=lambda a: (a.kind, a.task, a.started),
    )
    for n, chunk in enumerate(_chunks([a.to_row() for a in rows])):
        with contextlib.suppress(ConditionFailed):
            await backend.table.put(
                pk, f"{TIMELINE}{n:04d}", {"rows": chunk}, condition=item_absent()
            )


def _chunks(rows: list[list[Any]]) -> list[list[list[Any]]]:
    """The rows cut into timeline items of at most TIMELINE_ROWS rows and TIMELINE_BYTES
    (a row may take 1.5 KB: a 300-character error in 4-byte characters), the same cut for
    the same rows (each item is written once, whoever folds)."""
    chunks: list[list[list[Any]]] = []
    size = TIMELINE_BYTES + 1
    for row in rows:
        n = item_bytes(row) + 1
        if size + n > TIMELINE_BYTES or len(chunks[-1]) >= TIMELINE_ROWS:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += n
    return chunks


def _is(item: dict[str, Any], prefix: str) -> bool:
    sk = item.get("sk")
    if not isinstance(sk, str) or not sk.startswith(prefix):
        return False
    n = sk[len(prefix) :]
    # ASCII digits only: '²' is a digit to str.isdigit(), and int() refuses it.
    return n.isascii() and n.isdigit()


def _settled(a: Attempt, winner: object) -> Attempt:
    if a.attempt == winner:
        outcome = "committed"
    elif a.outcome in ("running", "committed"):
        outcome = "abandoned" if a.ended is None else "lost"
    else:
        outcome = a.outcome
    return dataclasses.replace(a, outcome=outcome)
