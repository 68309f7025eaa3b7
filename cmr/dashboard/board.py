"""The dashboard's read model: what the page shows, read from the store and nothing else.

Each poll of the page costs the store one query of the job list (``pk=jobs``: one request for
a thousand jobs), shared by every open page for ``FRESH_S``, and then reads only the jobs of
the page asked for that can still change. A job that ended and was cleaned up never changes
again (cleanup is its last write; its record and timeline stay as they are), so its summary
and detail are read once and kept: a store with a thousand finished jobs costs what one
with none does, plus its list. The shown job's cost is the exception: its usage rows are
read at each poll (one query a step), as its processes write them after its cleanup too.

The documents are ``cmr status --json``'s (:func:`cmr.cli.jobs._record_json` and
``_step_json``, reused, so the two never disagree), with what the page adds: throughput, the
duplicates each of the three methods filtered, counters, the tasks' attempts and failures.
Every field comes from the table, strangers' data: what is used is checked, what is shown
is bounded.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from cmr import attempts, clock, cost, counters, pipeline, watch, wire, workers
from cmr.backends.base import Backend
from cmr.cli.jobs import _record_json, _step_json
from cmr.errors import NotFound, WireError
from cmr.failures import headline
from cmr.prices import Prices
from cmr.prices import load as load_prices
from cmr.records import FINAL_STATES, JOBS_PK, JobSpec, JobState, job_pk

FRESH_S = 0.5  # the job list read by one poll serves the others this long (several pages open)
PAGE = 50  # jobs a page of the list shows
MAX_PAGE = 200
READS_AT_ONCE = 8  # jobs of a page read concurrently
KEPT_DETAILS = 64  # finished jobs' details kept (each may hold thousands of attempts)
MAX_ID = 200  # characters of a job id shown, from a row that holds no job id
MAX_ERROR = 300  # characters of an error's headline
MAX_ATTEMPTS = 5_000  # attempts of one step sent to the page
MAX_WORKERS = 200  # workers sent to the page, the latest beat first (a fleet's, or a test's many)
STATES = frozenset(s.value for s in JobState)

# The duplicates each of the three documented methods filtered (DESIGN.md, "Duplicate
# messages"), by the job record's counters.
DUPLICATES = {
    "method1": ("map_attempts_filtered", "map_duplicates_skipped"),
    "method2": ("batches_dropped", "batches_filtered"),
    "method3": ("reduce_conflicts",),
}
# What a summary in the list keeps of the record's document.
_SUMMARY = (
    "job",
    "state",
    "started",
    "ended",
    "duration_s",
    "progress",
    "input",
    "input_bytes",
    "bytes_in",
    "records_in",
    "records_out",
    "output",
    "progress_bytes",
)


def _count(value: Any) -> int:
    """A counter from a record: a non-negative int, else 0 (a record edited by hand)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _line(value: Any) -> str:
    """An error's first line, bounded: what a row of the page has room for."""
    if not isinstance(value, str) or not value.strip():
        return ""
    return headline(value)[0][:MAX_ERROR]


def plain(value: Any) -> Any:
    """``value`` as JSON data: bytes and other types as text, non-finite floats as null (a
    browser's JSON.parse refuses NaN), map keys as strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def duplicates(record: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The duplicates each method filtered, as the job record counts them."""
    return {m: {k: _count(record.get(k)) for k in keys} for m, keys in DUPLICATES.items()}


def throughput(doc: dict[str, Any]) -> float | None:
    """MB read per second: the input read (exact once a job succeeded, else the maps'
    running count) over the time it has taken so far."""
    seconds = _number(doc.get("duration_s"))
    read = doc.get("bytes_in") if _count(doc.get("bytes_in")) else doc.get("progress_bytes")
    if not seconds or not _count(read):
        return None
    return round(_count(read) / 1e6 / seconds, 6)


def _unreadable(job_id: str, why: str, created: float | None) -> dict[str, Any]:
    return {
        "job": job_id[:MAX_ID],
        "state": "unreadable",
        "started": created,
        "ended": None,
        "duration_s": None,
        "progress": None,
        "error": why[:MAX_ERROR],
    }


class _Fresh:
    """One value read at most once every ``fresh_s``, the read shared by concurrent askers."""

    def __init__(self, read: Callable[[], Awaitable[Any]], fresh_s: float) -> None:
        self.read = read
        self.fresh_s = fresh_s
        self.at = -math.inf
        self.value: Any = None
        self.pending: asyncio.Future[Any] | None = None

    async def get(self) -> Any:
        if clock.monotonic() - self.at < self.fresh_s:
            return self.value
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.read())
            pending = self.pending
            try:
                self.value = await asyncio.shield(pending)
                self.at = clock.monotonic()
            finally:
                self.pending = None
            return self.value
        return await asyncio.shield(self.pending)


class Board:
    """What the page shows of one store. One per server; it keeps the finished jobs."""

    def __init__(self, backend: Backend, *, store: str = "", fresh_s: float = FRESH_S) -> None:
        self.backend = backend
        self._prices: Prices | None = None
        self.store = store  # the store's URL, for the page's header
        self.summaries: dict[str, dict[str, Any]] = {}  # finished, cleaned jobs: never change
        self.details: OrderedDict[str, dict[str, Any]] = OrderedDict()  # the same, latest used
        self.index = _Fresh(self._read_index, fresh_s)
        self.gate = asyncio.Semaphore(READS_AT_ONCE)

    async def _read_index(self) -> list[tuple[str, float, str]]:
        """The job list: (job id, created, state) of each row, the newest first. A row that
        is not one cmr wrote (no string id) is left out; an id that is no job id is kept,
        to be shown as unreadable."""
        rows = []
        for row in await self.backend.table.query(JOBS_PK):
            sk = row.get("sk")
            if not isinstance(sk, str) or not sk:
                continue
            created = _number(row.get("created")) or 0.0
            state = row.get("state")
            rows.append((sk, created, state if state in STATES else "unknown"))
        rows.sort(key=lambda r: (r[1], r[0]), reverse=True)
        return rows

    async def jobs(
        self, offset: int = 0, limit: int = PAGE, state: str | None = None
    ) -> dict[str, Any]:
        """A page of the job list, the newest first, with how many jobs are in each state."""
        rows: list[tuple[str, float, str]] = await self.index.get()
        states: dict[str, int] = {}
        for _, _, s in rows:
            states[s] = states.get(s, 0) + 1
        chosen = [r for r in rows if state is None or r[2] == state]
        page = chosen[offset : offset + limit]
        found = await asyncio.gather(*(self._summary(sk, created) for sk, created, _ in page))
        return {
            "now": clock.wall(),
            "store": self.store,
            "total": len(chosen),
            "offset": offset,
            "limit": limit,
            "states": states,
            "jobs": found,
        }

    async def _summary(self, job_id: str, created: float) -> dict[str, Any]:
        kept = self.summaries.get(job_id)
        if kept is not None:
            return kept
        if not wire.is_job_id(job_id):
            return _unreadable(job_id, "not a job id: a row cmr did not write", created)
        async with self.gate:
            try:
                steps = await pipeline.chain(self.backend, job_id)
            except (NotFound, WireError) as exc:
                return _unreadable(job_id, str(exc), created)
            spec, rec = steps[-1]
            p = await watch.progress(self.backend, spec)
        row = {"created": created}
        doc = _record_json(spec, rec, p, {**steps[0][1], **row})
        summary = {k: plain(doc.get(k)) for k in _SUMMARY}
        summary.update(
            step=spec.step + 1,
            steps=spec.job_steps,
            throughput_mb_s=throughput(doc),
            error=_line(rec.get("error")),
            duplicates=duplicates(rec),
        )
        if _settled(spec, rec):
            self.summaries[job_id] = summary
        return summary

    async def job(self, job_id: str) -> dict[str, Any]:
        """One job (a pipeline: its run, step by step): its record's document, and for each
        step its counters, duplicates, failures and the attempts of its tasks. NotFound when
        the store has no such job."""
        if not wire.is_job_id(job_id):
            raise NotFound("not a job id")
        kept = self.details.get(job_id)
        if kept is not None:
            self.details.move_to_end(job_id)
            return {**kept, "cost": await self._cost(kept), "now": clock.wall()}
        steps = await pipeline.chain(self.backend, job_id)
        spec, rec = steps[-1]
        first = steps[0][1]
        p = await watch.progress(self.backend, spec)
        doc = _record_json(spec, rec, p, first)
        doc.pop("inputs", None)  # the input's file list: long, and `cmr status` has it
        doc = plain(doc)
        doc["job"] = spec.pipeline_id
        doc["throughput_mb_s"] = throughput(doc)
        doc["error"] = rec.get("error") if isinstance(rec.get("error"), str) else ""
        doc["steps"] = await asyncio.gather(*(self._step(s, r) for s, r in steps))
        doc["counters"] = counters.of_record(rec)
        doc["duplicates"] = _summed(s["duplicates"] for s in doc["steps"])
        if _settled(spec, rec):
            self.details[job_id] = doc
            while len(self.details) > KEPT_DETAILS:
                self.details.popitem(last=False)
        return {**doc, "cost": await self._cost(doc), "now": clock.wall()}

    async def _cost(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The job's cost so far (cmr.cost), read at every poll, never kept: its processes
        write their usage rows again after its cleanup and as they stop. One query a step."""
        steps = [str(s["job"]) for s in doc.get("steps", []) if isinstance(s, dict)]
        if self._prices is None:
            self._prices = load_prices()  # the shipped table with CMR_PRICES over it, once
        priced = (await cost.run_cost(self.backend, steps, self._prices)).to_json()
        return {str(k): plain(v) for k, v in priced.items()}

    async def _step(self, spec: JobSpec, rec: dict[str, Any]) -> dict[str, Any]:
        tries, failures = await asyncio.gather(
            attempts.attempts(self.backend, spec.job_id), self._failures(spec.job_id)
        )
        return {
            **plain(_step_json(spec, rec)),
            "error": _line(rec.get("error")),
            "counters": counters.of_record(rec),
            "duplicates": duplicates(rec),
            "failures": failures,
            "attempts": [a.to_json() for a in tries[:MAX_ATTEMPTS]],
            "attempts_total": len(tries),
        }

    async def _failures(self, job_id: str) -> list[dict[str, Any]]:
        """The tasks that failed or were started again, while the job keeps their records
        (cleanup deletes them; the timeline's failed attempts then say it)."""
        found = []
        for item in await self.backend.table.query(job_pk(job_id), prefix="fail#"):
            sk = str(item.get("sk", ""))[len("fail#") :]
            if sk[:1] not in ("m", "r") or not sk[1:].isdigit() or len(sk) > 12:
                continue
            found.append(
                {
                    "kind": "map" if sk[0] == "m" else "reduce",
                    "task": int(sk[1:]),
                    "failures": _count(item.get("count")),
                    "starts": _count(item.get("starts")),
                    "error": _line(item.get("error")),
                }
            )
        return found

    async def workers(self) -> dict[str, Any]:
        now = clock.wall()
        seen = await workers.seen(self.backend)
        return {
            "now": now,
            "total": len(seen),
            "workers": [w.to_json(now) for w in seen[:MAX_WORKERS]],
        }


def _settled(spec: JobSpec, rec: dict[str, Any]) -> bool:
    """Whether the run has ended for good and was cleaned up: nothing of it changes again. A
    step that succeeded and is not the last hands over to the next: not ended."""
    state = rec.get("state")
    ended = state in FINAL_STATES and (spec.final or state != JobState.SUCCEEDED.value)
    return ended and rec.get("cleaned") is True


def _summed(docs: Any) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {m: dict.fromkeys(keys, 0) for m, keys in DUPLICATES.items()}
    for doc in docs:
        for method, names in doc.items():
            for name, n in names.items():
                total[method][name] += n
    return total
