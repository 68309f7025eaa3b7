"""What every ``cmr loadgen`` command shares, written once: its flags (``LoadFlags``), the
engine built from them (``Engine``), running load jobs on a prepared target (``run``) and
saving the results (``finish``). The commands themselves are in ``cmr.cli.loadgen``.

Before anything runs, ``run`` states the target (``cmr.loadgen.targets.aim``); a target
that is not a local endpoint needs ``--yes`` or a yes on the terminal, and without either
it is refused before a single request. Afterwards it removes only what the run made
(``cmr.loadgen.targets.resources``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.text import Text

from cmr.cli.exits import USAGE
from cmr.cli.options import (
    StoreFlags,
    Verbose,
    choice_option,
    configure_logs,
    err,
    fail,
    out,
    safe_text,
)
from cmr.cli.tables import print_table
from cmr.errors import JobFailed, UsageError
from cmr.loadgen import extra, plan, report
from cmr.loadgen.spec import TARGETS, LoadTask
from cmr.loadgen.targets import RESOURCE, Prepared, cleanup, prepare
from cmr.loadgen.targets.aim import Aim, aim, survey
from cmr.loadgen.targets.azure import missing_sdk
from cmr.settings import BackendName, Store

# the engine, HDR histograms and matplotlib are imported inside the commands: the help and
# a refused flag must not pay for them (matplotlib alone costs over a second)
if TYPE_CHECKING:
    from cmr.loadgen.recorder import Measurement

T = TypeVar("T")
Target = StrEnum("Target", [(t, t) for t in TARGETS])  # type: ignore[misc]  # from spec's list


class RetriesMode(StrEnum):
    """SDK retries of a load task (spec.Retries): off, so that a jam sees every error."""

    off = "off"
    standard = "standard"
    adaptive = "adaptive"


@dataclass(frozen=True)
class LoadFlags:
    """The flags of every load test: what it loads, where its results go, who runs it."""

    target: Annotated[str, choice_option(Target, "--target", "the store to load")]
    json_path: Annotated[
        Path,
        typer.Option(
            "--json",
            help="write the results here (JSON); '-': print them on stdout, as one JSON "
            "document (the tables then go to stderr)",
        ),
    ]
    seed: Annotated[int, typer.Option(help="random seed; task i uses seed + i")] = 0
    sim: Annotated[
        list[str],
        typer.Option(help="KEY=VALUE for the simulated store, e.g. capacity_ops_s=500"),
    ] = field(default_factory=list)
    plots_dir: Annotated[Path | None, typer.Option("--plots", help="write PNG figures here")] = None
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="keep what the run made: its new table/bucket/queue/domain/container, or its keys",
        ),
    ] = False
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="load a target that is not a local endpoint without asking"
        ),
    ] = False
    allow_cmr_store: Annotated[
        bool,
        typer.Option(
            "--allow-cmr-store",
            help="allow cmr's own table/bucket/queue prefix (of --store) as the target",
        ),
    ] = False
    target_table: Annotated[
        str | None,
        typer.Option(help="DynamoDB or Azure table to load; an existing one is kept [a new one]"),
    ] = None
    target_bucket: Annotated[
        str | None, typer.Option(help="S3 bucket to load; an existing one is kept [a new one]")
    ] = None
    target_queue: Annotated[
        str | None, typer.Option(help="SQS queue to load; an existing one is kept [a new one]")
    ] = None
    target_domain: Annotated[
        str | None,
        typer.Option(help="SimpleDB domain to load; an existing one is kept [a new one]"),
    ] = None
    target_container: Annotated[
        str | None,
        typer.Option(help="Azure blob container to load; an existing one is kept [a new one]"),
    ] = None
    workers: Annotated[int, typer.Option(help="workers to start (in-process when embedded)")] = 1
    visibility_timeout: Annotated[
        int | None, typer.Option(help="task lease, seconds (default: from the tasks' length)")
    ] = None
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="live line (default: on a tty)"),
    ] = None
    verbose: Verbose = 0


@dataclass(frozen=True)
class Engine:
    """Where the load job runs and what it loads; built once per command from its flags."""

    target: str
    store: Store
    workers: int
    visibility_timeout: int | None
    aim: Aim  # the target's endpoint and resources, settled before any request
    sim: dict[str, Any]
    keep: bool
    yes: bool
    progress: bool
    seed: int

    @property
    def resources(self) -> dict[str, str]:
        return self.aim.resources

    def jam_tasks(self, count: int, **shape: Any) -> list[LoadTask]:
        """A jam's task list on this engine's target, resources and simulation."""
        return plan.tasks(
            "jam",
            self.target,
            count,
            seed=self.seed,
            resources=self.resources,
            sim=self.sim,
            **shape,
        )

    def staleness_tasks(self, count: int, **shape: Any) -> list[LoadTask]:
        """A staleness run's task list on this engine's target, resources and simulation."""
        return plan.staleness_tasks(
            self.target, count, seed=self.seed, resources=self.resources, sim=self.sim, **shape
        )


def engine_of(load: LoadFlags, store: StoreFlags) -> Engine:
    """Check the flags every test shares (before anything is created) and build its engine."""
    # Without the loadgen extra, one line saying what to install (exit 2, as for a command
    # line that cannot run), before anything is made, not an ImportError in a task.
    if load.plots_dir is None:
        missing = extra.missing("cmr loadgen", "hdrh")
    else:
        missing = extra.missing("cmr loadgen --plots", "hdrh", "matplotlib")
    # the Azure targets' SDKs are the azure extra: said the same way
    missing = missing or missing_sdk(str(load.target))
    if missing:
        fail(missing, code=USAGE)
    configure_logs(logging.WARNING - 10 * load.verbose)
    target = str(load.target)
    named = {
        "table": load.target_table,
        "bucket": load.target_bucket,
        "queue": load.target_queue,
        "domain": load.target_domain,
        "container": load.target_container,
    }
    resources = {kind: name for kind, name in named.items() if name}
    wanted = RESOURCE.get(target)
    for kind in resources:
        if kind != wanted:
            raise UsageError(
                f"--target-{kind} does not apply to target {target}"
                + (f" (it uses --target-{wanted})" if wanted else " (it needs no resources)")
            )
    _writable(load.json_path, load.plots_dir)
    where = store.resolve(BackendName.embedded)
    sim = plan.sim_overrides(list(load.sim), target)
    return Engine(
        target,
        where,
        load.workers,
        load.visibility_timeout,
        aim(target, resources, where.aws, allow_own_store=load.allow_cmr_store),
        sim,
        load.keep,
        load.yes,
        sys.stderr.isatty() if load.progress is None else load.progress,
        load.seed,
    )


STDOUT = Path("-")  # --json -: the results on stdout


def _writable(path: Path, plots_dir: Path | None) -> None:
    """Fail before the test, not after it, when its results could not be saved."""
    json_dir = None if path == STDOUT else path.parent
    for flag, directory in (("--json", json_dir), ("--plots", plots_dir)):
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


Measure = Callable[[list[LoadTask], str], Awaitable["Measurement"]]


def confirm(engine: Engine) -> None:
    """State the target; a target that is not local needs --yes or a yes on the terminal
    (without either, refused before any request is sent)."""
    target = engine.aim
    terminal = sys.stdin is not None and sys.stdin.isatty()
    if not target.local and not engine.yes and not terminal:
        fail(
            f"the load target, {target.where()}, is not a local endpoint and there is no "
            "terminal to confirm on: pass --yes to load it"
        )
    sighting = asyncio.run(survey(target, engine.store.aws))
    for line in sighting.statement(engine.keep):
        err.print(line, highlight=False, markup=False)
    asked = not target.local and not engine.yes
    if asked and not typer.confirm("Load this target?", default=False, err=True):
        fail("not confirmed: nothing was created or loaded")


def run(engine: Engine, label: str, body: Callable[[Measure], Awaitable[T]]) -> T:
    """State and confirm the target, create what it lacks, run ``body`` (which measures load
    jobs on it with the ``Measure`` it is given), and remove what the run made (unless
    --keep), under the live status line. The one place a load job is started."""
    from cmr.loadgen.job import run_load

    confirm(engine)

    async def main(status: report.LiveStatus) -> T:
        status.phase(f"preparing {engine.target}")
        prepared = await prepare(engine.target, engine.resources, engine.store.aws)
        measured: list[list[LoadTask]] = []  # the run's record of the keys it wrote

        async def measure(task_list: list[LoadTask], what: str) -> Measurement:
            status.phase(what)
            # each measurement its own keys: a point never reads what an earlier one wrote
            base = prepared.resources.get("prefix", "")
            point = {**prepared.resources, "prefix": f"{base}p{len(measured) + 1}/"}
            tasks = plan.with_resources(task_list, point if base else prepared.resources)
            measured.append(tasks)
            return await run_load(
                tasks,
                backend=engine.store.backend,
                workers=engine.workers,
                aws=engine.store.aws,
                visibility_timeout=engine.visibility_timeout,
                on_progress=status.update,
            )

        try:
            return await body(measure)
        finally:
            if engine.keep:
                _kept(prepared)
            else:
                status.phase(f"cleaning up {engine.target}")
                written = [k for tasks in measured for t in tasks for k in t.writes()]
                for note in await cleanup(prepared, written, engine.store.aws):
                    err.print(f"warning: {note}", highlight=False, markup=False)

    try:
        with report.LiveStatus(err, label, enabled=engine.progress) as status:
            return asyncio.run(main(status))
    except JobFailed as exc:
        # the reason carries the task's traceback; its last line is the error itself
        lines = [line for line in exc.reason.strip().splitlines() if line.strip()]
        fail(f"load job {exc.job_id} failed: {lines[-1] if lines else 'no reason recorded'}")
    except KeyboardInterrupt:
        # asyncio.run cancelled the job and ran the target's cleanup on the way out
        err.print(f"{label}: interrupted", highlight=False, markup=False)
        raise typer.Exit(130) from None


def _kept(prepared: Prepared) -> None:
    kind = RESOURCE.get(prepared.target)
    if kind is None:
        return
    prefix = prepared.resources.get("prefix")
    if prepared.created is not None:
        said = f"kept {prepared.target} {kind} {prepared.name}"
    elif prepared.target == "sqs":
        said = f"kept the run's messages in queue {prepared.name}"
    else:
        said = f"kept the run's keys under {prefix} in {kind} {prepared.name}"
    err.print(said, highlight=False, markup=False)


def finish(load: LoadFlags, kind: str, data: Mapping[str, Any], tables: Sequence[Any]) -> None:
    """Save the JSON first (the contract), then show the tables and draw the figures. With
    ``--json -`` stdout holds the JSON document alone, and the tables go to stderr."""
    to_stdout = load.json_path == STDOUT
    if to_stdout:
        print(json.dumps(data, indent=2), flush=True)
    else:
        try:
            load.json_path.parent.mkdir(parents=True, exist_ok=True)
            load.json_path.write_text(json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            fail(f"cannot write {load.json_path}: {exc.strerror or exc}")
    for t in tables:
        print_table(err if to_stdout else out, t)
    out.file.flush()  # the tables before the stderr lines below, even when piped
    for warning in data.get("warnings") or []:
        err.print(Text.assemble(("warning:", "yellow"), " ", safe_text(warning)), highlight=False)
    if not to_stdout:
        err.print(f"results: {load.json_path}", highlight=False, markup=False)
    if load.plots_dir is not None:
        err.print("figures: " + _plot(load.plots_dir, kind, data), highlight=False, markup=False)


def _plot(directory: Path, kind: str, data: Mapping[str, Any]) -> str:
    """The figure of one command, named after it (jam-latency.png, cpq.png, ...)."""
    from cmr.loadgen import plots

    draw, name = {
        "jam": (plots.latency_boxplots, "jam-latency.png"),
        "sweep": (plots.sweep_plot, "sweep-total-time.png"),
        "staleness": (plots.freshness_plot, "staleness-freshness.png"),
        "cpq": (plots.cpq_plot, "cpq.png"),
    }[kind]
    try:
        return str(draw(data, directory / name))
    except OSError as exc:
        fail(f"cannot write figures under {directory}: {exc.strerror or exc}")


def warnings_of(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every distinct warning of a run of points, once (they tend to repeat)."""
    return list(dict.fromkeys(w for p in points for w in p.get("warnings") or []))


def jam_report(m: Measurement, target: str, task_list: list[LoadTask]) -> dict[str, Any]:
    from cmr.loadgen import summary

    # duration defaults to the longest task's load phase: job start-up is not load
    return summary.jam_report(m, target, len(task_list))


def staleness_report(m: Measurement) -> dict[str, Any]:
    from cmr.loadgen import summary

    return summary.staleness_report(m)
