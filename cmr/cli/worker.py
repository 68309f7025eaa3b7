"""``cmr worker``: the fleet's only process; serves every running job (or one) until idle."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cmr.cli.options import (
    StoreFlags,
    Verbose,
    check_range,
    configure_logs,
    fail,
    machine_memory_mb,
    shared,
)
from cmr.settings import BackendName, WorkerSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from cmr.runtime import Hook, Runtime
    from cmr.worker import Worker

MAX_SLOTS = 1024  # processes or slots of one worker: each holds a task's data in memory
MAX_IDLE_S = 30 * 24 * 3600
STOP_AT = "CMR_STOP_AT"  # a testing aid: the worker stops itself (SIGSTOP) at this step
# A testing aid: how often a worker serving one job (--job) looks at it, seconds; long, it
# shows that the worker stopped when poked (POKE, in cmr.api), not at a refresh.
JOB_REFRESH = "CMR_JOB_REFRESH_S"


@shared("store", StoreFlags)
def worker(
    store: StoreFlags,
    idle_exit: Annotated[
        float | None, typer.Option(help="exit after this many idle seconds")
    ] = None,
    job: Annotated[str | None, typer.Option(help="serve only this job, exit when it ends")] = None,
    processes: Annotated[
        int | None,
        typer.Option(help="CPU processes for user code", show_default="the CPUs it may use"),
    ] = None,
    map_slots: Annotated[
        int | None, typer.Option(help="map tasks at once", show_default="the CPUs it may use")
    ] = None,
    reduce_slots: Annotated[
        int | None, typer.Option(help="reduce tasks at once", show_default="the CPUs it may use")
    ] = None,
    backups: Annotated[
        bool,
        typer.Option(
            "--backups/--no-backups",
            help="let idle slots run backup attempts of stragglers (tasks far slower than "
            "their finished peers; the first committed attempt wins)",
        ),
    ] = True,
    memory_mb: Annotated[
        int | None, typer.Option(help="reducer memory before spilling", show_default="512")
    ] = None,
    create: Annotated[bool, typer.Option(help="create the bucket and table if missing")] = True,
    jobs_from: Annotated[
        list[str] | None,
        typer.Option(
            "--jobs-from",
            help="where job code may come from (repeatable): a directory, written as a path "
            "(./jobs, /srv/jobs), or a module name (mypkg.jobs, its submodules too); a job "
            "whose code lies elsewhere is not served",
            show_default="the current directory",
        ),
    ] = None,
    outputs_under: Annotated[
        list[str] | None,
        typer.Option(
            "--outputs-under",
            help="a URL prefix job outputs may lie under (repeatable); a job whose output "
            "lies elsewhere is not served",
            show_default="the store's bucket",
        ),
    ] = None,
    inputs_under: Annotated[
        list[str] | None,
        typer.Option(
            "--inputs-under",
            help="a URL prefix job inputs may lie under (repeatable); a job reading anything "
            "elsewhere (but its own scratch) is not served",
            show_default="the store's bucket",
        ),
    ] = None,
    settings_json: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="WorkerSettings.to_json(): how `cmr run` hands its settings to the workers "
            "it starts; the flags above override it",
        ),
    ] = None,
    log_level: Annotated[
        int | None,
        typer.Option(
            hidden=True,
            help="how `cmr run` hands its verbosity to the workers it starts (a logging level)",
        ),
    ] = None,
    verbose: Verbose = 0,
) -> None:
    """Serve every running job (or one) until idle: the fleet's only process."""
    # A poke (POKE, in cmr.api) before the worker's loop can take it, or after, is
    # nothing to act on: not the end of the process, as the signal's default would have it.
    # A handler of ours, not SIG_IGN: an ignored signal stays ignored in what the worker
    # starts (its pool, and any program the user's code runs), a handler does not.
    pokes: list[Callable[[], None]] = []
    signal.signal(signal.SIGUSR1, lambda _sig, _frame: [poke() for poke in pokes])
    configure_logs(logging.INFO - 10 * verbose if log_level is None else log_level)
    for flag, count in (
        ("--processes", processes),
        ("--map-slots", map_slots),
        ("--reduce-slots", reduce_slots),
    ):
        check_range(
            flag, count, 1, MAX_SLOTS, "each holds a running task's data in memory; for more, "
            "run more workers",
        )  # fmt: skip
    check_range(
        "--memory-mb", memory_mb, 0, machine_memory_mb(),
        "MB the reducers hold before they spill to disk, 0 to spill everything: it must fit "
        "in this machine's memory",
    )  # fmt: skip
    check_range("--idle-exit", idle_exit, 0, MAX_IDLE_S, "seconds, at most 30 days")
    where = store.resolve(BackendName.aws, create=create)
    if where.backend == BackendName.embedded:
        fail(
            "a standalone worker needs a shared backend: use --store aws://BUCKET/TABLE or "
            "--store azure://ACCOUNT/CONTAINER/TABLE (the embedded backend lives inside "
            "`cmr run`)"
        )
    given: dict[str, Any] = {
        "processes": processes,
        "map_slots": map_slots,
        "reduce_slots": reduce_slots,
        "memory_mb": memory_mb,
        "idle_exit_s": idle_exit,
        "backups": None if backups else False,
        "jobs_from": tuple(jobs_from) if jobs_from else None,
        "outputs_under": tuple(outputs_under) if outputs_under else None,
        "inputs_under": tuple(inputs_under) if inputs_under else None,
    }
    base = WorkerSettings.from_json(settings_json) if settings_json else WorkerSettings()
    ws = replace(base, **{k: v for k, v in given.items() if v is not None})
    hook = _stop_at(os.environ.get(STOP_AT))
    refresh = _job_refresh(os.environ.get(JOB_REFRESH))

    async def serve() -> None:
        from cmr import api
        from cmr.worker import Worker

        async with api.open_backend(where.backend, where.aws) as be:
            with api.cpu_pool(ws.processes) as pool:
                w = Worker(
                    be, ws, pool, only_job=job, hook=hook, queue_prefix=where.aws.queue_prefix,
                    job_refresh_s=refresh,
                )  # fmt: skip
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, w.done.set)
                # `cmr run`'s word that a job may have ended (POKE, in cmr.api): refresh
                # now. Taken by the handler above, which stays after the loop closes (the
                # loop's own would give the signal back its default, the end of the process).
                pokes.append(functools.partial(_poke_soon, loop, w))
                try:
                    await w.run()
                finally:
                    # The worker stopped: a task still in the pool was abandoned with its
                    # slot (its lease lapses); do not wait for it to end.
                    pool.kill()

    asyncio.run(serve())


def _poke_soon(loop: asyncio.AbstractEventLoop, w: Worker) -> None:
    """Have the worker refresh its jobs, from a signal handler (on the loop's thread, but
    between any two of its steps: through the loop's own queue, which wakes it)."""
    with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to refresh
        loop.call_soon_threadsafe(w.poke)


def _job_refresh(given: str | None) -> float:
    """JOB_REFRESH's seconds (the worker's own period when unset)."""
    from cmr.worker import JOB_REFRESH_S

    if given is None:
        return JOB_REFRESH_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_IDLE_S:
        fail(f"{JOB_REFRESH}={given!r}: it must be seconds, more than 0, at most {MAX_IDLE_S:,}")
    return seconds


def _stop_at(step: str | None) -> Hook | None:
    """A hook that freezes the worker, as a SIGSTOP from outside would, the first time it
    reaches ``step`` (one of cmr.runtime.STEPS): lets a test kill a worker at an exact
    point of the protocol, in a real process."""
    if not step:
        return None
    from cmr.runtime import STEPS

    if step not in STEPS:
        fail(f"{STOP_AT}={step!r} is not a step; steps: {', '.join(STEPS)}")
    fired: list[bool] = []

    async def hook(rt: Runtime, name: str, context: dict[str, Any]) -> None:
        if name == step and not fired:
            fired.append(True)
            print(f"{STOP_AT}: stopping at {step} (pid {os.getpid()})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    return hook
