"""``cmr loadgen``: jam, sweep, staleness and cpq, each a cmr job whose map tasks drive a store.

How the flags map onto tasks (one ``LoadTask`` per map task):

- ``--readers`` / ``--writers`` are per task, as seed 000's "100 get + 100 put threads per map
  task"; ``--ops`` and ``--rate`` are totals for the whole test, split evenly over the tasks;
  ``--duration`` is how long every task runs.
- ``sweep`` runs one jam per (items, concurrency) point with the same ``--ops`` total, where
  concurrency is the operators per task: ``--op get`` makes them all readers, ``--op put`` all
  writers, ``--op both`` half and half (the odd one a reader).
- ``cpq`` runs one staleness measurement per p with ``--consistent-ratio p``. Only reads
  choose: these stores have no stronger write to pick (seed 003's quorum write has no
  counterpart; a conditional put is not one), so writes stay plain at every p.

The JSON each command writes is a contract (issue 4); the tables and figures are drawn from
that JSON alone (``cmr.loadgen.report``, ``cmr.loadgen.plots``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, get_args

import typer

from cmr import logs
from cmr.cliopts import Bucket, Profile, QueuePrefix, Region, TableName, Verbose, err, fail, out
from cmr.errors import CmrError, JobFailed, UsageError
from cmr.loadgen import report
from cmr.loadgen.sim import SimConfig
from cmr.loadgen.spec import TARGETS, Kind, LoadTask, Retries
from cmr.loadgen.targets import RESOURCE, cleanup, prepare
from cmr.settings import AwsSettings

# the engine, HDR histograms and matplotlib are imported inside the commands: plain `cmr run`
# must not pay for them (matplotlib alone costs over a second)
if TYPE_CHECKING:
    from cmr.loadgen.recorder import Measurement

__all__ = ["loadgen_app"]

loadgen_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Load tests and consistency measurements of a store (DynamoDB, S3, SQS, SimpleDB or "
    "the simulated 'sim'), run as cmr jobs: map tasks drive traffic, reducers merge it.",
)

T = TypeVar("T")
Op = Literal["get", "put", "both"]

TargetOpt = Annotated[str, typer.Option("--target", help=f"one of {', '.join(TARGETS)}")]
Tasks = Annotated[int, typer.Option("--tasks", help="map tasks (spread over the workers)")]
Items = Annotated[int, typer.Option("--items", help="distinct keys: 1 loads a single item")]
Duration = Annotated[float | None, typer.Option("--duration", help="seconds each task runs")]
Ops = Annotated[int | None, typer.Option("--ops", help="operations in all, split over tasks")]
ConsistentRatio = Annotated[
    float, typer.Option("--consistent-ratio", help="P(a read is strongly consistent)")
]
ConditionalRatio = Annotated[
    float, typer.Option("--conditional-ratio", help="P(a write is conditional)")
]
Rate = Annotated[
    float | None,
    typer.Option("--rate", help="open loop: intended ops/s in all (default: closed loop)"),
]
RetriesOpt = Annotated[str, typer.Option("--retries", help="SDK retries: off|standard|adaptive")]
Seed = Annotated[int, typer.Option("--seed", help="random seed; task i uses seed + i")]
JsonOut = Annotated[Path, typer.Option("--json", help="write the results here (JSON)")]
PlotsDir = Annotated[Path | None, typer.Option("--plots", help="write PNG figures here")]
Keep = Annotated[
    bool, typer.Option("--keep", help="keep the target's table/bucket/queue/domain afterwards")
]
Sim = Annotated[
    list[str],
    typer.Option("--sim", help="KEY=VALUE for the simulated store, e.g. capacity_ops_s=500"),
]
TargetTable = Annotated[
    str | None, typer.Option(help="DynamoDB table to load (default: cmr-load-<random>)")
]
TargetBucket = Annotated[
    str | None, typer.Option(help="S3 bucket to load (default: cmr-load-<random>)")
]
TargetQueue = Annotated[
    str | None, typer.Option(help="SQS queue to load (default: cmr-load-<random>)")
]
TargetDomain = Annotated[
    str | None, typer.Option(help="SimpleDB domain to load (default: cmr-load-<random>)")
]
Backend = Annotated[str, typer.Option("--backend", help="engine: embedded (in-process) or aws")]
Workers = Annotated[int, typer.Option(help="workers to start (in-process when embedded)")]
VisibilityTimeout = Annotated[
    int | None, typer.Option(help="task lease, seconds (default: from the tasks' length)")
]
ShowProgress = Annotated[
    bool | None, typer.Option("--progress/--no-progress", help="live line (default: on a tty)")
]


@dataclass(frozen=True)
class Engine:
    """Where the load job runs and what it loads; built once per command from its flags."""

    target: str
    backend: str
    workers: int
    aws: AwsSettings
    visibility_timeout: int | None
    resources: dict[str, str]
    keep: bool
    progress: bool


def _engine(
    target: str,
    backend: str,
    workers: int,
    visibility_timeout: int | None,
    bucket: str,
    table: str,
    queue_prefix: str,
    region: str | None,
    profile: str | None,
    names: Mapping[str, str | None],
    keep: bool,
    progress: bool | None,
) -> Engine:
    if target not in TARGETS:
        raise UsageError(f"unknown --target {target!r}: use one of {', '.join(TARGETS)}")
    if backend not in ("embedded", "aws"):
        raise UsageError(f"unknown --backend {backend!r}: use embedded or aws")
    aws = AwsSettings(
        bucket=bucket, table=table, queue_prefix=queue_prefix, region=region, profile=profile
    )
    resources = {kind: name for kind, name in names.items() if name}
    wanted = RESOURCE.get(target)
    for kind in resources:
        if kind != wanted:
            raise UsageError(
                f"--target-{kind} does not apply to target {target}"
                + (f" (it uses --target-{wanted})" if wanted else " (it needs no resources)")
            )
    show = sys.stderr.isatty() if progress is None else progress
    return Engine(target, backend, workers, aws, visibility_timeout, resources, keep, show)


def _writable(path: Path, plots_dir: Path | None) -> None:
    """Fail before the test, not after it, when its results could not be saved."""
    for flag, directory in (("--json", path.parent), ("--plots", plots_dir)):
        if directory is None:
            continue
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"cannot create {directory} for {flag}: {exc.strerror or exc}"
            ) from None
        if not os.access(directory, os.W_OK):
            raise UsageError(f"cannot write under {directory} ({flag}): permission denied")
    if path.is_dir():
        raise UsageError(f"--json {path} is a directory: give a file name")
    if plots_dir is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plots needs matplotlib, which is not installed: pip install matplotlib")


def _split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as integers allow (the first ones get more)."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def _sim_overrides(pairs: Sequence[str], target: str) -> dict[str, Any]:
    """``--sim KEY=VALUE`` pairs typed after SimConfig's fields (so a typo fails up front)."""
    if pairs and target != "sim":
        raise UsageError(f"--sim configures the simulated store; target {target} is not it")
    known = {f.name: f for f in fields(SimConfig)}
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in known:
            raise UsageError(
                f"--sim {pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}"
            )
        default = getattr(SimConfig(), key)
        try:
            if raw.lower() in ("none", "") and key == "capacity_ops_s":
                value: Any = None
            elif isinstance(default, bool):
                value = raw.lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float) or default is None:
                value = float(raw)
            else:
                value = raw
        except ValueError:
            raise UsageError(f"--sim {pair!r}: {raw!r} is not a number") from None
        overrides[key] = value
    SimConfig(**overrides)  # validates the combination now, not inside a map task
    return overrides


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not values:
        raise UsageError(f"{flag} needs at least one value")
    return values


def _ints(text: str, flag: str) -> list[int]:
    values = _floats(text, flag)
    if any(v != int(v) or v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: expected whole numbers of at least 1")
    return [int(v) for v in values]


def _retries(value: str) -> Retries:
    if value not in get_args(Retries):
        raise UsageError(f"--retries {value!r}: use off, standard or adaptive")
    return value  # type: ignore[return-value]  # checked against the Literal just above


def _tasks(
    kind: Kind,
    target: str,
    count: int,
    *,
    seed: int,
    readers: int,
    writers: int,
    items: int,
    duration_s: float | None,
    ops: int | None,
    rate: float | None,
    resources: Mapping[str, str],
    sim: Mapping[str, Any],
    **options: Any,
) -> list[LoadTask]:
    """One task description per map task, with the totals (ops, rate) split between them."""
    if count < 1:
        raise UsageError("--tasks must be at least 1")
    if (duration_s is None) == (ops is None):
        raise UsageError("give exactly one of --duration and --ops")
    if duration_s is not None and duration_s <= 0:
        raise UsageError("--duration must be positive")
    if ops is not None and ops < count:
        raise UsageError(f"--ops {ops} is fewer than one operation per task ({count} tasks)")
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be positive")
    per_task_ops = _split(ops, count) if ops is not None else [None] * count
    return [
        LoadTask(
            kind=kind,
            target=target,
            task=i,
            seed=seed + i,
            readers=readers,
            writers=writers,
            items=items,
            duration_s=duration_s,
            ops=per_task_ops[i],
            rate=rate / count if rate is not None else None,
            resources=dict(resources),
            sim=dict(sim),
            **options,
        )
        for i in range(count)
    ]


async def _on_target(
    engine: Engine, status: report.LiveStatus, body: Callable[[dict[str, str]], Awaitable[T]]
) -> T:
    """Create the target's resources, run ``body`` with them, and delete them (unless --keep)."""
    status.phase(f"preparing {engine.target}")
    resources = await prepare(engine.target, engine.resources, engine.aws)
    try:
        return await body(resources)
    finally:
        if engine.keep:
            names = ", ".join(f"{k} {v}" for k, v in resources.items() if k in RESOURCE.values())
            if names:
                err.print(f"kept {engine.target} {names}", highlight=False)
        else:
            status.phase(f"cleaning up {engine.target}")
            await cleanup(engine.target, resources, engine.aws)


async def _measure(
    engine: Engine, tasks: list[LoadTask], status: report.LiveStatus, what: str = "running"
) -> Measurement:
    """Run one load job and return what its reducers merged."""
    from cmr.loadgen.job import run_load

    status.phase(what)
    return await run_load(
        tasks,
        backend=engine.backend,
        workers=engine.workers,
        aws=engine.aws,
        visibility_timeout=engine.visibility_timeout,
        on_progress=status.update,
    )


def _run(
    engine: Engine, label: str, main: Callable[[report.LiveStatus], Coroutine[Any, Any, T]]
) -> T:
    """asyncio.run with the live status line; every cmr error becomes one line and exit 1."""
    try:
        with report.LiveStatus(err, label, enabled=engine.progress) as status:
            return asyncio.run(main(status))
    except JobFailed as exc:
        # the reason carries the task's traceback; its last line is the error itself
        lines = [line for line in exc.reason.strip().splitlines() if line.strip()]
        fail(f"load job {exc.job_id} failed: {lines[-1] if lines else 'no reason recorded'}")
    except CmrError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        # asyncio.run cancelled the job and ran the target's cleanup on the way out
        err.print(f"{label}: interrupted", highlight=False)
        raise typer.Exit(130) from None


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")


def _write_plots(directory: Path | None, kind: str, data: Mapping[str, Any]) -> list[str]:
    """The figures of one command, named after it (jam-latency.png, cpq.png, ...)."""
    if directory is None:
        return []
    from cmr.loadgen import plots

    try:
        if kind == "jam":
            paths = [plots.latency_boxplots(data, directory / "jam-latency.png")]
        elif kind == "sweep":
            paths = [plots.sweep_plot(data, directory / "sweep-total-time.png")]
        elif kind == "staleness":
            paths = [plots.freshness_plot(data, directory / "staleness-freshness.png")]
        else:
            paths = [plots.cpq_plot(data, directory / "cpq.png")]
    except OSError as exc:
        fail(f"cannot write figures under {directory}: {exc.strerror or exc}")
    return [str(p) for p in paths]


def _finish(
    data: Mapping[str, Any],
    json_path: Path,
    tables: Sequence[Any],
    plots_dir: Path | None,
    kind: str,
) -> None:
    """Save the JSON first (the contract), then show the tables and draw the figures."""
    _write_json(json_path, data)
    for t in tables:
        out.print(t)
    out.file.flush()  # the tables before the stderr lines below, even when piped
    for warning in data.get("warnings") or []:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    figures = _write_plots(plots_dir, kind, data)
    err.print(f"results: {json_path}", highlight=False)
    if figures:
        err.print("figures: " + ", ".join(figures), highlight=False)


def _jam_report(m: Measurement, target: str, tasks: list[LoadTask]) -> dict[str, Any]:
    from cmr.loadgen.recorder import jam_report

    # duration defaults to the longest task's load phase: job start-up is not load
    return jam_report(m, target, len(tasks))


@loadgen_app.command()
def jam(
    target: TargetOpt,
    json_path: JsonOut,
    tasks: Tasks = 1,
    readers: Annotated[int, typer.Option(help="concurrent readers per task")] = 100,
    writers: Annotated[int, typer.Option(help="concurrent writers per task")] = 100,
    items: Items = 1,
    duration: Duration = None,
    ops: Ops = None,
    consistent_ratio: ConsistentRatio = 0.0,
    conditional_ratio: ConditionalRatio = 0.0,
    rate: Rate = None,
    retries: RetriesOpt = "off",
    seed: Seed = 0,
    sim: Sim = [],  # noqa: B006
    plots_dir: PlotsDir = None,
    keep: Keep = False,
    target_table: TargetTable = None,
    target_bucket: TargetBucket = None,
    target_queue: TargetQueue = None,
    target_domain: TargetDomain = None,
    backend: Backend = "embedded",
    workers: Workers = 1,
    visibility_timeout: VisibilityTimeout = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    progress: ShowProgress = None,
    verbose: Verbose = 0,
) -> None:
    """Jam the target with readers and writers (seed 000); print seed 002's Table I.

    Latency per operation and mode, errors by class, ok ops/s.
    """
    logs.configure(logging.WARNING - 10 * verbose)
    try:
        _writable(json_path, plots_dir)
        engine = _engine(
            target,
            backend,
            workers,
            visibility_timeout,
            bucket,
            table,
            queue_prefix,
            region,
            profile,
            _names(target_table, target_bucket, target_queue, target_domain),
            keep,
            progress,
        )
        task_list = _tasks(
            "jam",
            target,
            tasks,
            seed=seed,
            readers=readers,
            writers=writers,
            items=items,
            duration_s=duration,
            ops=ops,
            rate=rate,
            resources=engine.resources,
            sim=_sim_overrides(sim, target),
            consistent_ratio=consistent_ratio,
            conditional_ratio=conditional_ratio,
            retries=_retries(retries),
        )
    except CmrError as exc:
        fail(str(exc))

    async def main(status: report.LiveStatus) -> dict[str, Any]:
        async def body(resources: dict[str, str]) -> dict[str, Any]:
            m = await _measure(engine, _with(task_list, resources), status)
            return _jam_report(m, target, task_list)

        return await _on_target(engine, status, body)

    data = _run(engine, f"jam {target}", main)
    _finish(
        data,
        json_path,
        [report.jam_table(data)],
        plots_dir,
        "jam",
    )


def _names(
    table: str | None, bucket: str | None, queue: str | None, domain: str | None
) -> dict[str, str | None]:
    return {"table": table, "bucket": bucket, "queue": queue, "domain": domain}


def _with(tasks: list[LoadTask], resources: Mapping[str, str]) -> list[LoadTask]:
    """The tasks with the resource names ``prepare`` settled on."""
    return [replace(t, resources=dict(resources)) for t in tasks]


def _warnings_of(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every distinct warning of a run of points, once (they tend to repeat)."""
    return list(dict.fromkeys(w for p in points for w in p.get("warnings") or []))


def _mix(op: Op, concurrency: int) -> tuple[int, int]:
    """(readers, writers) making up one sweep point's concurrency."""
    if op == "get":
        return concurrency, 0
    if op == "put":
        return 0, concurrency
    writers = concurrency // 2
    return concurrency - writers, writers


@loadgen_app.command()
def sweep(
    target: TargetOpt,
    json_path: JsonOut,
    concurrency: Annotated[
        str, typer.Option(help="operators per task at each point, comma-separated")
    ] = "1,10,50,100,200",
    ops: Annotated[int, typer.Option(help="operations at every point, in all")] = 10000,
    items: Annotated[
        str, typer.Option(help="item counts, comma-separated: a curve each (e.g. 1,1000)")
    ] = "1",
    op: Annotated[str, typer.Option(help="get: all readers; put: all writers; both: half each")] = (
        "both"
    ),
    tasks: Tasks = 1,
    consistent_ratio: ConsistentRatio = 0.0,
    conditional_ratio: ConditionalRatio = 0.0,
    retries: RetriesOpt = "off",
    seed: Seed = 0,
    sim: Sim = [],  # noqa: B006
    plots_dir: PlotsDir = None,
    keep: Keep = False,
    target_table: TargetTable = None,
    target_bucket: TargetBucket = None,
    target_queue: TargetQueue = None,
    target_domain: TargetDomain = None,
    backend: Backend = "embedded",
    workers: Workers = 1,
    visibility_timeout: VisibilityTimeout = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    progress: ShowProgress = None,
    verbose: Verbose = 0,
) -> None:
    """Total time of a fixed number of operations at rising concurrency (seed 000).

    One jam per (items, concurrency) point; a curve per --items value.
    """
    logs.configure(logging.WARNING - 10 * verbose)
    try:
        if op not in ("get", "put", "both"):
            raise UsageError(f"--op {op!r}: use get, put or both")
        mix: Op = op  # type: ignore[assignment]  # checked just above
        levels = _ints(concurrency, "--concurrency")
        item_counts = _ints(items, "--items")
        _writable(json_path, plots_dir)
        engine = _engine(
            target,
            backend,
            workers,
            visibility_timeout,
            bucket,
            table,
            queue_prefix,
            region,
            profile,
            _names(target_table, target_bucket, target_queue, target_domain),
            keep,
            progress,
        )
        overrides = _sim_overrides(sim, target)
        plan = []
        for k in item_counts:
            for c in levels:
                r, w = _mix(mix, c)
                plan.append(
                    (
                        k,
                        c,
                        r,
                        w,
                        _tasks(
                            "jam",
                            target,
                            tasks,
                            seed=seed,
                            readers=r,
                            writers=w,
                            items=k,
                            duration_s=None,
                            ops=ops,
                            rate=None,
                            resources=engine.resources,
                            sim=overrides,
                            consistent_ratio=consistent_ratio,
                            conditional_ratio=conditional_ratio,
                            retries=_retries(retries),
                        ),
                    )
                )
    except CmrError as exc:
        fail(str(exc))

    async def main(status: report.LiveStatus) -> list[dict[str, Any]]:
        async def body(resources: dict[str, str]) -> list[dict[str, Any]]:
            points = []
            for n, (k, c, r, w, task_list) in enumerate(plan, 1):
                what = f"point {n}/{len(plan)}: {k} item(s), concurrency {c}"
                m = await _measure(engine, _with(task_list, resources), status, what)
                jam_data = _jam_report(m, target, task_list)
                total_s = float(jam_data["duration_s"])
                ok = sum(int(o.get("ok", 0)) for o in jam_data.get("ops", []))
                points.append(
                    {
                        "items": k,
                        "concurrency": c,
                        "readers": r,
                        "writers": w,
                        "total_s": total_s,
                        "throughput_ops_s": ok / total_s if total_s > 0 else 0.0,
                        "errors": report.total_errors(jam_data.get("ops", [])),
                        "ops": jam_data.get("ops", []),
                        "warnings": jam_data.get("warnings", []),
                    }
                )
            return points

        return await _on_target(engine, status, body)

    points = _run(engine, f"sweep {target}", main)
    data = {
        "target": target,
        "items": item_counts,
        "op": op,
        "tasks": tasks,
        "ops_per_point": ops,
        "points": points,
        "warnings": _warnings_of(points),
    }
    _finish(
        data,
        json_path,
        [report.sweep_table(data)],
        plots_dir,
        "sweep",
    )


@loadgen_app.command()
def staleness(
    target: TargetOpt,
    json_path: JsonOut,
    duration: Annotated[float, typer.Option(help="seconds each task runs")],
    write_interval_ms: Annotated[int, typer.Option(help="the writer writes this often")] = 1000,
    readers: Annotated[int, typer.Option(help="readers per task, reading as fast as they can")] = 4,
    consistent_ratio: Annotated[
        float,
        typer.Option(help="P(a read is strongly consistent); 0.5 draws both of seed 004's curves"),
    ] = 0.5,
    tasks: Tasks = 1,
    items: Items = 1,
    seed: Seed = 0,
    sim: Sim = [],  # noqa: B006
    plots_dir: PlotsDir = None,
    keep: Keep = False,
    target_table: TargetTable = None,
    target_bucket: TargetBucket = None,
    target_queue: TargetQueue = None,
    target_domain: TargetDomain = None,
    backend: Backend = "embedded",
    workers: Workers = 1,
    visibility_timeout: VisibilityTimeout = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    progress: ShowProgress = None,
    verbose: Verbose = 0,
) -> None:
    """Freshness against time since the latest write (seeds 002 and 004).

    One writer writes increasing values, readers record what they see; also monotonic-read
    and read-your-writes violations, stale fractions and Γ.
    """
    logs.configure(logging.WARNING - 10 * verbose)
    try:
        _writable(json_path, plots_dir)
        engine = _engine(
            target,
            backend,
            workers,
            visibility_timeout,
            bucket,
            table,
            queue_prefix,
            region,
            profile,
            _names(target_table, target_bucket, target_queue, target_domain),
            keep,
            progress,
        )
        task_list = _staleness_tasks(
            target,
            tasks,
            seed,
            readers,
            items,
            duration,
            write_interval_ms,
            consistent_ratio,
            engine.resources,
            _sim_overrides(sim, target),
        )
    except CmrError as exc:
        fail(str(exc))

    async def main(status: report.LiveStatus) -> dict[str, Any]:
        async def body(resources: dict[str, str]) -> dict[str, Any]:
            m = await _measure(engine, _with(task_list, resources), status)
            return {"target": target, **_staleness_report(m)}

        return await _on_target(engine, status, body)

    data = _run(engine, f"staleness {target}", main)
    tables = [report.freshness_table(data), report.staleness_table(data)]
    succ = report.successive_table(data)
    _finish(
        data,
        json_path,
        [*tables, *([succ] if succ is not None else [])],
        plots_dir,
        "staleness",
    )


def _staleness_tasks(
    target: str,
    count: int,
    seed: int,
    readers: int,
    items: int,
    duration: float,
    write_interval_ms: int,
    consistent_ratio: float,
    resources: Mapping[str, str],
    sim: Mapping[str, Any],
) -> list[LoadTask]:
    if target == "sqs":
        raise UsageError("staleness needs a keyed store and sqs has no keys: use jam on sqs")
    if write_interval_ms < 1:
        raise UsageError("--write-interval-ms must be at least 1")
    if readers < 1:
        raise UsageError("--readers must be at least 1: a staleness test needs someone to read")
    return _tasks(
        "staleness",
        target,
        count,
        seed=seed,
        readers=readers,
        writers=1,
        items=items,
        duration_s=duration,
        ops=None,
        rate=None,
        resources=resources,
        sim=sim,
        consistent_ratio=consistent_ratio,
        write_interval_ms=write_interval_ms,
    )


def _staleness_report(m: Measurement) -> dict[str, Any]:
    from cmr.loadgen.recorder import staleness_report

    return staleness_report(m)


def _cpq_point(p: float, data: Mapping[str, Any]) -> dict[str, Any]:
    """One point of seed 003 Fig. 2 from a staleness report measured at probability p."""
    by_mode = data.get("stale") or {}
    latency = data.get("latency_ms") or {}
    gamma = {k: v for k, v in (data.get("gamma") or {}).items() if k != "per_key_ms"}
    return {
        "p": p,
        "stale_fraction": data.get("stale_fraction"),
        "read_p95_ms": (latency.get("read") or {}).get("p95"),
        "write_p95_ms": (latency.get("write") or {}).get("p95"),
        # the stale fraction's own denominator: judged reads of every mode
        "reads": sum(int(v.get("reads", 0)) for v in by_mode.values()),
        "stale": sum(int(v.get("stale", 0)) for v in by_mode.values()),
        "stale_by_mode": by_mode,
        "writes": data.get("writes"),
        "gamma": gamma,
        "latency_ms": latency,
        "monotonic_read_violations": data.get("monotonic_read_violations"),
        "read_your_writes_violations": data.get("read_your_writes_violations"),
        "warnings": data.get("warnings", []),
    }


@loadgen_app.command()
def cpq(
    target: TargetOpt,
    json_path: JsonOut,
    p: Annotated[
        str, typer.Option("--p", help="probabilities of the strong mode, comma-separated")
    ] = "0,0.25,0.5,0.75,1",
    duration: Annotated[float, typer.Option(help="seconds each point runs")] = 10.0,
    write_interval_ms: Annotated[int, typer.Option(help="the writer writes this often")] = 1000,
    readers: Annotated[int, typer.Option(help="readers per task")] = 4,
    tasks: Tasks = 1,
    items: Items = 1,
    seed: Seed = 0,
    sim: Sim = [],  # noqa: B006
    plots_dir: PlotsDir = None,
    keep: Keep = False,
    target_table: TargetTable = None,
    target_bucket: TargetBucket = None,
    target_queue: TargetQueue = None,
    target_domain: TargetDomain = None,
    backend: Backend = "embedded",
    workers: Workers = 1,
    visibility_timeout: VisibilityTimeout = None,
    bucket: Bucket = "cmr-data",
    table: TableName = "cmr",
    queue_prefix: QueuePrefix = "cmr-",
    region: Region = None,
    profile: Profile = None,
    progress: ShowProgress = None,
    verbose: Verbose = 0,
) -> None:
    """Consistency and latency against p, continuous partial quorums (seed 003).

    At each p every read is strongly consistent with probability p; reports the stale
    fraction and p95 read/write latency.
    """
    logs.configure(logging.WARNING - 10 * verbose)
    try:
        ps = _floats(p, "--p")
        if any(not 0.0 <= x <= 1.0 for x in ps):
            raise UsageError(f"--p {p!r}: probabilities must be between 0 and 1")
        _writable(json_path, plots_dir)
        engine = _engine(
            target,
            backend,
            workers,
            visibility_timeout,
            bucket,
            table,
            queue_prefix,
            region,
            profile,
            _names(target_table, target_bucket, target_queue, target_domain),
            keep,
            progress,
        )
        overrides = _sim_overrides(sim, target)
        plan = [
            (
                x,
                _staleness_tasks(
                    target,
                    tasks,
                    seed,
                    readers,
                    items,
                    duration,
                    write_interval_ms,
                    x,
                    engine.resources,
                    overrides,
                ),
            )
            for x in ps
        ]
    except CmrError as exc:
        fail(str(exc))

    async def main(status: report.LiveStatus) -> list[dict[str, Any]]:
        async def body(resources: dict[str, str]) -> list[dict[str, Any]]:
            points = []
            for n, (x, task_list) in enumerate(plan, 1):
                what = f"point {n}/{len(plan)}: p = {x:g}"
                m = await _measure(engine, _with(task_list, resources), status, what)
                points.append(_cpq_point(x, _staleness_report(m)))
            return points

        return await _on_target(engine, status, body)

    points = _run(engine, f"cpq {target}", main)
    data = {
        "target": target,
        "duration_s": duration,
        "write_mode": "plain",
        "points": points,
        "warnings": _warnings_of(points),
    }
    _finish(data, json_path, [report.cpq_table(data)], plots_dir, "cpq")
