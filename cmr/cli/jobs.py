"""``cmr status | wait | cancel | cleanup``: look after jobs that outlive their client (aws)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.text import Text

from cmr.cli.exits import Interrupted, ended, interruptible
from cmr.cli.options import (
    StoreFlags,
    Verbose,
    configure_logs,
    err,
    fail,
    out,
    safe_text,
    shared,
)
from cmr.errors import JobFailed
from cmr.settings import BackendName

if TYPE_CHECKING:
    from cmr.backends.base import Backend
    from cmr.records import JobSpec
    from cmr.watch import Progress

T = TypeVar("T")
JobId = Annotated[str, typer.Argument(help="the job id")]


@asynccontextmanager
async def _opened(store: StoreFlags) -> AsyncIterator[Backend]:
    """The store the flags name, as it is: these commands create nothing."""
    from cmr import api

    where = store.resolve(BackendName.aws, create=False)
    async with api.open_backend(where.backend, where.aws) as be:
        yield be


def _on_job(
    store: StoreFlags, job: str, body: Callable[[Backend, JobSpec], Awaitable[T]]
) -> Callable[[], Coroutine[Any, Any, T]]:
    """A coroutine function running ``body`` with the job's spec, on the opened store."""

    async def go() -> T:
        from cmr import lifecycle

        async with _opened(store) as be:
            spec, _ = await lifecycle.load_spec(be, job)
            return await body(be, spec)

    return go


def _record_json(spec: Any, rec: dict[str, Any], p: Progress) -> dict[str, Any]:
    """The job record as plain JSON data (bytes left out), with where its output is."""
    from cmr.records import JobState

    doc = {k: v for k, v in rec.items() if not isinstance(v, bytes) and k not in ("pk", "sk")}
    doc["job"] = spec.job_id
    doc["state"] = p.state
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


@shared("store", StoreFlags)
def status(
    store: StoreFlags,
    job: Annotated[str | None, typer.Argument(help="a job id (default: list jobs)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object (or a list)")] = False,
    verbose: Verbose = 0,
) -> None:
    """Jobs and their map/reduce progress, or one job's record and duplicate counters."""
    from rich.table import Table

    from cmr import lifecycle, watch

    configure_logs(logging.WARNING - 10 * verbose)
    if store.resolve(BackendName.aws).backend != BackendName.aws:
        fail(
            "the embedded backend keeps no state after `cmr run` ends; status is for --backend aws"
        )

    async def show() -> None:
        async with _opened(store) as be:
            if job is None:
                rows = []
                for row in await watch.list_jobs(be):
                    spec, rec = await lifecycle.load_spec(be, str(row["sk"]))
                    rows.append((spec, rec, await watch.progress(be, spec)))
                if as_json:
                    print(json.dumps([_record_json(*r) for r in rows], default=str))
                    return
                t = Table("job", "state", "created", "maps", "reduces", "input")
                for spec, rec, p in rows:
                    cells = (
                        spec.job_id,
                        p.state,
                        time.strftime(
                            "%Y-%m-%d %H:%M:%S", time.localtime(float(rec.get("created", 0)))
                        ),
                        f"{p.maps_done}/{p.maps}",
                        f"{p.reduces_done}/{p.reduces}",
                        str(rec.get("input", "")),
                    )
                    t.add_row(*map(safe_text, cells))  # data from the table: never obeyed
                out.print(t)
                return
            spec, rec = await lifecycle.load_spec(be, job)
            p = await watch.progress(be, spec)
            if as_json:
                print(json.dumps(_record_json(spec, rec, p), default=str))
                return
            fields = [
                ("job", spec.job_id),
                ("state", p.state),
                ("code", spec.ref.target),
                ("maps", f"{p.maps_done}/{p.maps} committed"),
                ("reduces", f"{p.reduces_done}/{p.reduces} committed"),
                ("output", str(rec.get("user_output", spec.output))),
                *(
                    (k, str(p.stats[k]))
                    for k in sorted(p.stats)
                    if k not in ("maps", "partitions", "visibility_s", "max_task_failures")
                ),
            ]
            t = Table("field", "value", show_header=False)
            for field_, value in fields:
                t.add_row(safe_text(field_), safe_text(value))  # data: never obeyed
            out.print(t)
            if rec.get("error"):
                out.print(
                    Text.assemble(("error:", "bold red"), " ", safe_text(rec["error"])),
                    highlight=False,
                )

    asyncio.run(show())


@shared("store", StoreFlags)
def wait(job: JobId, store: StoreFlags, verbose: Verbose = 0) -> None:
    """Wait until a job ends (fetching a local output); exit 0 only if it succeeded."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr import watch

    async def body(be: Backend, spec: JobSpec) -> dict[str, Any]:
        record = await watch.wait(be, spec)
        await watch.fetch_output(be, spec, record)
        return record

    try:
        record = interruptible(_on_job(store, job, body)())
    except Interrupted:
        fail(f"stopped waiting; job {job} goes on (`cmr cancel {job}` cancels it)", code=130)
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
    from cmr import lifecycle
    from cmr.records import JobState

    async def body(be: Backend, spec: JobSpec) -> bool:
        return await lifecycle.end(be, spec, JobState.CANCELLED, reason="cancelled by `cmr cancel`")

    if not asyncio.run(_on_job(store, job, body)()):
        fail(f"job {job} had ended already (`cmr status {job}`)")
    err.print(
        Text.assemble("job ", safe_text(job), " cancelled; its workers clean it up"),
        highlight=False,
    )


@shared("store", StoreFlags)
def cleanup(job: JobId, store: StoreFlags, verbose: Verbose = 0) -> None:
    """Delete a job's queues, scratch data and records now (a running job is cancelled)."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr import lifecycle
    from cmr.records import JobState, job_pk

    async def body(be: Backend, spec: JobSpec) -> None:
        await lifecycle.end(be, spec, JobState.CANCELLED, reason="cancelled by cmr cleanup")
        rec = await be.table.get(job_pk(job), "job") or {}
        await lifecycle.cleanup(be, spec, JobState(str(rec.get("state", "cancelled"))))

    asyncio.run(_on_job(store, job, body)())
    err.print(
        Text.assemble("job ", safe_text(job), ": queues, scratch data and task records removed"),
        highlight=False,
    )
