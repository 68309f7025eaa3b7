"""``cmr status | wait | cancel | cleanup``: look after jobs that outlive their client (aws).

Given no store (no --store, --backend or part of one, no $CMR_STORE), they look where the
named job was submitted when it is one of the recent jobs remembered, else where the last
``cmr run`` ran (:mod:`cmr.cli.laststore`), and say so on stderr; a job on the embedded
backend lived in its `cmr run` process alone, and they say that instead, with where its
output is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.text import Text

from cmr.cli import laststore
from cmr.cli.exits import Interrupted, ended, interruptible
from cmr.cli.options import (
    STORE_ENV,
    StoreFlags,
    Verbose,
    configure_logs,
    err,
    fail,
    out,
    safe_text,
    shared,
)
from cmr.cli.tables import keep_whole, print_table
from cmr.errors import JobFailed, StoreMissing, UsageError
from cmr.settings import AwsSettings, BackendName, Store

if TYPE_CHECKING:
    from cmr.backends.base import Backend
    from cmr.publish import Manifest
    from cmr.records import JobSpec
    from cmr.watch import Progress

T = TypeVar("T")
JobId = Annotated[str, typer.Argument(help="the job id")]
_PARTS = ("backend", "bucket", "table", "queue_prefix", "region", "profile")


def shown(store: Store) -> str:
    """A store's URL as the user would type it (no empty query)."""
    return store.url.removesuffix("?")


@dataclass(frozen=True)
class Where:
    """The store these commands look in, and why that one."""

    store: Store
    why: str  # "" when the command line named it
    last: laststore.LastRun | None  # the job's own run when remembered, else the last run


def where(flags: StoreFlags, job: str | None = None) -> Where:
    """Command-line flags, then $CMR_STORE, then the store ``job`` was submitted to (when
    remembered), then the store of the last `cmr run`, then the default aws store: the first
    that says anything. Nothing here creates a bucket or table."""
    own = laststore.recall_job(job) if job is not None else None
    last = own or laststore.recall()
    env = os.environ.get(STORE_ENV)
    from_env = bool(env) and flags.store is not None and flags.store == _parsed(env)
    if any(getattr(flags, n) is not None for n in _PARTS) or (
        flags.store is not None and not from_env
    ):
        return Where(flags.resolve(BackendName.aws, create=False), "", last)
    if from_env:
        return Where(flags.resolve(BackendName.aws, create=False), f"from ${STORE_ENV}", last)
    if own is not None:
        store = Store(own.store.backend, _no_create(own.store))
        return Where(store, f"the store job {own.job_id} was submitted to", own)
    if last is not None:
        store = Store(last.store.backend, _no_create(last.store))
        return Where(store, f"the store of your last `cmr run`, job {last.job_id}", last)
    store = flags.resolve(BackendName.aws, create=False)
    return Where(store, "the default store: no `cmr run` remembered; --store names another", None)


def _parsed(text: str | None) -> Store | None:
    try:
        return Store.parse(text or "")
    except UsageError:
        return None


def _no_create(store: Store) -> AwsSettings:
    return replace(store.aws, create=False)


def announce(w: Where) -> None:
    """One stderr line saying which store is looked in and why (none when the user named it)."""
    if w.why and w.store.backend != BackendName.embedded:
        err.print(
            Text.assemble("looking in ", safe_text(shown(w.store)), f" ({w.why})"),
            highlight=False,
        )


@dataclass(frozen=True)
class EmbeddedRun:
    """The last run, which ran on the embedded backend, and what its output says of it."""

    last: laststore.LastRun
    manifest: Manifest | None  # its _SUCCESS, when the output holds the job's own

    @property
    def state(self) -> str:
        return "succeeded" if self.manifest is not None else "unknown"

    def sentence(self) -> str:
        job, output = self.last.job_id, self.last.output
        if self.manifest is not None:
            said = (
                f"job {job} ran on the embedded backend, in `cmr run` itself, and succeeded: "
                f"{self.manifest.records} records in {len(self.manifest.parts)} parts; its "
                f"output and _SUCCESS manifest are in {output}"
            )
        else:
            # Its state lives in its `cmr run` process alone: nothing here can tell whether
            # that process still runs, so both are said.
            said = (
                f"job {job} ran on the embedded backend, inside its own `cmr run` process "
                f"(submitted {_ago(self.last.at)}), where its state lives and ends with it: "
                "if that process still runs, it shows the job's progress; "
                f"{output} holds no _SUCCESS manifest of it (still running, or the run failed "
                "or was stopped, or a later run replaced its output)"
            )
        return said + f". {_KEEPS_NO_JOBS}"

    def to_json(self) -> dict[str, Any]:
        m, output = self.manifest, self.last.output
        return {
            "job": self.last.job_id,
            "store": "embedded",
            "state": self.state,
            "output": output,
            "published": {"place": output, "manifest": output.rstrip("/") + "/_SUCCESS"}
            if m is not None
            else None,
            "records_out": m.records if m is not None else None,
            "parts": len(m.parts) if m is not None else None,
        }


_KEEPS_NO_JOBS = (
    "The embedded backend keeps no jobs after the run: for a store that keeps them, run "
    "with --store aws://BUCKET/TABLE"
)


def embedded_run(w: Where, job: str | None) -> EmbeddedRun | None:
    """None when ``w`` is an aws store. On the embedded backend: the last run's report when
    it ran there and ``job`` is it (or no job is named); otherwise one error line."""
    if w.store.backend != BackendName.embedded:
        return None
    last = w.last if w.last is not None and w.last.store.backend == BackendName.embedded else None
    if last is None:
        fail(
            "the embedded backend keeps no state after `cmr run` ends; these commands are for "
            "a store that keeps jobs: --store aws://BUCKET/TABLE"
        )
    if job is not None and job != last.job_id:
        fail(
            f"job {job} is not known here: the embedded backend keeps no jobs once `cmr run` "
            f"ends (your last run, job {last.job_id}, ran there); give the store job {job} "
            "ran in: --store aws://BUCKET/TABLE"
        )
    return EmbeddedRun(last, _own_manifest(last))


def _own_manifest(last: laststore.LastRun) -> Manifest | None:
    """The output's _SUCCESS when it is the last run's own (a local output only)."""
    from cmr.publish import Manifest, OutputConflict

    if "://" in last.output:
        return None
    try:
        with open(os.path.join(last.output, "_SUCCESS"), "rb") as f:
            manifest = Manifest.from_bytes(f.read(1 << 24))
    except (OSError, OutputConflict):
        return None
    return manifest if manifest.job == last.job_id else None


@asynccontextmanager
async def _opened(store: Store) -> AsyncIterator[Backend]:
    """The store, as it is: these commands create nothing."""
    from cmr import api

    try:
        async with api.open_backend(store.backend, store.aws) as be:
            yield be
    except StoreMissing as exc:
        flag = "--table" if exc.kind == "table" else "--bucket"
        what = {"bucket": "bucket", "container": "container"}.get(exc.kind, "table")
        if store.backend == BackendName.aws and what == "table":
            what = "DynamoDB table"
        raise UsageError(
            f"{what} {exc.name} does not exist: no job has run in this store "
            f"({shown(store)}) yet; check --store/{flag}"
        ) from None


def _on_job(
    store: Store, job: str, body: Callable[[Backend, JobSpec], Awaitable[T]]
) -> Callable[[], Coroutine[Any, Any, T]]:
    """A coroutine function running ``body`` with the job's spec, on the opened store."""

    async def go() -> T:
        from cmr import lifecycle

        async with _opened(store) as be:
            spec, _ = await lifecycle.load_spec(be, job)
            return await body(be, spec)

    return go


def _ago(at: float) -> str:
    return f"{_span(max(0.0, time.time() - at))} ago"


def _span(seconds: float) -> str:
    """A duration for people: 4.2 s, 3 min 12 s, 2 h 5 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _size(n: Any) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _time(rec: dict[str, Any], key: str) -> float | None:
    value = rec.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


@dataclass(frozen=True)
class Span:
    """When a job (a pipeline: its whole run) started and ended, and how long it took (or
    has run so far)."""

    started: float | None
    ended: float | None  # None while it runs

    @staticmethod
    def of(first: dict[str, Any], last: dict[str, Any], state: str) -> Span:
        from cmr.records import FINAL_STATES

        ended = _time(last, "finished") if state in FINAL_STATES else None
        return Span(_time(first, "created"), ended)

    @property
    def seconds(self) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else time.time()) - self.started)

    def to_json(self) -> dict[str, Any]:
        s = self.seconds
        return {
            "started": self.started,
            "ended": self.ended,
            "duration_s": round(s, 3) if s is not None else None,
        }

    def fields(self) -> list[tuple[str, str]]:
        rows = [("started", _clock(self.started) if self.started is not None else "?")]
        if self.ended is not None:
            rows.append(("ended", _clock(self.ended)))
        s = self.seconds
        if s is not None:
            rows.append(
                ("duration", _span(s))
                if self.ended is not None
                else ("elapsed", _span(s) + " (running)")
            )
        return rows


def no_worker_yet(job: str, since: float | None, store: Store) -> str:
    """What to say of a running job no worker has taken a task of: for how long, and how to
    start one."""
    when = f", {_span(time.time() - since)} after it was submitted" if since is not None else ""
    return (
        f"no worker has taken a task of job {job} yet{when}: nothing serves it until one "
        f"runs. Start one with `cmr worker --store {shown(store)}` (or run a fleet: `cmr "
        "fleet --help`)"
    )


# Fields of the record the human view shows elsewhere, or that are for machines alone.
_INTERNAL = (
    "maps",
    "partitions",
    "visibility_s",
    "max_task_attempts",
    "step",
    "first_step",
    "last_step",
    "job_steps",
    "input_bytes",
    "inputs",
    "partitions_committed",  # commits seen: when a worker looks, not how many there are
)
# What a pipeline's first step says of the whole run (its last step's record holds its own).
_RUN_INPUT = ("created", "input_bytes", "inputs", "records_in", "bytes_in")


def _record_json(
    spec: Any,
    rec: dict[str, Any],
    p: Progress,
    first: dict[str, Any] | None = None,
    worker_seen: bool | None = None,
) -> dict[str, Any]:
    """The job record as plain JSON data (bytes left out), with where its output is; for a
    pipeline, ``first`` is its first step's record: when it started and what it read."""
    from cmr.records import JobState

    doc = {k: v for k, v in rec.items() if not isinstance(v, bytes) and k not in ("pk", "sk")}
    if first is not None and spec.pipeline:
        doc.update({k: first[k] for k in _RUN_INPUT if k in first})
    doc["job"] = spec.pipeline_id  # a pipeline is named by its first step's id
    doc["state"] = p.state
    doc.update(Span.of(first if first is not None else rec, rec, p.state).to_json())
    if worker_seen is not None:
        doc["worker_seen"] = worker_seen
    place = rec.get("fetch", {}).get("dir") if isinstance(rec.get("fetch"), dict) else None
    doc["output"] = str(rec.get("user_output", spec.output))
    doc["published"] = (
        {
            "place": place or spec.output,
            "manifest": (place + "/" if place else spec.output) + "_SUCCESS",
        }
        if p.state == JobState.SUCCEEDED.value
        else None
    )
    doc["progress"] = {
        "maps_done": p.maps_done,
        "maps": p.maps,
        "reduces_done": p.reduces_done,
        "reduces": p.reduces,
    }
    return doc


def _step_json(spec: Any, rec: dict[str, Any]) -> dict[str, Any]:
    from cmr import pipeline

    state = str(rec.get("state", "unknown"))
    return {
        "step": spec.step + 1,
        "job": spec.job_id,
        "state": state,
        "maps": spec.maps,
        "reduces": spec.partitions,
        "input_bytes": rec.get("input_bytes"),
        "records_in": rec.get("records_in"),
        "records_out": rec.get("records_out"),
        **Span.of(rec, rec, state).to_json(),
        "error": rec.get("error"),
        # What a succeeded step before the last wrote: the next step's input, kept until
        # the pipeline ends (or, when a later step failed, until `cmr cleanup`).
        "outputs": pipeline.outputs_root(spec)
        if not spec.final and rec.get("state") == "succeeded"
        else None,
    }


def _step_line(spec: Any, rec: dict[str, Any]) -> str:
    state = str(rec.get("state", "unknown"))
    span = Span.of(rec, rec, state)
    took = span.seconds
    if took is not None:
        state += f" in {_span(took)}" if span.ended is not None else f" for {_span(took)}"
    line = f"{state}: {spec.job_id}, {spec.maps} maps, {spec.partitions} reduces"
    if "records_out" in rec:
        line += f", {rec.get('records_in')} records in, {rec['records_out']} out"
    return line


@shared("store", StoreFlags)
def status(
    store: StoreFlags,
    job: Annotated[str | None, typer.Argument(help="a job id (default: list jobs)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object (or a list)")] = False,
    prices_file: Annotated[
        str | None,
        typer.Option("--prices", help="a TOML file of prices over the shipped table [$CMR_PRICES]"),
    ] = None,
    verbose: Verbose = 0,
) -> None:
    """Jobs and their map/reduce progress and cost, or one job's record, counters and cost.

    With no store given: $CMR_STORE, else the store the job (or your last `cmr run`) was
    submitted to."""
    from rich.table import Table

    from cmr import cost, counters, prices, watch

    priced = prices.load(prices_file)  # a bad file: one line, before the store is opened
    configure_logs(logging.WARNING - 10 * verbose)
    w = where(store, job)
    here = embedded_run(w, job)
    if here is not None:
        doc = here.to_json()
        if as_json:
            print(json.dumps(doc if job is not None else [doc]))
        else:
            out.print(safe_text(here.sentence()), highlight=False, soft_wrap=True)
        return
    announce(w)

    async def show() -> None:
        from cmr import pipeline

        async with _opened(w.store) as be:
            if job is None:
                rows = []
                costs = []
                for row in await watch.list_jobs(be):
                    # A pipeline is listed once, where it stands: the step it is at; the
                    # job list's row says when the run started.
                    steps = await pipeline.chain(be, str(row["sk"]))
                    (spec, rec), first = steps[-1], steps[0][1]
                    rows.append(
                        (
                            spec,
                            rec,
                            await watch.progress(be, spec),
                            {**first, **row},  # the run's start: the job list's row
                            await watch.untouched(be, spec, rec),
                        )
                    )
                    costs.append(await cost.run_cost(be, [s.job_id for s, _ in steps], priced))
                if as_json:
                    docs = [_record_json(s, r, p, run, not idle) for s, r, p, run, idle in rows]
                    for doc, c in zip(docs, costs, strict=True):
                        doc["cost"] = c.to_json()
                    print(json.dumps(docs, default=str))
                    return
                t = Table(
                    "job", "state", "started", "took", "step", "maps", "reduces", "cost", "input"
                )
                for (spec, rec, p, row, idle), c in zip(rows, costs, strict=True):
                    span = Span.of(row, rec, p.state)
                    took = span.seconds
                    cells = (
                        spec.pipeline_id,
                        p.state + (" (no worker yet)" if idle else ""),
                        _clock(span.started) if span.started is not None else "?",
                        "" if took is None else _span(took) + ("" if span.ended else " so far"),
                        f"{spec.step + 1}/{spec.job_steps}",
                        f"{p.maps_done}/{p.maps}",
                        f"{p.reduces_done}/{p.reduces}",
                        cost.short(c),
                        str(rec.get("input", "")),
                    )
                    t.add_row(*map(safe_text, cells))  # data from the table: never obeyed
                keep_whole(t, 0, (safe_text(r[0].pipeline_id).plain for r in rows))
                print_table(out, t)
                return
            steps = await pipeline.chain(be, job)
            spec, rec = steps[-1]
            first = steps[0][1]
            p = await watch.progress(be, spec)
            idle = await watch.untouched(be, spec, rec)
            spent = await cost.run_cost(be, [s.job_id for s, _ in steps], priced)
            if as_json:
                doc = _record_json(spec, rec, p, first, not idle)
                doc["cost"] = spent.to_json()
                if spec.pipeline:
                    doc["job"] = spec.pipeline_id
                    doc["steps"] = [_step_json(s, r) for s, r in steps]
                print(json.dumps(doc, default=str))
                return
            # A pipeline's run: when its first step started, what it read.
            stats = {
                **p.stats,
                **{
                    k: first[k]
                    for k in ("records_in", "bytes_in")
                    if spec.pipeline and isinstance(first.get(k), int)
                },
            }
            size = first.get("input_bytes")
            fields = [
                ("job", spec.pipeline_id),
                ("state", p.state),
                *Span.of(first, rec, p.state).fields(),
                *(
                    (f"step {s.step + 1}", _step_line(s, r))
                    for s, r in (steps if spec.pipeline else [])
                ),
                ("code", spec.ref.target),
                ("input", str(first.get("input", rec.get("input", spec.input_root)))),
                *((("input size", _size(size)),) if isinstance(size, int) else ()),
                ("maps", f"{p.maps_done}/{p.maps} committed"),
                ("reduces", f"{p.reduces_done}/{p.reduces} committed"),
                ("output", str(rec.get("user_output", spec.output))),
                *(
                    # The record's max_task_failures is what --max-task-attempts set; its
                    # max_task_attempts bounds starts that never end (dead workers).
                    ("max_task_attempts" if k == "max_task_failures" else k, str(stats[k]))
                    for k in sorted(stats)
                    if k not in _INTERNAL
                ),
            ]
            t = Table("field", "value", show_header=False)
            for field_, value in fields:
                t.add_row(safe_text(field_), safe_text(value))  # data: never obeyed
            keep_whole(t, 1, [safe_text(spec.job_id).plain])
            print_table(out, t)
            if idle:
                out.print(
                    safe_text(no_worker_yet(spec.pipeline_id, _time(first, "created"), w.store)),
                    highlight=False,
                    soft_wrap=True,
                )
            for line in cost.lines(spent):
                out.print(safe_text(line), highlight=False, soft_wrap=True)
            found = counters.of_record(rec)
            if found:
                out.print("counters:", highlight=False)
                for line in counters.lines(found):
                    out.print(safe_text("  " + line), highlight=False, soft_wrap=True)
            if rec.get("error"):
                out.print(
                    Text.assemble(("error:", "bold red"), " ", safe_text(rec["error"])),
                    highlight=False,
                )

    asyncio.run(show())


# A running fleet takes a new job within a few seconds (its idle polls back off to 5 s): a
# job younger than this is not yet said to be unserved.
HINT_GRACE_S = 10.0
HINT_FIRST_S = 60.0  # the hint's second showing; each next one waits twice as long
HINT_MAX_S = 600.0
TIMED_OUT = 124  # `cmr wait --timeout` gave up: the code timeout(1) exits with


async def _hint_while_unserved(be: Backend, spec: JobSpec, store: Store) -> None:
    """Say on stderr, now and then less and less often, that no worker has taken a task of
    the job yet (a fleet may be starting: the wait goes on); stop once one has."""
    from cmr import watch
    from cmr.records import job_pk

    pause = HINT_FIRST_S
    while True:
        rec = await be.table.get(job_pk(spec.job_id), "job") or {}
        if not await watch.untouched(be, spec, rec):
            return
        young = HINT_GRACE_S - (time.time() - (_time(rec, "created") or 0.0))
        if young > 0:
            await asyncio.sleep(min(young, HINT_GRACE_S))  # a submitter's clock may be ahead
            continue
        err.print(
            safe_text(no_worker_yet(spec.pipeline_id, _time(rec, "created"), store) + "; waiting"),
            highlight=False,
            soft_wrap=True,
        )
        await asyncio.sleep(pause)
        pause = min(HINT_MAX_S, pause * 2)


@shared("store", StoreFlags)
def wait(
    job: JobId,
    store: StoreFlags,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="give up after this many seconds (exit 124; the job goes on)",
            show_default="wait until the job ends",
        ),
    ] = None,
    verbose: Verbose = 0,
) -> None:
    """Wait until a job ends (fetching a local output); exit 0 only if it succeeded.

    While no worker has taken a task of the job, it says so, and how to start one."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr import watch

    if timeout is not None and not timeout > 0:
        fail(f"--timeout must be a positive number of seconds; got {timeout}")
    w = where(store, job)
    here = embedded_run(w, job)
    if here is not None:
        if here.manifest is None:
            fail(here.sentence())
        err.print(safe_text(here.sentence()), highlight=False)
        return
    announce(w)

    async def body(be: Backend, spec: JobSpec) -> dict[str, Any]:
        hint = asyncio.create_task(_hint_while_unserved(be, spec, w.store))
        try:
            async with asyncio.timeout(timeout):
                last, record = await watch.wait_steps(be, spec)  # a pipeline's last step's
        finally:
            hint.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await hint  # a hint that failed to read the table must not fail the wait
        await watch.fetch_output(be, last, record)
        from cmr import usage  # its watch is the job's cost too (cmr.usage)
        from cmr.records import step_job_id

        steps = range(spec.step, last.step + 1)
        await usage.flush(be, [step_job_id(spec.pipeline_id, spec.first_step, n) for n in steps])
        return record

    try:
        record = interruptible(_on_job(w.store, job, body)())
    except Interrupted:
        fail(f"stopped waiting; job {job} goes on (`cmr cancel {job}` cancels it)", code=130)
    except TimeoutError:
        fail(
            f"gave up waiting after {timeout:g} s (--timeout); job {job} goes on "
            f"(`cmr status {job}` shows it)",
            code=TIMED_OUT,
        )
    except JobFailed as exc:
        fail(f"job {exc.job_id} ended {ended(exc)}.\n{exc.reason}")
    err.print(
        Text.assemble(
            f"job {safe_text(job)} ",
            ("succeeded", "green"),
            f": {safe_text(record.get('records_out', 0))} records out under ",
            safe_text(record.get("user_output", "?")),
        ),
        highlight=False,
    )


@shared("store", StoreFlags)
def cancel(job: JobId, store: StoreFlags, verbose: Verbose = 0) -> None:
    """Cancel a running job; its workers clean it up (``cmr cleanup`` does it here)."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr import pipeline

    w = where(store, job)
    if embedded_run(w, job) is not None:
        fail(
            f"job {job} ran on the embedded backend and ended with its `cmr run`: nothing to cancel"
        )
    announce(w)

    async def body(be: Backend, spec: JobSpec) -> bool:
        return await pipeline.cancel(be, spec.job_id, "cancelled by `cmr cancel`")

    if not asyncio.run(_on_job(w.store, job, body)()):
        fail(f"job {job} had ended already (`cmr status {job}`)")
    err.print(
        Text.assemble("job ", safe_text(job), " cancelled; its workers clean it up"),
        highlight=False,
    )


@shared("store", StoreFlags)
def cleanup(job: JobId, store: StoreFlags, verbose: Verbose = 0) -> None:
    """Delete a job's queues, scratch data and records now (a running job is cancelled)."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr import lifecycle, pipeline
    from cmr.records import FINAL_STATES, JobState, job_pk

    w = where(store, job)
    if embedded_run(w, job) is not None:
        err.print(
            safe_text(
                f"job {job} ran on the embedded backend, whose state ended with its `cmr run`: "
                "nothing to clean up"
            ),
            highlight=False,
        )
        return
    announce(w)

    async def body(be: Backend, spec: JobSpec) -> None:
        await pipeline.cancel(be, spec.job_id, "cancelled by cmr cleanup")
        # Every step of a pipeline (cleanup is idempotent), and what a failed step kept of
        # the step before it for resuming. A step still running (publishing: it could not
        # be cancelled) is its workers' to finish; it is never cleaned from under them.
        for each, _ in await pipeline.chain(be, job):
            rec = await be.table.get(job_pk(each.job_id), "job", consistent=True) or {}
            state = str(rec.get("state", ""))
            if state not in {s.value for s in FINAL_STATES}:
                fail(
                    f"job {job} is publishing its output and can no longer be cancelled; it "
                    f"ends in a moment: run `cmr cleanup {job}` again once `cmr status {job}` "
                    "says it ended"
                )
            await lifecycle.cleanup(be, each, JobState(state))
            await be.blobs.delete_prefix(lifecycle.job_scratch(each.scratch, each.job_id))

    asyncio.run(_on_job(w.store, job, body)())
    err.print(
        Text.assemble("job ", safe_text(job), ": queues, scratch data and task records removed"),
        highlight=False,
    )
