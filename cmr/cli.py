"""The ``cmr`` command: run, worker, status, cleanup."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cmr import api, client, lifecycle, logs
from cmr.cliopts import Bucket, Profile, QueuePrefix, Region, TableName, Verbose, err, fail, out
from cmr.errors import CmrError, JobFailed
from cmr.fleet import fleet_app
from cmr.loadgen.cli import loadgen_app
from cmr.records import JobState, job_pk
from cmr.runtime import STEPS, Hook, Runtime
from cmr.settings import AwsSettings, WorkerSettings, default_cores
from cmr.worker import Worker

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="cmr: masterless MapReduce on queues (SQS), blobs (S3) and a table "
    "(DynamoDB), or all of it in-process.",
)
app.add_typer(loadgen_app, name="loadgen")
app.add_typer(fleet_app, name="fleet")

Backend = Annotated[str, typer.Option("--backend", help="embedded (in-process) or aws")]
T = TypeVar("T")


def _aws(
    bucket: str,
    table: str,
    queue_prefix: str,
    region: str | None,
    profile: str | None,
    create: bool = True,
) -> AwsSettings:
    return AwsSettings(
        bucket=bucket,
        table=table,
        queue_prefix=queue_prefix,
        region=region,
        profile=profile,
        create=create,
    )


def _params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--param")
        params[key] = value
    return params


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@app.command()
def run(
    job: Annotated[str, typer.Argument(help="job file (path.py[:Class]) or module[:Class]")],
    input: Annotated[str, typer.Option("--input", "-i", help="file, directory or s3:// prefix")],
    output: Annotated[str, typer.Option("--output", "-o", help="directory or s3:// prefix")],
    reducers: Annotated[int | None, typer.Option(help="partitions (default: the job's)")] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="local workers to start (default 1; 0: wait for a fleet)"),
    ] = None,
    backend: Backend = "embedded",
    visibility_timeout: Annotated[int, typer.Option(help="task lease, seconds")] = 60,
    task_timeout: Annotated[
        int,
        typer.Option(
            help="a task's time limit, seconds (default 0: 300 s plus 1 s per 64 KiB it reads)"
        ),
    ] = 0,
    param: Annotated[list[str], typer.Option("--param", "-p", help="KEY=VALUE for the job")] = [],  # noqa: B006
    memory_mb: Annotated[int, typer.Option(help="reducer memory before spilling")] = 512,
    overwrite: Annotated[
        bool, typer.Option(help="replace the output's parts once the new ones are complete")
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            help="submit and exit (aws): print the job id; `cmr wait JOB` / `cmr status JOB`"
        ),
    ] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bars (default: on a tty)")] = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    verbose: Verbose = 0,
) -> None:
    """Run a job to completion and publish its parts and _SUCCESS manifest to the output.

    Ctrl-C (or SIGTERM) cancels the job; --detach submits it and leaves it to the workers."""
    logs.configure(logging.WARNING - 10 * verbose)
    if memory_mb < 1:
        fail(f"--memory-mb must be at least 1; got {memory_mb}")
    show = sys.stderr.isatty() if progress is None else progress
    bars = Progress(
        TextColumn("{task.description:>7}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        disable=not show or detach,
    )
    ids: dict[str, Any] = {}
    submitted: list[str] = []
    started = time.monotonic()

    def on_submit(job_id: str) -> None:
        submitted.append(job_id)
        err.print(f"submitted job [bold]{job_id}[/] ({backend} backend)", highlight=False)

    def on_progress(p: client.Progress) -> None:
        if not ids:
            ids["map"] = bars.add_task("map", total=p.maps or 1, note="")
            ids["reduce"] = bars.add_task("reduce", total=p.reduces, note="")
        rate = p.stats.get("progress_bytes", 0) / max(1e-9, time.monotonic() - started)
        bars.update(
            ids["map"], completed=p.maps_done if p.maps else 1, note=f"{rate / 1e6:.1f} MB/s"
        )
        bars.update(ids["reduce"], completed=p.reduces_done, note="")

    ws = WorkerSettings(visibility_s=visibility_timeout, memory_mb=memory_mb)
    try:
        with bars:
            result = _interruptible(
                api.run_async(
                    job,
                    input,
                    output,
                    backend=backend,
                    reducers=reducers,
                    workers=(0 if detach else 1) if workers is None else workers,
                    params=_params(param),
                    visibility_timeout=visibility_timeout,
                    task_timeout=task_timeout,
                    aws=_aws(bucket, table, queue_prefix, region, profile),
                    worker_settings=ws,
                    overwrite=overwrite,
                    on_progress=on_progress,
                    on_submit=on_submit,
                    detach=detach,
                )
            )
    except Interrupted:
        if submitted and backend == "aws":
            fail(
                f"interrupted: job {submitted[0]} was cancelled; its workers clean it up "
                f"(`cmr status {submitted[0]}` shows it)",
                code=130,
            )
        fail("interrupted: the job was cancelled", code=130)
    except JobFailed as exc:
        fail(f"job {exc.job_id} failed.\n{exc.reason}")
    except CmrError as exc:
        fail(str(exc))
    if detach:
        err.print(
            f"job {result.job_id} is running; `cmr wait {result.job_id}` waits for it, "
            f"`cmr status {result.job_id}` shows it",
            highlight=False,
        )
        out.print(result.job_id, highlight=False)  # the last line: for scripts
        return
    rec = result.record
    secs = result.seconds
    err.print(
        f"job {result.job_id} [green]succeeded[/] in {secs:.1f} s: "
        f"{_mb(rec.get('bytes_in', 0))} in ({rec.get('bytes_in', 0) / 1e6 / secs:.2f} MB/s), "
        f"{rec.get('records_out', 0)} records out in {len(result.parts)} parts under {output}",
        highlight=False,
    )


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped a command (after it cancelled what it had started)."""


def _interruptible(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; SIGINT or SIGTERM cancels it (it cleans up as it unwinds) and
    raises Interrupted."""

    async def runner() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await main
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(runner())
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise Interrupted from None


@app.command()
def worker(
    backend: Backend = "aws",
    idle_exit: Annotated[
        float | None, typer.Option(help="exit after this many idle seconds")
    ] = None,
    job: Annotated[str | None, typer.Option(help="serve only this job, exit when it ends")] = None,
    processes: Annotated[int, typer.Option(help="CPU processes for user code")] = default_cores(),
    map_slots: Annotated[int, typer.Option(help="map tasks at once")] = default_cores(),
    reduce_slots: Annotated[int, typer.Option(help="reduce tasks at once")] = default_cores(),
    memory_mb: Annotated[int, typer.Option(help="reducer memory before spilling")] = 512,
    create: Annotated[bool, typer.Option(help="create the bucket and table if missing")] = True,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    verbose: Verbose = 0,
) -> None:
    """Serve every running job (or one) until idle: the fleet's only process."""
    logs.configure(logging.INFO - 10 * verbose)
    if backend != "aws":
        fail(
            "a standalone worker needs a shared backend: use --backend aws "
            "(the embedded backend lives inside `cmr run`)"
        )
    ws = WorkerSettings(
        map_slots=map_slots,
        reduce_slots=reduce_slots,
        processes=processes,
        memory_mb=memory_mb,
        idle_exit_s=idle_exit,
    )

    async def serve() -> None:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create)
        ) as be:
            with api.cpu_pool(processes) as pool:
                w = Worker(be, ws, pool, only_job=job, hook=_stop_at(os.environ.get(STOP_AT)))
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, w.done.set)
                try:
                    await w.run()
                finally:
                    # The worker stopped: a task still in the pool was abandoned with its
                    # slot (its lease lapses); do not wait for it to end.
                    pool.kill()

    try:
        asyncio.run(serve())
    except CmrError as exc:
        fail(str(exc))


STOP_AT = "CMR_STOP_AT"  # a testing aid: the worker stops itself (SIGSTOP) at this step


def _stop_at(step: str | None) -> Hook | None:
    """A hook that freezes the worker, as a SIGSTOP from outside would, the first time it
    reaches ``step`` (one of cmr.runtime.STEPS): lets a test kill a worker at an exact
    point of the protocol, in a real process."""
    if not step:
        return None
    if step not in STEPS:
        fail(f"{STOP_AT}={step!r} is not a step; steps: {', '.join(STEPS)}")
    fired: list[bool] = []

    async def hook(rt: Runtime, name: str, context: dict[str, Any]) -> None:
        if name == step and not fired:
            fired.append(True)
            print(f"{STOP_AT}: stopping at {step} (pid {os.getpid()})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    return hook


def _record_json(spec: Any, rec: dict[str, Any], p: client.Progress) -> dict[str, Any]:
    """The job record as plain JSON data (bytes left out), with where its output is."""
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


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="a job id (default: list jobs)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object (or a list)")] = False,
    backend: Backend = "aws",
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Jobs and their map/reduce progress, or one job's record and duplicate counters."""
    if backend != "aws":
        fail(
            "the embedded backend keeps no state after `cmr run` ends; status is for --backend aws"
        )

    async def show() -> None:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create=False)
        ) as be:
            if job is None:
                rows = []
                for row in await client.list_jobs(be):
                    spec, rec = await client.load_spec(be, str(row["sk"]))
                    rows.append((spec, rec, await client.progress(be, spec)))
                if as_json:
                    print(json.dumps([_record_json(*r) for r in rows], default=str))
                    return
                t = Table("job", "state", "created", "maps", "reduces", "input")
                for spec, rec, p in rows:
                    t.add_row(
                        spec.job_id,
                        p.state,
                        time.strftime(
                            "%Y-%m-%d %H:%M:%S", time.localtime(float(rec.get("created", 0)))
                        ),
                        f"{p.maps_done}/{p.maps}",
                        f"{p.reduces_done}/{p.reduces}",
                        str(rec.get("input", "")),
                    )
                out.print(t)
                return
            spec, rec = await client.load_spec(be, job)
            p = await client.progress(be, spec)
            if as_json:
                print(json.dumps(_record_json(spec, rec, p), default=str))
                return
            t = Table("field", "value", show_header=False)
            t.add_row("job", spec.job_id)
            t.add_row("state", p.state)
            t.add_row("code", spec.ref.target)
            t.add_row("maps", f"{p.maps_done}/{p.maps} committed")
            t.add_row("reduces", f"{p.reduces_done}/{p.reduces} committed")
            t.add_row("output", str(rec.get("user_output", spec.output)))
            for k in sorted(p.stats):
                if k not in ("maps", "partitions", "visibility_s", "max_task_failures"):
                    t.add_row(k, str(p.stats[k]))
            out.print(t)
            if rec.get("error"):
                out.print("[bold red]error:[/]", str(rec["error"]), highlight=False)

    try:
        asyncio.run(show())
    except CmrError as exc:
        fail(str(exc))


@app.command()
def wait(
    job: Annotated[str, typer.Argument(help="the job id to wait for")],
    backend: Backend = "aws",
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Wait until a job ends (fetching a local output); exit 0 only if it succeeded."""

    async def go() -> dict[str, Any]:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create=False)
        ) as be:
            spec, _ = await client.load_spec(be, job)
            record = await client.wait(be, spec)
            await client.fetch_output(be, spec, record)
            return record

    try:
        record = _interruptible(go())
    except Interrupted:
        fail(f"stopped waiting; job {job} goes on (`cmr cancel {job}` cancels it)", code=130)
    except JobFailed as exc:
        fail(f"job {exc.job_id} ended {_state_of(exc)}.\n{exc.reason}")
    except CmrError as exc:
        fail(str(exc))
    err.print(
        f"job {job} [green]succeeded[/]: {record.get('records_out', 0)} records out under "
        f"{record.get('user_output', '?')}",
        highlight=False,
    )


def _state_of(exc: JobFailed) -> str:
    return "cancelled" if exc.reason.startswith("cancelled") else "failed"


@app.command()
def cancel(
    job: Annotated[str, typer.Argument(help="the job id to cancel")],
    backend: Backend = "aws",
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Cancel a running job; its workers clean it up (``cmr cleanup`` does it here)."""

    async def go() -> bool:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create=False)
        ) as be:
            spec, _ = await client.load_spec(be, job)
            return await lifecycle.end(
                be, spec, JobState.CANCELLED, reason="cancelled by `cmr cancel`"
            )

    try:
        cancelled = asyncio.run(go())
    except CmrError as exc:
        fail(str(exc))
    if not cancelled:
        fail(f"job {job} had ended already (`cmr status {job}`)")
    err.print(f"job {job} cancelled; its workers clean it up", highlight=False)


@app.command()
def cleanup(
    job: Annotated[str, typer.Argument(help="the job id to remove")],
    backend: Backend = "aws",
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Delete a job's queues, scratch data and records now (a running job is cancelled)."""

    async def go() -> None:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create=False)
        ) as be:
            spec, _ = await client.load_spec(be, job)
            await lifecycle.end(be, spec, JobState.CANCELLED, reason="cancelled by cmr cleanup")
            rec = await be.table.get(job_pk(job), "job") or {}
            await lifecycle.cleanup(be, spec, JobState(str(rec.get("state", "cancelled"))))

    try:
        asyncio.run(go())
    except CmrError as exc:
        fail(str(exc))
    err.print(f"job {job}: queues, scratch data and task records removed")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
