"""``cmr.run``: the whole job from Python (notebooks, tests), as the CLI runs it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cmr import counters, logs, pipeline, submit, usage, watch
from cmr.admission import serving_own_job
from cmr.backends.base import Backend
from cmr.backends.embedded import temporary_backend
from cmr.backends.retry import with_retries
from cmr.errors import UsageError, WorkersGone
from cmr.job import Job
from cmr.jobload import LoadedJob, load_job
from cmr.joboptions import JobOptions
from cmr.pool import CpuPool, cpu_pool
from cmr.publish import read_manifest
from cmr.records import JobSpec, step_job_id
from cmr.settings import (
    AwsSettings,
    BackendName,
    Store,
    WorkerSettings,
    default_cores,
    default_poll_s,
)
from cmr.worker import Worker

MAX_WORKERS = 64  # workers one `cmr run` starts on its own machine


@dataclass
class RunResult:
    job_id: str
    output: str
    parts: list[str]
    seconds: float
    record: dict[str, Any]
    calls: Counter[str] = field(default_factory=Counter)

    @property
    def stats(self) -> dict[str, int]:
        return {k: v for k, v in self.record.items() if isinstance(v, int)}

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """The job's counters (``Job.increment_counter``): {group: {name: total}}, each
        winning task attempt counted once."""
        return counters.of_record(self.record)


# The job, loaded once (a reference a worker can load, and the class): the name the
# harnesses (cmr.testing), tests and benchmarks call it by.
job_ref = load_job


AZURE_INSTALL = "pip install 'cmr[azure]' (in a checkout: scripts/setup.sh azure)"


@contextlib.asynccontextmanager
async def open_backend(name: str, aws: AwsSettings) -> AsyncIterator[Backend]:
    if name == "embedded":
        async with temporary_backend() as backend:
            yield with_retries(backend)
    elif name == "aws":
        from cmr.backends.aws import open_aws  # aioboto3 loads only when needed

        async with open_aws(aws) as backend:
            yield with_retries(backend)
    elif name == "azure":
        try:  # the Azure SDKs: only when needed, and only with the azure extra
            from cmr.backends.azure.opening import open_azure
        except ModuleNotFoundError as exc:
            raise UsageError(
                f"the azure backend needs the azure extra ({exc}): {AZURE_INSTALL}"
            ) from None

        async with open_azure(aws) as backend:
            yield with_retries(backend)
    else:
        raise UsageError(f"unknown backend {name!r}: use embedded, aws or azure")


async def _until_done(waiter: asyncio.Task[Any], helpers: list[asyncio.Task[Any]]) -> Any:
    """Wait for the job, but surface a crashed in-process worker instead of hanging."""
    pending = {waiter, *helpers}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        for t in done:
            t.result()  # re-raise a worker's crash


@dataclass(frozen=True)
class RunOptions:
    """Everything about one run but the job and its input and output, built once (by the CLI
    or from ``cmr.run``'s keywords). The job's own options become one checked
    :class:`cmr.joboptions.JobOptions` at submit (:meth:`job_options`); the rest says who
    runs it and who hears about it."""

    reducers: int | None = None  # partitions; None: the job class's ``reducers``
    workers: int = 1  # in-process workers, or `cmr worker` processes on aws; 0: a fleet's
    params: Mapping[str, str] = field(default_factory=dict)
    visibility_timeout: int = 60  # a task's lease, seconds
    task_timeout: int = 0  # 0: grows with each task's input (cmr.timelimit)
    max_task_attempts: int = 10  # runs of one task that raise before the job fails
    max_task_failures: int | None = None  # the older name of max_task_attempts; wins if set
    overwrite: bool = False
    lines: str = ""  # "lf", "universal" (\r\n and \r end lines too); "": the job's ``lines``
    split_bytes: int | None = None  # None: chosen from the input and the parallelism
    step: int | None = None  # run only this step of the job's steps (1-based)
    from_step: int | None = None  # run this step and the rest (input: the step before's output)
    detach: bool = False  # submit only, and return at once
    aws: AwsSettings = field(default_factory=AwsSettings)  # queue prefix; where workers look
    worker_settings: WorkerSettings | None = None  # None: the defaults for the backend
    on_progress: Callable[[watch.Progress], None] | None = None
    on_submit: Callable[[str], None] | None = None
    input_format: str = ""  # cmr.formats' input format; "": the job's ``input_format``
    output_format: str = ""  # cmr.formats' output format; "": the job's ``output_format``
    files: Sequence[str] = ()  # side files beyond the job class's: "PATH[#NAME]" each
    total_order: bool = False  # parts concatenate into one sorted sequence (or Job.total_order)
    # Map output through queues or the blob store ("auto": the store for a large input on aws).
    shuffle: str = "auto"

    @staticmethod
    def of(base: RunOptions | None = None, **overrides: Any) -> RunOptions:
        """``base`` (or the defaults) with keyword overrides: ``cmr.run``'s keywords."""
        # None meant "the default" for these two before they had a dataclass to live in.
        for name in ("aws", "params"):
            if name in overrides and overrides[name] is None:
                del overrides[name]
        return replace(base or RunOptions(), **overrides)

    def job_options(self, job: LoadedJob) -> JobOptions:
        """The job's options of this run, under the names the job record gives them."""
        return JobOptions.of(
            job,
            params=self.params,
            reducers=self.reducers,
            step=self.step,
            from_step=self.from_step,
            files=self.files,
            visibility_s=self.visibility_timeout,
            # --max-task-attempts bounds raises; starts that never end keep their own bound.
            max_task_failures=self.max_task_attempts
            if self.max_task_failures is None
            else self.max_task_failures,
            task_timeout_s=self.task_timeout,
            overwrite=self.overwrite,
            lines=self.lines,
            input_format=self.input_format,
            output_format=self.output_format,
            total_order=self.total_order,
            shuffle=self.shuffle,
        )


async def run_async(
    job: str | type[Job] | LoadedJob,
    input: str | Sequence[str],
    output: str,
    options: RunOptions | None = None,
    *,
    backend: str = "embedded",
    **overrides: Any,
) -> RunResult:
    """Open the backend, run the job on it (see :func:`run_on`), close the backend.
    ``input``: one input or several (files, directories, globs, s3:// URLs), read in order.
    ``overrides`` are :class:`RunOptions` fields (``aws=`` also names the backend's place)."""
    opts = RunOptions.of(options, **overrides)
    submit.input_list(input)  # several inputs, none empty
    if not output.strip():
        raise UsageError("--output is empty: give a directory or an s3:// URL")
    async with open_backend(backend, opts.aws) as be:
        return await run_on(be, job, input, output, opts)


async def run_on(
    be: Backend,
    job: str | type[Job] | LoadedJob,
    input: str | Sequence[str],
    output: str,
    options: RunOptions | None = None,
    **overrides: Any,
) -> RunResult:
    """Submit the job on an open backend, start ``workers`` workers (in-process tasks on the
    embedded backend, ``cmr worker`` processes on aws; 0: rely on a fleet), wait for the
    job, and bring the output home. ``detach``: submit only, and return at once.
    ``overrides`` are :class:`RunOptions` fields.

    Cancelled (Ctrl-C, SIGTERM) while it waits, it cancels the job it submitted."""
    opts = RunOptions.of(options, **overrides)
    loaded = load_job(job)  # once: everything below is handed this
    job_options = opts.job_options(loaded)
    workers = opts.workers
    if opts.detach:
        if be.capabilities.in_process:
            raise UsageError(
                "--detach needs a backend that outlives this process: use --backend aws (the "
                "embedded backend's queues live inside `cmr run`)"
            )
        if workers:
            raise UsageError(
                "--detach starts no workers; leave --workers out and start them with "
                "`cmr worker --backend aws` (or run a fleet)"
            )
    elif workers < 0 or (be.capabilities.in_process and workers < 1):
        raise UsageError(
            f"--workers must be at least 1 with the embedded backend (no other "
            f"process can reach its in-memory queues); got {workers}"
        )
    if workers > MAX_WORKERS:
        raise UsageError(
            f"--workers must be at most {MAX_WORKERS} (workers started here share this "
            f"machine's CPUs and memory; more only compete for them): for more, run `cmr "
            f"worker` on other machines, or a fleet (`cmr fleet`); got {workers}"
        )
    ws = opts.worker_settings or WorkerSettings(
        poll_s=default_poll_s(be.capabilities.free_requests)
    )
    started = time.monotonic()
    calls_before = be.calls()
    caller = usage.JOB.set(usage.JOB.get())  # submit makes us the job's: put it back after
    try:
        return await _run_on(
            be, loaded, input, output, opts, job_options, ws, started, calls_before
        )
    finally:
        usage.JOB.reset(caller)


async def _run_on(
    be: Backend,
    loaded: LoadedJob,
    input: str | Sequence[str],
    output: str,
    opts: RunOptions,
    job_options: JobOptions,
    ws: WorkerSettings,
    started: float,
    calls_before: Counter[str],
) -> RunResult:
    workers = opts.workers
    spec = await submit.submit(
        be,
        loaded,
        input,
        output,
        job_options,
        queue_prefix=opts.aws.queue_prefix,
        parallelism=max(1, workers) * ws.map_slots,
        split_bytes=opts.split_bytes,
        # The workers we start have this budget; a fleet's (workers=0) is not known here.
        memory_bytes=ws.memory_mb * 1024 * 1024 if workers > 0 else None,
    )
    if opts.on_submit is not None:
        opts.on_submit(spec.job_id)
    try:
        return await _watched(be, spec, output, opts, ws, started, calls_before)
    finally:
        # The client's part of the job's cost (cmr.usage): its submit and its watch.
        steps = [
            step_job_id(spec.pipeline_id, spec.first_step, n)
            for n in range(spec.step, spec.last_step + 1)
        ]
        with contextlib.suppress(Exception):
            await asyncio.shield(usage.flush(be, steps))


async def _watched(
    be: Backend,
    spec: JobSpec,
    output: str,
    opts: RunOptions,
    ws: WorkerSettings,
    started: float,
    calls_before: Counter[str],
) -> RunResult:
    if opts.detach:
        record = {"state": "running"}
        return RunResult(
            spec.job_id, output, [], time.monotonic() - started, record, be.calls() - calls_before
        )
    if be.capabilities.in_process:
        record = await _run_in_process(be, spec, ws, opts)
    else:
        record = await _run_with_processes(be, spec, ws, opts)
        last, _ = await pipeline.current(be, spec.job_id)
        await watch.fetch_output(be, last, record)
    record = {**record, **await watch.run_input(be, spec)}  # a pipeline's input: its first step's
    return RunResult(
        spec.job_id,
        output,
        await published_parts(be, spec, output),
        time.monotonic() - started,
        record,
        be.calls() - calls_before,
    )


async def published_parts(be: Backend, spec: JobSpec, output: str) -> list[str]:
    """The part files of the job's output, as its manifest lists them."""
    if submit.is_local(output):
        return watch.output_parts(output)
    manifest, _ = await read_manifest(be.blobs, spec.output)
    return [spec.output + p.name for p in manifest.parts] if manifest is not None else []


async def cancel(be: Backend, spec: JobSpec, reason: str) -> bool:
    """Cancel a running job (its workers clean it up): the step a pipeline is at. False if
    it had ended, or is publishing (then it ends, successfully, in a moment)."""
    return await pipeline.cancel(be, spec.job_id, reason, clean=be.capabilities.in_process)


INTERRUPTED = "cancelled: `cmr run` was interrupted (Ctrl-C or SIGTERM)"
SETTLE_S = 60.0  # how long workers we started get to finish a job's cleanup and stop
POKE = signal.SIGUSR1  # to a `cmr worker`: refresh the jobs now (one may have ended)


async def _run_in_process(
    be: Backend, spec: JobSpec, ws: WorkerSettings, opts: RunOptions
) -> dict[str, Any]:
    ws = serving_own_job(ws, spec)
    with cpu_pool(ws.processes) as pool:
        fleet = [
            Worker(be, ws, pool, only_job=spec.job_id, queue_prefix=opts.aws.queue_prefix)
            for _ in range(opts.workers)
        ]
        tasks = [asyncio.create_task(w.run()) for w in fleet]
        waiter = asyncio.create_task(watch.wait(be, spec, opts.on_progress, poll_s=0.05))
        try:
            try:
                return await _until_done(waiter, tasks)  # type: ignore[no-any-return]
            except asyncio.CancelledError:
                pool.kill()  # interrupted: what runs in the pool is abandoned, now
                await asyncio.shield(cancel(be, spec, INTERRUPTED))
                raise
            finally:
                if not waiter.cancelled() and waiter.done():
                    # The workers stop by themselves once the job (succeeded or failed) is
                    # cleaned up: its output place holds only what it should when we return.
                    await _settle(fleet, tasks)
        finally:
            waiter.cancel()
            for w in fleet:
                w.done.set()
            await asyncio.gather(*tasks, waiter, return_exceptions=True)
            pool.kill()  # what still runs there was abandoned with its worker


async def _settle(fleet: list[Worker], tasks: list[asyncio.Task[None]]) -> None:
    """Wait up to SETTLE_S for the workers to stop on their own once the job ended. The one
    that cleaned the job up stops first; each stop pokes the others, which would otherwise
    see the job gone only at their next refresh (a run of two workers ended 5 s late)."""

    def poke(stopped: set[asyncio.Future[Any]]) -> None:
        for w in fleet:
            w.poke()

    await _until_settled(set(tasks), poke)


async def _until_settled(
    pending: set[asyncio.Future[Any]], poke: Callable[[set[asyncio.Future[Any]]], None]
) -> None:
    """Wait up to SETTLE_S for ``pending`` (workers of a job that ended) to end; after each
    that end, ``poke(those)`` tells the rest to look at the job now."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            return
        stopped, pending = await asyncio.wait(
            pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
        )
        if not stopped:
            return
        poke(stopped)


async def _run_with_processes(
    be: Backend, spec: JobSpec, ws: WorkerSettings, opts: RunOptions
) -> dict[str, Any]:
    waiter = asyncio.create_task(watch.wait(be, spec, opts.on_progress, poll_s=0.5))
    ws = serving_own_job(ws, spec)
    procs = [
        await _spawn_worker(Store(BackendName(be.name), opts.aws), spec.job_id, ws, opts.workers)
        for _ in range(opts.workers)
    ]
    try:
        try:
            return await _until_done_or_workers_gone(waiter, procs, spec.job_id)  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            # Cancel the job first: then the workers clean it up, and stop by themselves.
            await asyncio.shield(cancel(be, spec, INTERRUPTED))
            raise
        finally:
            if procs:
                await asyncio.shield(_settle_processes(procs))
    finally:
        waiter.cancel()
        await _stop(procs)


async def _settle_processes(procs: list[asyncio.subprocess.Process]) -> None:
    """Wait up to SETTLE_S for the worker processes we started to stop on their own once
    the job ended; each that stops in order (exit 0: the job it served was cleaned up) pokes
    the others (POKE), as _settle does in-process: they would otherwise see the job cleaned
    up only at their next refresh, 5 s on (every `cmr run --workers 2` on the stack ended
    5 s late)."""
    waits: dict[asyncio.Future[Any], asyncio.subprocess.Process] = {
        asyncio.ensure_future(p.wait()): p for p in procs
    }

    def poke(stopped: set[asyncio.Future[Any]]) -> None:
        if not any(waits[f].returncode == 0 for f in stopped):
            return  # a worker that failed (or was killed) says nothing of the job
        for f, p in waits.items():
            if not f.done():
                # A worker not yet at its handler (still importing) ends at the signal: it
                # had no part in the job, which one that stopped in order has cleaned up.
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(POKE)

    try:
        await _until_settled(set(waits), poke)
    finally:
        for w in waits:
            w.cancel()


async def _until_done_or_workers_gone(
    waiter: asyncio.Task[Any], procs: list[asyncio.subprocess.Process], job_id: str
) -> Any:
    """Wait for the job; if every worker we started has exited first, say so instead of
    waiting forever (the job itself stays, for a fleet or a rerun to finish)."""
    if not procs:
        return await waiter
    exits = asyncio.ensure_future(asyncio.gather(*(p.wait() for p in procs)))
    try:
        await asyncio.wait([waiter, exits], return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            return waiter.result()
        # Workers exit on their own only once the job ends: give the client a moment to see it.
        with contextlib.suppress(TimeoutError):
            # Not wait_for: 3.11's loses a Ctrl-C that comes as the job ends.
            async with asyncio.timeout(5):
                return await asyncio.shield(waiter)
        codes = ", ".join(str(c) for c in exits.result())
        raise WorkersGone(
            f"all {len(procs)} worker processes exited (codes {codes}) before job {job_id} "
            f"finished; see their messages above. Start workers with `cmr worker --backend "
            f"aws`, or remove the job with `cmr cleanup {job_id}`"
        )
    finally:
        exits.cancel()
        # A cancelled gather still holds a CancelledError; take it, or asyncio logs it as
        # "exception was never retrieved" when the future is collected.
        exits.add_done_callback(lambda f: f.cancelled() or f.exception())


async def _spawn_worker(
    store: Store, job_id: str, ws: WorkerSettings, workers: int
) -> asyncio.subprocess.Process:
    share = max(1, default_cores() // workers)
    mine = replace(ws, processes=min(ws.processes, share), map_slots=min(ws.map_slots, share))
    args = [
        *(sys.executable, "-m", "cmr", "worker", "--job", job_id, "--no-create"),
        *("--store", store.url),
        *("--settings-json", mine.to_json()),
        # Its lines reach our terminal: at our verbosity (attempts are -v's), not a fleet's.
        *("--log-level", str(logs.level())),
    ]
    # In a session of their own: a Ctrl-C at the terminal reaches `cmr run` alone, which
    # cancels the job and lets its workers clean it up before they stop.
    return await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
    )


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            async with asyncio.timeout(10):  # not wait_for: 3.11's can lose a cancellation
                await p.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


def run(job: str | type[Job], input: str | Sequence[str], output: str, **kwargs: Any) -> RunResult:
    """Run a job to completion and return where its output is; ``input`` is one input or a
    list of them. See :func:`run_async`."""
    if not logs.structlog_module().is_configured():
        logs.configure()
    return asyncio.run(run_async(job, input, output, **kwargs))


__all__ = ["CpuPool", "RunOptions", "RunResult", "cpu_pool", "run", "run_async"]
