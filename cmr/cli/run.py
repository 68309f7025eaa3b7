"""``cmr run``: submit a job, run it to completion (or detach), show its progress."""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from cmr.cli import laststore
from cmr.cli.exits import Interrupted, interruptible
from cmr.cli.options import (
    StoreFlags,
    Verbose,
    check_range,
    choice_option,
    configure_logs,
    err,
    fail,
    key_values,
    machine_memory_mb,
    out,
    safe_text,
    shared,
)
from cmr.counters import lines as counter_lines
from cmr.settings import BackendName, LineEnds, ShuffleMode, WorkerSettings, default_poll_s

if TYPE_CHECKING:
    from cmr import watch


@shared("store", StoreFlags)
def run(
    job: Annotated[str, typer.Argument(help="job file (path.py[:Class]) or module[:Class]")],
    input: Annotated[
        list[str],
        typer.Option(
            "--input",
            "-i",
            help="file, directory, glob ('logs/2026-11-*') or s3:// prefix; give it again "
            "for more inputs, all read (names starting with _ or . in a directory are not)",
        ),
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="directory or s3:// prefix")],
    store: StoreFlags,
    job_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="after --: an mrjob job's own arguments (its add_passthru_arg/add_file_arg "
            "options), e.g. -- --stop-words-file words.txt",
            show_default=False,
        ),
    ] = None,
    reducers: Annotated[int | None, typer.Option(help="partitions (default: the job's)")] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="local workers to start (default 1; 0: wait for a fleet)"),
    ] = None,
    visibility_timeout: Annotated[int, typer.Option(help="task lease, seconds")] = 60,
    task_timeout: Annotated[
        int,
        typer.Option(
            help="a task's time limit, seconds (default 0: 300 s plus 1 s per 64 KiB it reads)"
        ),
    ] = 0,
    max_task_attempts: Annotated[
        int, typer.Option(help="runs of one task that raise before the job fails")
    ] = 10,
    param: Annotated[list[str], typer.Option("--param", "-p", help="KEY=VALUE for the job")] = [],  # noqa: B006
    file: Annotated[
        list[str],
        typer.Option(
            "--file",
            help="a side file to ship, PATH[#NAME] (repeatable); the job opens it with "
            "self.file(NAME)",
        ),
    ] = [],  # noqa: B006
    memory_mb: Annotated[int, typer.Option(help="reducer memory before spilling, MB")] = 512,
    split_mb: Annotated[
        float | None,
        typer.Option(
            help="input per map task, MB (default: chosen from the input, the workers and "
            "their memory, at most 64 MiB); a sort of fixed records on S3 (no map, no "
            "combiner) takes more without holding it in memory: fewer map tasks, fewer "
            "shuffle requests at scale; any other job holds its task's input whole",
            min=0.001,
        ),
    ] = None,
    lines: Annotated[
        LineEnds | None,
        choice_option(
            LineEnds,
            "--lines",
            "line endings: lf (default: the job's `lines`), universal: \\r\\n and \\r end "
            "lines too — for Windows input",
        ),
    ] = None,
    input_format: Annotated[
        str,
        typer.Option(
            "--input-format",
            help="how input files become records: lines, jsonlines, csv, "
            "fixed:<record_len>:<key_len>, whole, pairs (default: the job's `input_format`); "
            "gzip, bz2 and zstd files are decompressed",
        ),
    ] = "",
    output_format: Annotated[
        str,
        typer.Option(
            "--output-format",
            help="how output pairs are written: text, raw, jsonlines, pairs (default: the "
            "job's `output_format`)",
        ),
    ] = "",
    overwrite: Annotated[
        bool, typer.Option(help="replace the output's parts once the new ones are complete")
    ] = False,
    step: Annotated[
        int | None,
        typer.Option(
            help="run only this step of the job's steps (1-based); a step before the last "
            "writes pairs, the input of --step/--from-step N+1"
        ),
    ] = None,
    from_step: Annotated[
        int | None,
        typer.Option(help="run this step and the rest; the input is what the step before wrote"),
    ] = None,
    total_order: Annotated[
        bool,
        typer.Option(
            "--total-order",
            help="sample the keys at submit and partition by range: the parts, in order, "
            "are one sorted sequence (default: the job's `total_order`)",
        ),
    ] = False,
    shuffle: Annotated[
        ShuffleMode,
        choice_option(
            ShuffleMode,
            "--shuffle",
            "how map output reaches the reducers: queue (tagged batches), blob (one object "
            "per map task: fewer requests at scale), auto (blob for inputs of 64 MiB or more on "
            "aws)",
        ),
    ] = ShuffleMode.auto,
    detach: Annotated[
        bool,
        typer.Option(
            help="submit and exit (aws): print the job id; `cmr wait JOB` / `cmr status JOB`"
        ),
    ] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bars (default: on a tty)")] = None,
    verbose: Verbose = 0,
) -> None:
    """Run a job to completion and publish its parts and _SUCCESS manifest to the output.

    Ctrl-C (or SIGTERM) cancels the job; --detach submits it and leaves it to the workers."""
    from rich.progress import (  # a tenth of a second: not for --help
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from cmr import api

    configure_logs(logging.WARNING - 10 * verbose)
    check_range(
        "--memory-mb",
        memory_mb,
        1,
        machine_memory_mb(),
        "MB the reducers of a worker hold before they spill to disk: it must fit in this "
        "machine's memory",
    )
    where = store.resolve(BackendName.embedded)
    bars = Progress(
        TextColumn("{task.description:>7}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        disable=not (sys.stderr.isatty() if progress is None else progress) or detach,
    )
    ids: dict[str, Any] = {}
    submitted: list[str] = []
    started = time.monotonic()

    def on_submit(job_id: str) -> None:
        submitted.append(job_id)
        laststore.remember(where, job_id, output)  # `cmr status` looks there next
        err.print(f"submitted job [bold]{job_id}[/] ({where.backend} backend)", highlight=False)
        if options.workers == 0:  # nothing here runs it: say what will
            how = f"`cmr worker --store {where.url.removesuffix('?')}`"
            err.print(
                Text.assemble(
                    "no worker was started ",
                    ("(--detach)" if detach else "(--workers 0)"),
                    f": nothing runs job {job_id} until a worker does; start one with ",
                    safe_text(how),
                    " (or run a fleet: `cmr fleet --help`)"
                    if detach
                    else ", or a fleet (`cmr fleet --help`); waiting for one",
                ),
                highlight=False,
                soft_wrap=True,
            )

    def on_progress(p: watch.Progress) -> None:
        if not ids:
            ids["map"] = bars.add_task("map", total=p.maps or 1, note="")
            ids["reduce"] = bars.add_task("reduce", total=p.reduces, note="")
        rate = p.stats.get("progress_bytes", 0) / max(1e-9, time.monotonic() - started)
        # A pipeline's steps each have their own tasks: the bars show the step under way.
        bars.update(
            ids["map"],
            total=p.maps or 1,
            completed=p.maps_done if p.maps else 1,
            note=f"{rate / 1e6:.1f} MB/s",
        )
        bars.update(ids["reduce"], total=p.reduces, completed=p.reduces_done, note="")

    from cmr.adapters import job_args as adapted_args  # an mrjob job's (none for a cmr.Job)
    from cmr.jobload import load_job

    loaded = load_job(job)  # once: its arguments, its options and its submission use it
    mr_params, mr_files = adapted_args(loaded, job_args or [])
    options = api.RunOptions(
        reducers=reducers,
        workers=(0 if detach else 1) if workers is None else workers,
        params={**key_values(param, "--param"), **mr_params},
        visibility_timeout=visibility_timeout,
        task_timeout=task_timeout,
        max_task_attempts=max_task_attempts,
        overwrite=overwrite,
        total_order=total_order,
        shuffle=shuffle.value,
        split_bytes=None if split_mb is None else max(1, int(split_mb * 1_000_000)),
        lines=lines.value if lines is not None else "",
        step=step,
        from_step=from_step,
        detach=detach,
        aws=where.aws,
        # The API's defaults but the memory (the embedded backend's in-process queues are
        # polled often: a second per poll made every embedded run a second slower).
        worker_settings=WorkerSettings(
            memory_mb=memory_mb,
            poll_s=default_poll_s(where.backend == BackendName.embedded),
        ),
        on_progress=on_progress,
        on_submit=on_submit,
        input_format=input_format,
        output_format=output_format,
        # An mrjob job's add_file_arg options name files: they ship as side files too.
        files=(*file, *mr_files),
    )
    try:
        with bars:
            result = interruptible(
                api.run_async(loaded, input, output, options, backend=where.backend)
            )
    except Interrupted:
        if submitted and where.backend != BackendName.embedded:
            fail(
                f"interrupted: job {submitted[0]} was cancelled; its workers clean it up "
                f"(`cmr status {submitted[0]}` shows it)",
                code=130,
            )
        fail("interrupted: the job was cancelled", code=130)
    if detach:
        err.print(
            f"job {result.job_id} is running; `cmr wait {result.job_id}` waits for it, "
            f"`cmr status {result.job_id}` shows it",
            highlight=False,
        )
        out.print(result.job_id, highlight=False)  # the last line: for scripts
        return
    rec, secs = result.record, result.seconds
    # A pipeline's last step read what the step before wrote: the run read its first's input.
    mb_in = rec.get("run_bytes_in", rec.get("bytes_in", 0)) / 1e6
    summary = Text.from_markup(
        f"job {result.job_id} [green]succeeded[/] in {secs:.1f} s: "
        f"{mb_in:.1f} MB in ({mb_in / secs:.2f} "
        f"MB/s), {rec.get('records_out', 0)} records out in {len(result.parts)} parts under "
    )
    err.print(Text.assemble(summary, safe_text(output)), highlight=False)
    if result.counters:  # as mrjob prints them: group, then its counters indented
        err.print("Counters:", highlight=False)
        for line in counter_lines(result.counters):
            err.print(safe_text("  " + line), highlight=False)
