"""Testing helpers shipped with cmr: a sequential reference run, and chaos runs.

``sequential(job, input, reducers)`` computes what a job's output *must* be, in this
process, with no queues, by the engine's own reading, partitioning, ordering and writing
(every input and output format, line endings, sorted values, side files, pipelines, total
order; see its text). ``chaos_run(...)`` runs the job on the embedded backend under a
seeded :class:`~cmr.backends.faults.FaultPlan` (duplicates, lost leases, delays, empty
receives, throttling, 5xx before and after writes, stale reads) while seeded hooks crash or
pause workers at the protocol's named steps; a supervisor replaces crashed workers, as a
fleet's autoscaler would. Compare the two with ``diff_outputs``: the invariant is that they
are byte-for-byte equal, whatever the seed.

Use them on your own jobs::

    expected = sequential("jobs/sessions.py", "logs/", reducers=4)
    result = await chaos_run("jobs/sessions.py", "logs/", out_dir, seed=7, pool=pool, reducers=4)
    assert diff_outputs(expected, read_output(out_dir, 4)) == []

A job run with options (``cmr run --input-format csv --lines universal``) is compared with
the same options on both sides: ``sequential(..., input_format="csv", lines="universal")``
and ``chaos_run(..., job_options={"input_format": "csv", "lines": "universal"})``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import random
import secrets
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgpack

from cmr import (
    adapters,
    attempts,
    counters,
    formats,
    pipeline,
    places,
    sampling,
    sidefiles,
    split,
    submit,
    usercode,
    watch,
)
from cmr.admission import serving_own_job
from cmr.api import job_ref
from cmr.attempts import Attempt
from cmr.backends.base import Backend
from cmr.backends.embedded import temporary_backend
from cmr.backends.embedded.blobs import EmbeddedBlobs
from cmr.backends.faults import FaultPlan, inject
from cmr.backends.retry import with_retries
from cmr.cpu.instances import forget_instance, hook, job_instance, job_step, mapper_name
from cmr.cpu.mapping import map_calls
from cmr.cpu.order import ValueOrder, sorted_keys, value_sorting
from cmr.cpu.reducing import write_output
from cmr.cpu.results import MapResult, ReduceResult
from cmr.cpu.shuffle import partitioner
from cmr.cpu.specs import MapSpec, map_piece_bytes
from cmr.errors import JobFailed, UsageError
from cmr.fileurls import file_url
from cmr.job import Job, check_formats
from cmr.jobload import LoadedJob
from cmr.joboptions import JobOptions
from cmr.lifecycle import job_scratch
from cmr.publish import MANIFEST, Manifest
from cmr.records import ACTIVE_PK, JOBS_PK, KEPT, OUTPUTS_PK, JobSpec, job_pk
from cmr.runtime import STEPS, Hook, Runtime, WorkerCrashed
from cmr.settings import AwsSettings, WorkerSettings
from cmr.split import Input
from cmr.worker import Worker

_T = TypeVar("_T")


def sequential(
    job: str | type[Job],
    input: str | Path | Sequence[str | Path],
    reducers: int | None = None,
    params: dict[str, str] | None = None,
    *,
    input_format: str = "",
    output_format: str = "",
    lines: str = "",
    files: Sequence[str] = (),
    total_order: bool = False,
    step: int | None = None,
    from_step: int | None = None,
    args: Sequence[str] = (),
    counted: dict[str, dict[str, int]] | None = None,
) -> list[str]:
    """The job's output computed sequentially, in this process, with no queues: one string
    per part of its last step, as cmr writes it (bytes that are not UTF-8, raw or pairs
    output say, kept as surrogate escapes: ``part.encode("utf-8", "surrogateescape")`` is
    the part's bytes; :func:`read_output` reads a real output the same way).

    The keywords are ``cmr run``'s options, checked as it checks them: ``reducers``
    (--reducers; None: the job's), ``params`` (--param), ``input_format``,
    ``output_format``, ``lines``, ``files`` ("PATH[#NAME]", --file), ``total_order``,
    ``step`` and ``from_step`` (1-based, as --step, --from-step), ``args`` (an mrjob
    job's arguments, ``-- ARGS``). ``input`` is one input or a list (files, directories,
    globs; local only), listed as ``cmr run`` lists them (hidden files left out, names below
    the inputs' common directory). ``counted``, if given, is filled with the job's counters
    as ``RunResult.counters`` has them.

    The engine's own code reads the input (formats, compression, line endings), partitions,
    groups, orders keys and values (``sort_values``, ``value_order``) and writes each part,
    so the two cannot differ but by what the engine leaves open: the input is one map task
    (``map_init``/``map_final`` run once) and each partition one reduce task; combine and
    its hooks are left out (a correct combine changes nothing); values of a key reach
    reduce in input order unless the job sorts them (in a real run, in arrival order).
    Every step runs in turn, each with an instance of its own, set up as a worker sets one
    up (``setup`` once, ``for_task`` per task). Total order is computed only for input of
    at most 4 MiB (the cut points' sample is then all of it); more is refused."""
    sources = submit.input_list(
        str(input) if isinstance(input, str | Path) else [str(i) for i in input]
    )
    for s in sources:
        if not places.is_local(s):
            raise UsageError(f"sequential reads local input only, not {s[:200]!r}: copy it here")
    loaded = job_ref(job)
    cls, ref = loaded.cls, loaded.ref
    if isinstance(files, str):
        raise UsageError(f"files= must be a list of paths, not one str: [{files!r}]")
    # As `cmr run JOB -- ARGS` does: an mrjob job's arguments, input URI and files.
    mr_params, mr_files = adapters.job_args(loaded, list(args))
    params = {**(params or {}), **mr_params}
    # What `cmr run` would refuse, refused alike (the same checks, the same words).
    options = JobOptions.of(
        loaded,
        params=params,
        reducers=reducers,
        step=step,
        from_step=from_step,
        lines=lines,
        input_format=input_format,
        output_format=output_format,
        files=(*files, *mr_files),
        total_order=total_order,
    )
    # A run from a later step reads what the step before wrote: pairs.
    fmt = formats.parse_input(
        "pairs" if options.first_step > 0 else options.input_format or cls.input_format
    )
    check_formats(cls, str(fmt))
    options, chunks = _in_thread(_listed(cls, sources, options, fmt))
    params = options.params
    partitions = options.step_partitions or (options.partitions,)
    cuts = None
    if sampling.check(cls, options.total_order, options.job_steps):
        with counters.paused():  # sampled on the client at submit: counted by no task
            cuts = _cut_points(loaded, options, fmt, chunks)
    side = sidefiles.gather(loaded, options.files)
    run_id = f"sequential-{secrets.token_hex(6)}"
    parts: list[bytes] = []
    with (
        tempfile.TemporaryDirectory(prefix="cmr-sequential-") as files_dir,
        counters.collecting() if counted is not None else contextlib.nullcontext() as task,
    ):
        for g in side:
            shutil.copyfile(g.path, os.path.join(files_dir, g.name))
        for k in range(options.first_step, options.last_step + 1):
            # Each step is a job of its own: an instance each, set up once.
            step_id = f"{run_id}-s{k + 1}"
            try:
                inst = job_instance(step_id, ref, params, options.lines, files_dir)
                n = partitions[k - options.first_step]
                # Step 0 over no input has no map task at all; a later step always has one.
                groups = (
                    _map_task(inst, k, fmt, chunks, n, options.lines, cuts)
                    if chunks or k > options.first_step
                    else [{} for _ in range(n)]
                )
                writes = (
                    "pairs"
                    if k < options.job_steps - 1
                    else options.output_format or cls.output_format
                )
                parts = [_reduce_task(inst, k, g, writes) for g in groups]
            finally:
                forget_instance(step_id, files_dir)
            fmt = formats.parse_input("pairs")  # what every step but the job's last writes
            chunks = [(f"part-{p:05d}", data) for p, data in enumerate(parts) if data]
            cuts = None
        if counted is not None and task is not None:
            counted.clear()
            counted.update(counters.nested(task.counts))
    return [p.decode("utf-8", "surrogateescape") for p in parts]


async def _listed(
    cls: type[Job], sources: tuple[str, ...], options: JobOptions, fmt: formats.InputFormat
) -> tuple[JobOptions, list[tuple[str, bytes]]]:
    """The inputs listed, named and checked by submit's own code (on a backend that reads
    them in place), each file's bytes with the name map is told; empty ones left out, as
    the plan leaves them. The options gain what the listing tells (an mrjob job's URI)."""
    async with temporary_backend("cmr-sequential-") as be:
        listing = await submit.list_inputs(
            be, sources, await submit.local_inputs(sources), "sequential"
        )
        options = submit._with_input_uri(cls, options, listing)
        inputs = await submit.sniff_inputs(be.blobs, listing.inputs, fmt, sys.maxsize)
        return options, [(i.name, await be.blobs.get(i.url)) for i in inputs if i.size]


def _in_thread(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to its end from sync code, in a thread of its own: the caller may be
    inside an event loop (an async test)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coro).result()


def _cut_points(
    loaded: LoadedJob,
    options: JobOptions,
    fmt: formats.InputFormat,
    chunks: list[tuple[str, bytes]],
) -> tuple[Any, ...]:
    """A total-order job's cut points, chosen by the submitter's own sampling: over input
    small enough that the sample is all of it, they do not depend on how it is split."""
    total = sum(len(d) for _, d in chunks)
    most = sampling.SAMPLE_RANGES * sampling.SAMPLE_BYTES
    if total > most:
        raise UsageError(
            f"sequential: total order over {total:,} bytes of input: its cut points come from "
            f"a sample that depends on how a run splits input past {most:,} bytes; use less "
            "input, or compare the parts of a run joined with those of a run without total order"
        )
    with tempfile.TemporaryDirectory(prefix="cmr-sequential-") as where:
        inputs = []
        for i, (name, data) in enumerate(chunks):
            path = Path(where, str(i))
            path.write_bytes(data)
            codec = formats.sniff(data[: formats.SNIFF_BYTES])
            inputs.append(Input(file_url(path), len(data), name, codec))
        tasks = split.plan(inputs, max(1, total), fmt)
        sample = sampling.cut_points(
            EmbeddedBlobs(),
            loaded,
            dict(options.params),
            options.lines,
            tasks,
            options.partitions,
            options.task_timeout_s,
            fmt,
        )
        return _in_thread(sample)


def _map_task(
    inst: Job,
    k: int,
    fmt: formats.InputFormat,
    chunks: list[tuple[str, bytes]],
    n: int,
    lines: str,
    cuts: tuple[Any, ...] | None,
) -> list[dict[Any, list[Any]]]:
    """One map task of step k over all the chunks, as a worker's pool runs one (the same
    reading, mapping and partitioning): each partition's values by key, as the reducer
    groups them after their trip through msgpack."""
    job = inst.for_task()
    job._cmr_map_task(k, chunks[0][0] if chunks else "")
    st, name = job_step(job, k)
    universal = (lines or job.lines) == "universal"
    mapper = mapper_name(job, st, name, fmt.name == "lines")
    spec = MapSpec(
        job="sequential",
        task=0,
        attempt="",
        partitions=n,
        max_message_bytes=0,
        spool_dir="",
        lines=lines,
        input_format=str(fmt),
        # A chunk is a whole file: its compression told by its first bytes, as a worker does.
        codecs=tuple(formats.sniff(d[: formats.SNIFF_BYTES]) for _, d in chunks),
        starts=(0,) * len(chunks),
        # A default worker's pieces: the longest record it reads is the same.
        piece_bytes=map_piece_bytes(WorkerSettings().memory_mb * 1024 * 1024),
        step=k,
        cuts=cuts,
    )
    part = partitioner(job, n, cuts)
    groups: list[dict[Any, list[Any]]] = [{} for _ in range(n)]
    hook(st.map_init)
    calls = map_calls(st, fmt, chunks, spec, MapResult(), universal)
    for source in calls:
        for pair in source:
            key, value = pair if type(pair) is tuple else usercode.as_pair(pair, mapper, source)
            p = part(key, n)  # the key as map yielded it, as the shuffle partitions it
            key, value = _travelled((key, value))
            try:
                groups[p].setdefault(key, []).append(value)
            except TypeError:  # a dict in the key: the map's to answer for
                raise usercode.unhashable_key(key, mapper) from None
    return groups


def _reduce_task(inst: Job, k: int, group: dict[Any, list[Any]], writes: str) -> bytes:
    """One partition's reduce task of step k: keys in the engine's order, each key's
    values sorted when the step sorts them, written by the engine's writer."""
    job = inst.for_task()
    st, name = job_step(job, k)
    sort_values, value_order = value_sorting(job, st)
    order = ValueOrder(job, value_order) if sort_values else None
    keyed = (
        (key, iter(order.sorted(group[key]) if order is not None else group[key]))
        for key in sorted_keys(group)
    )
    out = io.BytesIO()
    write_output(job, keyed, out, ReduceResult(), writes, st, name)
    return out.getvalue()


def _travelled(pair: Any) -> tuple[Any, Any]:
    """A pair as it arrives after its trip through the shuffle: packed as a map task packs
    it, unpacked as a reducer unpacks it (lists become tuples)."""
    key, value = msgpack.unpackb(
        msgpack.packb(tuple(pair), use_bin_type=True),
        raw=False,
        use_list=False,
        strict_map_key=False,
    )
    return key, value


def read_output(out: str | Path, reducers: int) -> list[str]:
    """A local output as a reader should read it: the parts its ``_SUCCESS`` manifest lists,
    one string per partition; "<missing>" where it lists none (everywhere, without one).
    Bytes that are not UTF-8 are kept as surrogate escapes, as :func:`sequential` keeps them."""
    manifest_path = Path(out) / MANIFEST
    if not manifest_path.exists():
        return ["<missing>"] * reducers
    manifest = Manifest.from_bytes(manifest_path.read_bytes())
    names = {int(p.name[5:10]): p.name for p in manifest.parts}
    return [
        (Path(out) / names[p]).read_bytes().decode("utf-8", "surrogateescape")
        if p in names
        else "<missing>"
        for p in range(reducers)
    ]


def diff_outputs(expected: list[str], got: list[str]) -> list[str]:
    """Human-readable differences (empty when equal)."""
    problems = []
    for p, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want != have:
            w, h = set(want.splitlines()), set(have.splitlines())
            problems.append(
                f"part-{p:05d}: {len(w - h)} lines missing, {len(h - w)} unexpected "
                f"(e.g. missing {sorted(w - h)[:3]}, unexpected {sorted(h - w)[:3]})"
            )
    return problems


@dataclass
class ChaosResult:
    job_id: str
    record: dict[str, Any]
    injected: Counter[str]
    crashes: Counter[str] = field(default_factory=Counter)  # by step
    pauses: Counter[str] = field(default_factory=Counter)  # by step
    workers_started: int = 0
    leftovers: list[str] = field(default_factory=list)  # what the job left behind (none!)
    attempts: list[Attempt] = field(default_factory=list)  # its timeline, after cleanup

    @property
    def duplicates_handled(self) -> dict[str, int]:
        r = self.record
        return {
            "method1_map_attempts_filtered": int(r.get("map_attempts_filtered", 0)),
            "method1_duplicate_tasks_skipped": int(r.get("map_duplicates_skipped", 0)),
            "method1_batches_of_losers_filtered": int(r.get("batches_filtered", 0)),
            "method2_repeated_batches_dropped": int(r.get("batches_dropped", 0)),
            "method3_reduce_conflicts_resolved": int(r.get("reduce_conflicts", 0)),
        }


@dataclass(frozen=True)
class StepChaos:
    """How often a worker crashes or pauses at each named step (seeded per worker)."""

    crash: float = 0.0
    pause: float = 0.0
    pause_s: float = 3.0  # longer than the lease, so the paused worker loses it
    max_crashes: int = 4  # after this many, no worker crashes any more: the job must end


def chaos_shuffle(seed: int) -> str:
    """The shuffle a chaos seed runs with: queue and blob in turn, two seeds each, so that
    with jobs alternating by seed every job meets both."""
    return "blob" if seed % 4 >= 2 else "queue"


def chaos_hook(
    rng: random.Random, chaos: StepChaos, result: ChaosResult, crash_budget: int
) -> Hook:
    """Crash (while fewer than ``crash_budget`` workers have) or pause at random steps."""

    async def hook(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        roll = rng.random()
        if roll < chaos.crash:
            if sum(result.crashes.values()) < crash_budget:
                result.crashes[step] += 1
                raise WorkerCrashed(step)
        elif roll < chaos.crash + chaos.pause:  # (a crash past the budget is not a pause)
            result.pauses[step] += 1
            await rt.pause(chaos.pause_s * (0.8 + 0.4 * rng.random()))

    return hook


async def leftovers(be: Backend, spec: JobSpec) -> list[str]:
    """What an ended, cleaned-up job (every step of a pipeline) left behind, that it should
    not have: queues, task records, a row in the active index, a live claim on its output,
    scratch blobs."""
    found = [f"queue {q}" for q in await be.queues.list(f"{spec.queue_prefix}{spec.job_id}-")]
    for step, _ in await pipeline.chain(be, spec.job_id):
        found += [
            f"record {i['pk']}/{i['sk']}"
            for i in await be.table.query(job_pk(step.job_id))
            if i["sk"] != "job" and not str(i["sk"]).startswith(KEPT)
        ]
        if await be.table.get(ACTIVE_PK, step.job_id) is not None:
            found.append(f"record {ACTIVE_PK}/{step.job_id}")
        found += [
            f"blob {b.url}" for b in await be.blobs.list(job_scratch(step.scratch, step.job_id))
        ]
    claim = await be.table.get(OUTPUTS_PK, spec.output)
    if claim is not None and claim.get("active"):
        found.append(f"record {OUTPUTS_PK}/{spec.output} (still active)")
    return found


async def task_records(be: Backend, job_id: str) -> list[str]:
    """The sort keys of a job's records but those its cleanup keeps (records.KEPT: the
    timeline): after cleanup, ``["job"]``."""
    return [
        str(i["sk"])
        for i in await be.table.query(job_pk(job_id))
        if not str(i["sk"]).startswith(KEPT)
    ]


async def backend_leftovers(be: Backend, queue_prefix: str, settle_s: float = 60.0) -> list[str]:
    """Everything cmr jobs left behind on a backend, once its jobs are all ended and cleaned
    up (waiting up to ``settle_s`` for cleanups under way): queues under the prefix, task
    records, active-index rows, live output claims, scratch blobs and unfetched results.
    For a test's own bucket, table and queue prefix, that must be nothing."""
    for _ in range(max(1, int(settle_s / 0.5))):  # polling a remote table: no event to wait on
        if not await be.table.query(ACTIVE_PK):
            break
        await asyncio.sleep(0.5)
    found = [f"queue {q}" for q in await be.queues.list(queue_prefix)]
    found += [
        f"record {ACTIVE_PK}/{r['sk']} ({r.get('state')})" for r in await be.table.query(ACTIVE_PK)
    ]
    found += [
        f"record {OUTPUTS_PK}/{r['sk']} (still active, job {r.get('job')})"
        for r in await be.table.query(OUTPUTS_PK)
        if r.get("active")
    ]
    for row in await be.table.query(JOBS_PK):
        for step, _ in await pipeline.chain(be, str(row["sk"])):
            found += [
                f"record {i['pk']}/{i['sk']}"
                for i in await be.table.query(job_pk(step.job_id))
                if i["sk"] != "job" and not str(i["sk"]).startswith(KEPT)
            ]
    root = be.scratch.rstrip("/")
    found += [f"blob {b.url}" for b in await be.blobs.list(f"{root}/jobs/")]
    found += [f"blob {b.url}" for b in await be.blobs.list(f"{root}/results/")]
    return found


def timeline_problems(result: ChaosResult) -> list[str]:
    """What is wrong with a succeeded job's timeline (cmr.attempts): every map task and
    every partition must have exactly one committed attempt, and every attempt an end."""
    record = result.record
    wanted = {"m": int(record.get("maps", 0)), "r": int(record.get("partitions", 0))}
    committed: Counter[tuple[str, int]] = Counter(
        (a.kind, a.task) for a in result.attempts if a.outcome == "committed"
    )
    problems = [
        f"{'map task' if kind == 'm' else 'partition'} {n}: {committed[(kind, n)]} committed "
        "attempts in the timeline"
        for kind, count in wanted.items()
        for n in range(count)
        if committed[(kind, n)] != 1
    ]
    problems += [
        f"attempt without an outcome: {a}" for a in result.attempts if a.outcome == "running"
    ]
    return problems


async def chaos_run(
    job: str | type[Job],
    input: str | Path,
    output: str | Path,
    *,
    seed: int,
    pool: Executor,
    plan: FaultPlan | None = None,
    steps: StepChaos | None = None,
    workers: int = 3,
    reducers: int | None = 3,
    visibility_s: int = 2,
    split_bytes: int | None = 2048,
    params: dict[str, str] | None = None,
    hooks: list[Hook | None] | None = None,
    timeout_s: float = 180.0,
    clientless: bool = False,
    settings: WorkerSettings | None = None,
    job_options: dict[str, Any] | None = None,
    wrap: Callable[[Backend], Backend] | None = None,
    after_submit: Callable[[Backend, JobSpec], Awaitable[None]] | None = None,
    shuffle: str = "auto",
) -> ChaosResult:
    """Run a job on a fresh embedded backend under faults, and wait until every worker has
    stopped by itself (they stop once the job has ended and been cleaned up).

    ``plan`` defaults to ``FaultPlan.random(seed)``; ``steps`` to occasional crashes and
    pauses. ``hooks`` (one per initial worker) replace the seeded step chaos, for targeted
    tests. By default a client watches (it only reads) and a supervisor replaces crashed
    workers, as a fleet's autoscaler would. ``clientless``: nobody watches or replaces
    anyone: the job is submitted and left to the ``workers`` started, at most all but one
    of which crash. The record is then read from the table, and ``leftovers`` lists what the
    job left behind. Raises TimeoutError if the workers are not done within ``timeout_s``.

    ``shuffle`` is the job's (``cmr run --shuffle``; ``chaos_shuffle(seed)`` mixes both by
    seed). ``job_options`` are more :class:`~cmr.submit.JobOptions` (``overwrite``,
    ``max_task_attempts``, ...); ``wrap`` wraps the faulty backend (inside the retries), to
    inject a fault of your own; ``after_submit`` runs between submitting and starting the
    workers.
    """
    plan = plan if plan is not None else FaultPlan.random(seed)
    steps = (
        steps
        if steps is not None
        else StepChaos(crash=0.02, pause=0.02, pause_s=visibility_s * 1.5 + 0.5)
    )
    budget = min(steps.max_crashes, workers - 1) if clientless else steps.max_crashes
    rng = random.Random(seed * 7919 + 1)
    async with temporary_backend("cmr-chaos-") as base, inject(base, plan) as faulty:
        be = with_retries(wrap(faulty) if wrap is not None else faulty, attempts=12)
        loaded = job_ref(job)
        options = JobOptions.of(
            loaded,
            params=params,
            reducers=reducers,
            visibility_s=visibility_s,
            **{"shuffle": shuffle, **(job_options or {})},
        )
        spec = await submit.submit(
            be,
            loaded,
            str(input),
            str(output),
            options,
            queue_prefix=AwsSettings.queue_prefix,
            parallelism=workers,
            split_bytes=split_bytes,
        )
        result = ChaosResult(spec.job_id, {}, faulty.injected)
        if after_submit is not None:
            await after_submit(be, spec)
        ws = serving_own_job(
            settings or WorkerSettings(map_slots=2, reduce_slots=2, processes=1, memory_mb=1), spec
        )

        def start(i: int) -> tuple[Worker, asyncio.Task[None]]:
            if hooks is not None and i < len(hooks):
                hook = hooks[i]
            else:
                hook = chaos_hook(random.Random(rng.random()), steps, result, budget)
            w = Worker(be, ws, pool, only_job=spec.job_id, hook=hook)
            result.workers_started += 1
            return w, asyncio.create_task(w.run())

        fleet = [start(i) for i in range(workers)]
        ended: set[asyncio.Task[None]] = set()
        waiter = None if clientless else asyncio.create_task(watch.wait(be, spec, poll_s=0.2))
        try:
            async with _explained_timeout(timeout_s, be, spec, fleet):
                while any(not t.done() for _, t in fleet):
                    await asyncio.wait(
                        [t for _, t in fleet if not t.done()],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    for i, (_, t) in enumerate(fleet):
                        if t.done() and t not in ended:
                            ended.add(t)
                            crashed = _crashed_or_raise(t)
                            # A fleet replaces a dead worker while the job has work left.
                            if crashed and not clientless and await _active(be, spec):
                                fleet[i] = start(len(fleet) + result.workers_started)
            if waiter is not None:
                # What a client saw; the record below says the same (or the test fails).
                with contextlib.suppress(JobFailed):
                    await waiter
        finally:
            if waiter is not None:
                waiter.cancel()
            for worker, _ in fleet:
                worker.done.set()
            await asyncio.gather(
                *(t for _, t in fleet), *([waiter] if waiter else []), return_exceptions=True
            )
        # A pipeline's record is its last step's.
        _, result.record = await pipeline.current(be, spec.job_id)
        result.leftovers = await leftovers(be, spec)
        result.attempts = await attempts.attempts(be, spec.job_id)
    return result


@contextlib.asynccontextmanager
async def _explained_timeout(
    seconds: float, be: Backend, spec: JobSpec, fleet: list[tuple[Worker, asyncio.Task[None]]]
) -> AsyncIterator[None]:
    """asyncio.timeout, but a TimeoutError says where the job stood (what a hang needs)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise TimeoutError(
            f"not done in {seconds:.0f} s: {await _where(be, spec, fleet)}"
        ) from None


async def _where(be: Backend, spec: JobSpec, fleet: list[tuple[Worker, asyncio.Task[None]]]) -> str:
    try:
        record = await be.table.get(job_pk(spec.job_id), "job") or {}
        active = await be.table.get(ACTIVE_PK, spec.job_id)
        items = await be.table.query(job_pk(spec.job_id))
    except Exception as exc:  # a diagnosis must not hide the timeout
        return f"(state unreadable: {exc})"
    claims = [
        f"{i['sk']}:{i.get('state')}/e{i.get('epoch')}/b{i.get('beat')}"
        for i in items
        if str(i["sk"]).startswith("reduce#")
    ]
    maps = sum(1 for i in items if str(i["sk"]).startswith("map#"))
    workers = [
        f"{w.rt.worker_id}:{'done' if t.done() else 'alive'}"
        f"{'' if w.rt.awake.is_set() else '/paused'} busy={w.busy} duties={sorted(w._duties)}"
        for w, t in fleet
    ]
    stuck = []
    for t in asyncio.all_tasks():
        frames = [f for f in t.get_stack() if "/cmr/" in f.f_code.co_filename]
        if frames:
            f = frames[-1]
            stuck.append(f"{t.get_coro().__qualname__}@{f.f_code.co_name}:{f.f_lineno}")  # type: ignore[union-attr]
    return (
        f"tasks={sorted(stuck)} "
        f"job {spec.job_id} state={record.get('state')} publishing={'publishing' in record} "
        f"error={str(record.get('error', ''))[:200]!r} active={active} maps={maps}/{spec.maps} "
        f"claims={claims} workers={workers}"
    )


async def _active(be: Backend, spec: JobSpec) -> bool:
    return await be.table.get(ACTIVE_PK, spec.job_id) is not None


def _crashed_or_raise(task: asyncio.Task[None]) -> bool:
    """A worker ended: True if a hook crashed it, False if it stopped by itself (its job
    ended and was cleaned up); anything else is a real bug, raised."""
    exc = task.exception()
    if exc is None:
        return False
    if isinstance(exc, BaseExceptionGroup):
        crashed, rest = exc.split((WorkerCrashed, asyncio.CancelledError))
        if rest is None:
            return crashed is not None
        raise rest
    if not isinstance(exc, WorkerCrashed):
        raise exc
    return True


__all__ = [
    "STEPS",
    "ChaosResult",
    "FaultPlan",
    "StepChaos",
    "WorkerCrashed",
    "backend_leftovers",
    "chaos_hook",
    "chaos_run",
    "diff_outputs",
    "leftovers",
    "read_output",
    "sequential",
]
