"""The ``cmr`` command: run, worker, status, cleanup."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cmr import api, client, lifecycle, logs
from cmr.cliopts import Bucket, Profile, QueuePrefix, Region, TableName, Verbose, err, fail, out
from cmr.errors import CmrError, JobFailed
from cmr.fleet import fleet_app
from cmr.loadgen.cli import loadgen_app
from cmr.records import JobState
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
    workers: Annotated[int, typer.Option(help="local workers to start; 0: wait for a fleet")] = 1,
    backend: Backend = "embedded",
    visibility_timeout: Annotated[int, typer.Option(help="task lease, seconds")] = 60,
    param: Annotated[list[str], typer.Option("--param", "-p", help="KEY=VALUE for the job")] = [],  # noqa: B006
    memory_mb: Annotated[int, typer.Option(help="reducer memory before spilling")] = 512,
    overwrite: Annotated[bool, typer.Option(help="replace part-* files in the output")] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bars (default: on a tty)")] = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    verbose: Verbose = 0,
) -> None:
    """Run a job to completion and write part-00000 ... to the output."""
    logs.configure(logging.WARNING - 10 * verbose)
    show = sys.stderr.isatty() if progress is None else progress
    bars = Progress(
        TextColumn("{task.description:>7}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        disable=not show,
    )
    ids: dict[str, Any] = {}
    started = time.monotonic()

    def on_submit(job_id: str) -> None:
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
            result = api.run(
                job,
                input,
                output,
                backend=backend,
                reducers=reducers,
                workers=workers,
                params=_params(param),
                visibility_timeout=visibility_timeout,
                aws=_aws(bucket, table, queue_prefix, region, profile),
                worker_settings=ws,
                overwrite=overwrite,
                on_progress=on_progress,
                on_submit=on_submit,
            )
    except JobFailed as exc:
        fail(f"job {exc.job_id} failed.\n{exc.reason}")
    except CmrError as exc:
        fail(str(exc))
    rec = result.record
    secs = result.seconds
    err.print(
        f"job {result.job_id} [green]succeeded[/] in {secs:.1f} s: "
        f"{_mb(rec.get('bytes_in', 0))} in ({rec.get('bytes_in', 0) / 1e6 / secs:.2f} MB/s), "
        f"{rec.get('records_out', 0)} records out in {len(result.parts)} parts under {output}",
        highlight=False,
    )


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
                w = Worker(be, ws, pool, only_job=job)
                loop = asyncio.get_running_loop()
                import signal

                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, w.done.set)
                await w.run()

    try:
        asyncio.run(serve())
    except CmrError as exc:
        fail(str(exc))


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="a job id (default: list jobs)")] = None,
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
                t = Table("job", "state", "created", "maps", "reduces", "input")
                for row in await client.list_jobs(be):
                    spec, rec = await client.load_spec(be, str(row["sk"]))
                    p = await client.progress(be, spec)
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
def cleanup(
    job: Annotated[str, typer.Argument(help="the job id to remove")],
    backend: Backend = "aws",
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Delete a job's queues, scratch data and records (a running job is cancelled)."""

    async def go() -> None:
        async with api.open_backend(
            backend, _aws(bucket, table, queue_prefix, region, profile, create=False)
        ) as be:
            spec, _ = await client.load_spec(be, job)
            await lifecycle.set_state(be, job, JobState.CANCELLED, "cancelled by cmr cleanup")
            await lifecycle.cleanup(be, spec)

    try:
        asyncio.run(go())
    except CmrError as exc:
        fail(str(exc))
    err.print(f"job {job}: queues, scratch data and task records removed")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
