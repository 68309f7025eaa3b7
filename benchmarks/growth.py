"""Growth benchmark: word count over 25 ... 400 MB; time must grow linearly and a worker's
peak memory must stay flat while its reducers spill past a budget smaller than a partition.

    .venv/bin/python benchmarks/growth.py [--sizes 25,50,100,200,400] [--memory-mb 1]
        [--unique 2] [--repeat 1] [--split-mb M] [--json out.json]

Every size runs in a fresh process (no memory carried over from the previous size), on the
embedded backend, with ``WorkerSettings(memory_mb=...)``. The corpus is the word count
benchmark's Zipf corpus with ``--unique`` never-repeated tokens per line, so the vocabulary
and the partitions grow with the input (a 50 000-word vocabulary alone gives ~1 MB
partitions at any size). Each output is checked word for word against a ``Counter``.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
from rich.console import Console
from rich.table import Table

import cmr.logs
from cmr import wire
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.backends.embedded import EmbeddedQueues, embedded_backend
from cmr.backends.retry import with_retries
from cmr.cpu.specs import REDUCE_MEMORY_MIN
from cmr.settings import WorkerSettings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from wordcount import cpu_seconds, line_pool, write_results  # noqa: E402  (benchmarks/ is not a package)

REPO = HERE.parent
JOB = f"{REPO / 'examples' / 'wordcount.py'}:WordCount"
MB = 1_000_000
MIB = 1 << 20
FILES = 8
SAMPLE_S = 0.05
REDUCE_FLOOR = REDUCE_MEMORY_MIN  # a reducer's smallest budget: --memory-mb 0 means this
console = Console(width=None if sys.stdout.isatty() else 200)


# ------------------------------------------------------------------------------ corpus


def growth_corpus(size_mb: float, seed: int, unique: int, root: Path = HERE / "data") -> Path:
    """The word count corpus (same line pool, seed and awkward cases) with ``unique``
    decimal tokens prefixed to every line, numbered across the whole corpus. The generated
    vocabulary has no digits, so each such token occurs exactly once: the number of keys,
    and so the partitions, grow in proportion to the input."""
    path = root / f"growth-{size_mb:g}mb-seed{seed}-u{unique}"
    if path.is_dir():
        return path
    started = time.monotonic()
    rng = random.Random(seed)
    pool = line_pool(rng)
    per_file = size_mb * MB / FILES
    lines_est = size_mb * MB / (sum(map(len, pool)) / len(pool))
    mean = sum(map(len, pool)) / len(pool) + unique * (len(str(int(lines_est * unique))) + 1)
    fmt = b"%d " * unique + b"%s"
    tmp = root / f".{path.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    n = 0
    for i in range(FILES):
        lines = rng.choices(pool, k=max(1, round(per_file / mean)))
        data = b"".join(
            fmt % (*range(n + j * unique, n + (j + 1) * unique), line)
            for j, line in enumerate(lines)
        )
        n += len(lines) * unique
        if i == FILES - 1:
            data = data.rstrip(b"\n")  # the last file ends without a newline
        (tmp / f"part-{i:03d}.txt").write_bytes(data)
    tmp.rename(path)  # atomic: a half-written corpus is never reused
    console.print(f"generated {path} in {time.monotonic() - started:.1f}s")
    return path


def input_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------ exact check


def count_words(files: Sequence[Path]) -> Counter[str]:
    """The reference: the job's word definition (b"\\n" lines, UTF-8 with errors replaced,
    str.split()), one file at a time."""
    counts: Counter[str] = Counter()
    for f in files:
        counts.update(f.read_bytes().decode("utf-8", "replace").split())
    return counts


def compare(want: Counter[str], parts: Sequence[str], show: int = 5) -> list[str]:
    """Differences between ``want`` and the part files (consumes ``want``). A word in two
    parts, a malformed line, a wrong count and a missing word are all differences."""
    bad: list[str] = []
    wrong = 0
    for part in parts:
        for line in Path(part).read_bytes().split(b"\n"):
            if not line:
                continue
            word, _, n = line.decode("utf-8").rpartition("\t")
            expected = want.pop(word, None)
            if not word or not n.isdigit() or expected != int(n):
                wrong += 1
                if len(bad) < show:
                    bad.append(f"  {word!r}: reference {expected}, cmr {n!r}")
    missing = len(want)
    bad += [f"  {w!r}: reference {want[w]}, missing in cmr" for w in list(want)[:show]]
    if wrong or missing:
        return [f"{wrong} words wrong, {missing} missing", *bad[: 2 * show]]
    return []


def exit_status(rows: Sequence[Any]) -> int:
    """1, said in red, when any row's output differs from the reference; else 0."""
    if any(r.exact is False for r in rows):
        console.print("[bold red]cmr output differs from the reference[/]")
        return 1
    return 0


# ------------------------------------------------------------------------------- fit


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = slope * x + intercept, and R² (1 - SS_res / SS_tot)."""
    n = len(xs)
    if n < 2 or n != len(ys):
        raise ValueError("fit needs at least two (x, y) points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit needs at least two different x")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return slope, intercept, r2


# ---------------------------------------------------------------------------- memory


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes; {} when it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _children(pid: int) -> list[int]:
    """All descendants of pid (psutil when installed, else a scan of /proc)."""
    try:
        import psutil
    except ImportError:
        parents: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{d}/stat").read_text()
                    ppid = int(stat.rsplit(")", 1)[1].split()[1])
                    parents.setdefault(ppid, []).append(int(d))
        out, todo = [], [pid]
        while todo:
            kids = parents.get(todo.pop(), [])
            out += kids
            todo += kids
        return out
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class Sampled:
    peak_total: int = 0  # max over samples of (this process + descendants) RSS
    peak_main_hwm: int = 0  # this process's VmHWM (reset before the run)
    peak_child_hwm: int = 0  # the largest VmHWM of any descendant (pool processes)
    processes: int = 0  # distinct descendants seen
    samples: int = 0
    # After the last map task finished (the map queue is empty): the reducers' phase
    reduce_total: int = 0  # max (this process + descendants) RSS
    reduce_pool: int = 0  # max RSS of one descendant (a pool process reducing)
    series: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, main, pool, max
    spill_files: dict[str, int] = field(default_factory=dict)  # reduce dir -> max runs seen


class Sampler:
    """A thread sampling this process tree's memory, and the sorted runs
    (``run-*.spill``) reducers write to local disk when over their budget."""

    def __init__(self, spool_root: str, every: float = SAMPLE_S) -> None:
        self.spool_root = spool_root
        self.every = every
        self.out = Sampled()
        self._stop = threading.Event()
        self._seen: set[int] = set()
        self.reducing = False  # set by the caller once every map task has finished
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampled:
        with contextlib.suppress(OSError):  # reset this process's VmHWM (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
        self._thread.start()
        return self.out

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        self.out.processes = len(self._seen)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        o = self.out
        me = _status(os.getpid())
        main = me.get("VmRSS", 0)
        o.peak_main_hwm = max(o.peak_main_hwm, me.get("VmHWM", 0))
        pool = biggest = 0
        for pid in _children(os.getpid()):
            st = _status(pid)
            self._seen.add(pid)
            pool += st.get("VmRSS", 0)
            biggest = max(biggest, st.get("VmRSS", 0))
            o.peak_child_hwm = max(o.peak_child_hwm, st.get("VmHWM", 0))
        o.peak_total = max(o.peak_total, main + pool)
        if self.reducing:
            o.reduce_total = max(o.reduce_total, main + pool)
            o.reduce_pool = max(o.reduce_pool, biggest)
        if o.samples % 5 == 0:
            o.series.append((round(time.monotonic() - self._t0, 2), main, pool, biggest))
        o.samples += 1
        for workdir in Path(self.spool_root).glob("cmr-*/reduce-*"):
            with contextlib.suppress(OSError):
                runs = sum(1 for e in os.scandir(workdir) if e.name.startswith("run-"))
                o.spill_files[workdir.name] = max(o.spill_files.get(workdir.name, 0), runs)


# ---------------------------------------------------------------------------- one run


@dataclass
class Trial:
    seconds: float
    parts: list[str]
    stats: dict[str, int]
    maps: int
    memory: Sampled
    queued_peak: int  # bytes of messages the embedded queues held at once (in this process)
    partition_bytes: list[int]  # per partition: the pairs its reducer received
    cpu_s: float = 0.0  # CPU seconds of this process and its pool processes during the run


class MeasuredQueues(EmbeddedQueues):
    """The embedded queues, also adding up every batch a partition queue is sent: its
    pairs' bytes (msgpack, as the reducer spools them) and its bytes as shipped
    (compressed). A partition queue keeps every message until the job ends, and this
    benchmark injects no duplicates, so these are each partition's exact sizes. With
    ``capture``, the pairs are also written to ``capture/p<partition>/<task>-<attempt>``,
    the reducer's own spool files, for :func:`replay`."""

    def __init__(self, capture: Path | None = None) -> None:
        super().__init__()
        self.capture = capture
        self.pair_bytes: Counter[str] = Counter()
        self.body_bytes: Counter[str] = Counter()

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        await super().send(name, bodies)
        for body in bodies:
            msg = wire.decode(body)
            if isinstance(msg, wire.Batch):
                self.pair_bytes[name] += len(msg.pairs)
                self.body_bytes[name] += len(body)
                if self.capture is not None:
                    spool = self.capture / f"p{msg.partition:05d}" / f"{msg.task}-{msg.attempt}"
                    spool.parent.mkdir(parents=True, exist_ok=True)
                    with spool.open("ab") as f:
                        f.write(msg.pairs)


@contextlib.contextmanager
def embedded(capture: Path | None = None) -> Iterator[tuple[Backend, MeasuredQueues]]:
    """The embedded backend as ``cmr.api.open_backend`` builds it, keeping a handle on the
    raw in-memory queues (they live in this process: their bytes are in its RSS)."""
    scratch = tempfile.mkdtemp(prefix="cmr-scratch-")
    queues = MeasuredQueues(capture)
    try:
        yield with_retries(embedded_backend(scratch, queues=queues)), queues
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def queued_bytes(queues: EmbeddedQueues) -> int:
    return sum(
        len(m.body) for q in list(queues._queues.values()) for m in list(q.messages.values())
    )


async def _run(
    path: Path,
    out: Path,
    memory_mb: int,
    reducers: int | None,
    split_bytes: int | None,
    capture: Path | None = None,
) -> Trial:
    spool_root = tempfile.mkdtemp(prefix="cmr-growth-")
    ws = WorkerSettings(memory_mb=memory_mb, poll_s=0.1, spill_dir=spool_root)  # as cmr.run
    try:
        with embedded(capture) as (be, queues):
            peak = 0
            sampler = Sampler(spool_root)

            async def watch() -> None:
                nonlocal peak
                mapping = False
                while True:
                    peak = max(peak, queued_bytes(queues))
                    # Map task messages are deleted when their task commits: an empty map
                    # queue (once it held tasks) means every map finished.
                    left = [len(q.messages) for n, q in queues._queues.items() if n.endswith("-in")]
                    mapping = mapping or any(left)
                    if mapping and left and not any(left):
                        sampler.reducing = True
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch())
            with sampler as mem:
                cpu = cpu_seconds()
                started = time.perf_counter()
                result = await run_on(
                    be,
                    JOB,
                    str(path),
                    str(out),
                    reducers=reducers,
                    worker_settings=ws,
                    overwrite=True,
                    split_bytes=split_bytes,
                )
                seconds = time.perf_counter() - started
                cpu = cpu_seconds() - cpu  # the pool is shut down (reaped) by now
            watcher.cancel()
    finally:
        shutil.rmtree(spool_root, ignore_errors=True)
    maps = int(result.record["maps_done"])
    pairs = [queues.pair_bytes[q] for q in sorted(queues.pair_bytes)]
    return Trial(seconds, result.parts, result.stats, maps, mem, peak, pairs, cpu)


def trial_main(args: argparse.Namespace) -> int:
    """``--trial``: one cmr run in this (fresh) process; prints its Trial as JSON."""
    cmr.logs.configure()
    t = asyncio.run(
        _run(args.trial, args.out, args.memory_mb, args.reducers, args.split_bytes, args.capture)
    )
    print(json.dumps(asdict(t)))
    return 0


@dataclass
class Replay:
    partition_bytes: int
    budget_bytes: int
    baseline_mb: float  # this process's VmHWM with the job loaded, before reducing
    peak_mb: float  # its VmHWM while reducing the partition (reset before)
    spills: int
    seconds: float
    error: str


def replay_main(args: argparse.Namespace) -> int:
    """``--replay DIR``: one partition's spools (see MeasuredQueues) through
    ``run_reduce`` in this fresh process, as a reducer runs them; prints a Replay."""
    from cmr.cpu.instances import job_instance
    from cmr.cpu.reducing import run_reduce
    from cmr.cpu.specs import ReduceSpec
    from cmr.job import JobRef

    ref = JobRef.parse(JOB)
    job_instance("growth", ref, {})
    spools = sorted(str(p) for p in args.replay.iterdir())
    budget = max(REDUCE_FLOOR, args.memory_mb * MIB)
    work = tempfile.mkdtemp(prefix="cmr-replay-")
    spec = ReduceSpec("growth", os.path.join(work, "out"), budget, work)
    try:
        baseline = _status(os.getpid()).get("VmHWM", 0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        started = time.perf_counter()
        r = run_reduce(ref, {}, spools, spec)
        seconds = time.perf_counter() - started
        peak = _status(os.getpid()).get("VmHWM", 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(os.path.getsize(p) for p in spools)
    out = Replay(size, budget, baseline / MB, peak / MB, r.spills, seconds, r.error)
    print(json.dumps(asdict(out)))
    return 0


def run_replay(spools: Path, memory_mb: int, timeout: float = 1800) -> Replay:
    cmd = [sys.executable, __file__, "--replay", str(spools), "--memory-mb", str(memory_mb)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"replay failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Replay(**json.loads(proc.stdout.strip().splitlines()[-1]))


def run_trial(
    path: Path,
    out: Path,
    memory_mb: int,
    reducers: int | None = None,
    split_bytes: int | None = None,
    capture: Path | None = None,
    timeout: float = 1800,
) -> Trial:
    """One cmr run in a fresh Python process, so no size inherits another's memory."""
    cmd = [sys.executable, __file__, "--trial", str(path), "--out", str(out)]
    cmd += ["--memory-mb", str(memory_mb)]
    if capture:
        cmd += ["--capture", str(capture)]
    if reducers:
        cmd += ["--reducers", str(reducers)]
    if split_bytes:
        cmd += ["--split-bytes", str(split_bytes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"trial failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    d = json.loads(proc.stdout.strip().splitlines()[-1])
    d["memory"] = Sampled(**d["memory"])
    return Trial(**d)


# ---------------------------------------------------------------------------------- rows


@dataclass
class Row:
    size_mb: float  # actual input MB (10^6 bytes)
    files: int
    maps: int = 0
    seconds: float | None = None  # best of the trials
    trials: list[float] = field(default_factory=list)
    cpu_s: float | None = None  # CPU seconds of the fastest trial (less disturbed by load)
    mb_s: float | None = None
    peak_rss_mb: float = 0.0  # worker: benchmark process + pool processes, sampled, max
    peak_main_mb: float = 0.0  # the event-loop process alone (VmHWM), max over trials
    peak_pool_mb: float = 0.0  # the largest pool process (VmHWM), max over trials
    reduce_rss_mb: float = 0.0  # peak RSS (main + pool) after the last map finished
    reduce_pool_mb: float = 0.0  # the largest pool process's RSS after the last map finished
    queued_mb: float = 0.0  # shuffle messages the in-memory queues held at once
    reducer_alone_mb: float = 0.0  # the largest partition replayed: peak RSS - baseline
    reducer_alone_spills: int = 0
    budget_bytes: int = 0
    largest_partition_bytes: int = 0
    spill_runs: int = 0  # the job's reduce_spills counter (all partitions)
    spill_files_seen: int = 0  # run-*.spill files the sampler saw (all partitions)
    exact: bool | None = None
    note: str = ""
    series: list[tuple[float, int, int, int]] = field(default_factory=list)  # last trial


def measure(
    path: Path,
    *,
    memory_mb: int,
    repeat: int,
    reducers: int | None = None,
    split_bytes: int | None = None,
    out_root: Path = HERE / "out",
) -> Row:
    files = input_files(path)
    budget = max(REDUCE_FLOOR, memory_mb * MIB)  # as ReduceSpec.of makes it
    row = Row(sum(f.stat().st_size for f in files) / MB, len(files), budget_bytes=budget)
    out = out_root / f"{path.name}-growth"
    cpus: list[float] = []
    capture = Path(tempfile.mkdtemp(prefix="cmr-growth-capture-"))
    for i in range(repeat):
        shutil.rmtree(capture, ignore_errors=True)
        t = run_trial(path, out, memory_mb, reducers, split_bytes, capture)
        row.trials.append(t.seconds)
        cpus.append(t.cpu_s)
        m = t.memory
        row.maps = t.maps
        row.peak_rss_mb = max(row.peak_rss_mb, m.peak_total / MB)
        row.peak_main_mb = max(row.peak_main_mb, m.peak_main_hwm / MB)
        row.peak_pool_mb = max(row.peak_pool_mb, m.peak_child_hwm / MB)
        row.queued_mb = max(row.queued_mb, t.queued_peak / MB)
        row.reduce_rss_mb = max(row.reduce_rss_mb, m.reduce_total / MB)
        row.reduce_pool_mb = max(row.reduce_pool_mb, m.reduce_pool / MB)
        row.series = m.series
        row.largest_partition_bytes = max(row.largest_partition_bytes, *t.partition_bytes)
        row.spill_runs = max(row.spill_runs, t.stats.get("reduce_spills", 0))
        row.spill_files_seen = max(row.spill_files_seen, sum(m.spill_files.values()))
        if row.exact is None:  # every trial produces the same output; check the first
            diff = compare(count_words(files), t.parts)
            row.exact = not diff
            if diff:
                console.print(f"[bold red]MISMATCH at {row.size_mb:.0f} MB:[/]\n" + "\n".join(diff))
        if i == 0:  # the largest partition through a reducer alone, in a fresh process
            largest = max(range(len(t.partition_bytes)), key=t.partition_bytes.__getitem__)
            r = run_replay(capture / f"p{largest:05d}", memory_mb)
            row.reducer_alone_mb = r.peak_mb - r.baseline_mb
            row.reducer_alone_spills = r.spills
            if r.error:
                row.note = f"replay failed: {r.error.strip().splitlines()[-1]}"
    shutil.rmtree(capture, ignore_errors=True)
    row.seconds = min(row.trials)
    row.cpu_s = cpus[row.trials.index(row.seconds)]
    row.mb_s = row.size_mb / row.seconds
    return row


def table(rows: list[Row], title: str) -> Table:
    t = Table(title=title)
    cols = (
        "MB",
        "map tasks",
        "seconds",
        "MB/s",
        "CPU s",
        "peak RSS MB",
        "main MB",
        "pool max MB",
        "queued MB",
        "reducer alone MB",
        "largest partition",
        "budget",
        "spill runs",
        "exact",
        "trials (s)",
    )
    for c in cols:
        t.add_column(c, justify="left" if c in ("exact", "trials (s)") else "right")
    for r in rows:
        t.add_row(
            f"{r.size_mb:.1f}",
            str(r.maps),
            f"{r.seconds:.2f}" if r.seconds else "-",
            f"{r.mb_s:.1f}" if r.mb_s else "-",
            f"{r.cpu_s:.1f}" if r.cpu_s else "-",
            f"{r.peak_rss_mb:.0f}",
            f"{r.peak_main_mb:.0f}",
            f"{r.peak_pool_mb:.0f}",
            f"{r.queued_mb:.1f}",
            f"{r.reducer_alone_mb:.1f}",
            f"{r.largest_partition_bytes / MB:.1f} MB",
            f"{r.budget_bytes / MB:.1f} MB",
            f"{r.spill_runs} ({r.spill_files_seen} seen)",
            {None: "-", True: "[green]yes[/]", False: "[bold red]NO[/]"}[r.exact],
            " ".join(f"{s:.2f}" for s in r.trials),
        )
    return t


def summary(rows: list[Row]) -> dict[str, Any]:
    sizes = [r.size_mb for r in rows]
    secs = [r.seconds or 0.0 for r in rows]
    out: dict[str, Any] = {}
    if len(rows) >= 2:
        slope, intercept, r2 = fit(sizes, secs)
        out |= {"slope_s_per_mb": slope, "intercept_s": intercept, "r2": r2}
        cpu_slope, cpu_intercept, cpu_r2 = fit(sizes, [r.cpu_s or 0.0 for r in rows])
        out |= {"cpu_slope_s_per_mb": cpu_slope, "cpu_intercept_s": cpu_intercept, "cpu_r2": cpu_r2}
    peaks = [r.peak_rss_mb for r in rows if r.peak_rss_mb]
    if peaks:
        out["peak_rss_max_over_min"] = max(peaks) / min(peaks)
    for name, values in (
        ("pool_peak_max_over_min", [r.peak_pool_mb for r in rows]),
        ("reduce_phase_rss_max_over_min", [r.reduce_rss_mb for r in rows]),
        ("reducer_rss_max_over_min", [r.reduce_pool_mb for r in rows]),
        ("reducer_alone_max_over_min", [r.reducer_alone_mb for r in rows]),
    ):
        if all(values):
            out[name] = max(values) / min(values)
    out["budget_below_every_largest_partition"] = all(
        r.largest_partition_bytes > r.budget_bytes for r in rows
    )
    out["every_size_spilled"] = all(r.spill_runs > 0 for r in rows)
    return out


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="25,50,100,200,400", help="corpus sizes, MB (10^6 B)")
    ap.add_argument(
        "--memory-mb",
        type=int,
        default=1,
        help="reducer budget, MiB (WorkerSettings.memory_mb; 0: the reducer's 64 KiB floor)",
    )
    ap.add_argument("--unique", type=int, default=2, help="never-repeated tokens per line")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="trials per size; the fastest counts")
    ap.add_argument("--reducers", type=int, help="default: the job's own (4)")
    ap.add_argument(
        "--split-mb", type=float, help="fixed map split size (default: the engine's choice)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--data", type=Path, default=HERE / "data", help=argparse.SUPPRESS)
    ap.add_argument("--out-root", type=Path, default=HERE / "out", help=argparse.SUPPRESS)
    # internal: one run in a fresh process (see run_trial)
    ap.add_argument("--trial", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--split-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--capture", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trial:
        return trial_main(args)
    if args.replay:
        return replay_main(args)
    if not structlog.is_configured():
        cmr.logs.configure()

    split_bytes = int(args.split_mb * MB) if args.split_mb else None
    sizes = [float(s) for s in args.sizes.split(",")]
    paths = [growth_corpus(s, args.seed, args.unique, args.data) for s in sizes]
    load_before = load_average()
    rows = [
        measure(
            p,
            memory_mb=args.memory_mb,
            repeat=args.repeat,
            reducers=args.reducers,
            split_bytes=split_bytes,
            out_root=args.out_root,
        )
        for p in paths
    ]
    load_after = load_average()
    summ = summary(rows)
    title = (
        f"growth: word count, {args.unique} unique tokens per line, budget "
        f"{max(REDUCE_FLOOR, args.memory_mb * MIB) / MIB:g} MiB, embedded, "
        f"{os.cpu_count()} cores, best of {args.repeat}"
    )
    console.print(table(rows, title))
    if "r2" in summ:
        console.print(
            f"time = {summ['slope_s_per_mb'] * 100:.3f} s per 100 MB x size "
            f"{summ['intercept_s']:+.2f} s;  R² = {summ['r2']:.4f} (goal >= 0.98); "
            f"CPU s: R² = {summ['cpu_r2']:.4f}"
        )
    if "peak_rss_max_over_min" in summ:
        console.print(
            f"peak RSS max/min over sizes: {summ['peak_rss_max_over_min']:.2f} "
            f"(pool processes: {summ.get('pool_peak_max_over_min', math.nan):.2f})"
        )
    console.print(f"load average: before {load_before}, after {load_after}")
    if args.json:
        write_results(
            args.json,
            {
                "memory_mb": args.memory_mb,
                "unique_per_line": args.unique,
                "split_mb": args.split_mb,
                "load_average_before": load_before,
                "load_average_after": load_after,
                "rows": [asdict(r) for r in rows],
                "summary": summ,
            },
        )
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
