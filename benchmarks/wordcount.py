"""Word count benchmark: cmr against a hand-written multiprocessing baseline.

    .venv/bin/python benchmarks/wordcount.py --size-mb 200 [--path P]
        [--backends embedded,aws,aws-inproc] [--workers 1,3] [--json out.json] [--seed 1]
        [--peers all|none|mrjob-inline,mrjob-local,lithops,dask,spark]
        [--repeat 1] [--timeout 600]

Generates (or reuses) a seeded synthetic corpus, counts its words with a plain
``multiprocessing`` + ``Counter`` program (the practical limit on this machine), runs cmr on
the same files and the tools users would pick instead (benchmarks/peers.py, each in a venv
of its own), checks that every output equals the baseline's counts exactly, and prints one
row per run. See benchmarks/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import platform
import random
import resource
import runpy
import shutil
import string
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from rich.console import Console
from rich.table import Table

import cmr
import cmr.logs
from cmr import poolstart
from cmr.api import cpu_pool, open_backend, run_on
from cmr.settings import AwsSettings, WorkerSettings
from cmr.worker import Worker

if TYPE_CHECKING:
    from benchmarks import peers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JOB = f"{REPO / 'examples' / 'wordcount.py'}:WordCount"


def load_peers() -> ModuleType:
    """benchmarks/peers.py, imported only by what measures peers or peak memory: it needs
    psutil (scripts/setup.sh dev), which the word-count setup the small benchmarks that import
    this module (smallfiles, growth) run in does not install."""
    if __package__:  # imported as benchmarks.wordcount (the tests)
        from benchmarks import peers
    else:  # run as a script: benchmarks/ is on sys.path
        import peers  # type: ignore[no-redef]
    return peers


# The line-aligned byte-range cutter of the peers that read ranges themselves, for the
# baseline here too: benchmarks/peers/byte_ranges.py (standard library only, so it runs in
# their venvs). Loaded from its file: benchmarks/peers/ holds scripts, not a package (the
# module named peers is benchmarks/peers.py).
line_ranges = runpy.run_path(str(HERE / "peers" / "byte_ranges.py"))["line_ranges"]
MB = 1_000_000
FILES = 8
SERVICES = ("sqs", "s3", "dynamodb")
console = Console(width=None if sys.stdout.isatty() else 200)

# ------------------------------------------------------------------------------ corpus

NON_ASCII = "äöüßéèêçñøåłşğžčřőűабвгдежзикαβγδεζηθ中文字词語ありがとう😀🚀"
ODD_SPACES = ["\u00a0", "\u3000", "\u2028", "\x1f", "\x0b", "\x0c", "\t", "  "]
BAD_BYTES = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x80\x80", b"\xf4\x90\x80\x80"]


def vocabulary(rng: random.Random, n: int = 50_000) -> list[str]:
    """n distinct words of mixed lengths; about 4% carry non-ASCII letters."""
    lengths = list(range(1, 31))
    weights = [1 / (1 + abs(k - 6)) ** 1.5 for k in lengths]  # mostly 3-10 letters
    words: set[str] = set()
    while len(words) < n:
        k = rng.choices(lengths, weights)[0]
        odd = rng.random() < 0.04
        alphabet = NON_ASCII + string.ascii_lowercase if odd else string.ascii_letters
        words.add("".join(rng.choices(alphabet, k=k)))
    return sorted(words)  # set order depends on the salted str hash; sorted is seeded


def line_pool(rng: random.Random, n: int = 1 << 16) -> list[bytes]:
    """n distinct-ish lines of 5-20 Zipf-drawn words, with the awkward cases mixed in."""
    vocab = vocabulary(rng)
    rng.shuffle(vocab)
    cum, total = [], 0.0
    for rank in range(1, len(vocab) + 1):
        total += 1 / rank**1.05
        cum.append(total)
    lines = []
    for _ in range(n):
        words = rng.choices(vocab, cum_weights=cum, k=rng.randint(5, 20))
        if rng.random() < 0.01:  # Unicode whitespace that str.split() splits on
            words.insert(rng.randrange(len(words)), rng.choice(ODD_SPACES))
        line = " ".join(words).encode()
        if rng.random() < 0.005:  # invalid UTF-8, inside a word or between words
            at = rng.randrange(len(line) + 1)
            line = line[:at] + rng.choice(BAD_BYTES) + line[at:]
        lines.append(line + (b"\r\n" if rng.random() < 0.02 else b"\n"))
    return lines


def corpus(size_mb: float, seed: int, root: Path = HERE / "data") -> Path:
    """The corpus directory for (size, seed), generated once and reused afterwards."""
    path = root / f"corpus-{size_mb:g}mb-seed{seed}"
    if path.is_dir():
        return path
    started = time.monotonic()
    rng = random.Random(seed)
    pool = line_pool(rng)
    mean = sum(map(len, pool)) / len(pool)
    per_file = size_mb * MB / FILES
    tmp = root / f".{path.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    long_len = min(2 * MB, per_file / 16)  # two very long lines per file cross splits
    for i in range(FILES):
        lines = rng.choices(pool, k=max(1, round((per_file - 2 * long_len) / mean)))
        for _ in range(2):
            words = b" ".join(rng.choices(pool, k=max(1, int(long_len / mean))))
            lines[rng.randrange(len(lines))] = words.replace(b"\n", b" ") + b"\n"
        data = b"".join(lines)
        if i == FILES - 1:
            data = data.rstrip(b"\n")  # the last file ends without a newline
        (tmp / f"part-{i:03d}.txt").write_bytes(data)
    try:
        tmp.rename(path)  # atomic: a half-written corpus is never reused
    except OSError:
        if not path.is_dir():
            raise
        shutil.rmtree(tmp)  # another process made the same (seeded) corpus first: use it
        return path
    console.print(f"generated {path} in {time.monotonic() - started:.1f}s")
    return path


# ---------------------------------------------------------------------------- baseline


def count_range(task: tuple[str, int, int]) -> Counter[str]:
    name, start, end = task
    with open(name, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return Counter(data.decode("utf-8", "replace").split())


def baseline(files: list[Path]) -> Counter[str]:
    """The hand-written word count: a process per core, line-aligned chunks, merged here."""
    procs = os.cpu_count() or 1
    total = sum(p.stat().st_size for p in files)
    chunk = max(1 << 20, min(8 << 20, total // (procs * 8)))
    tasks = [r for p in files for r in line_ranges(p, chunk)]
    assert sum(b - a for _, a, b in tasks) == total, "chunks must cover every byte once"
    counts: Counter[str] = Counter()
    with multiprocessing.Pool(procs) as pool:
        for part in pool.imap_unordered(count_range, tasks):
            counts.update(part)
    return counts


# -------------------------------------------------------------------------- cmr + check


def read_parts(parts: list[str]) -> Counter[str]:
    """cmr's output, parsed; a word in two parts or a malformed line is an error."""
    counts: Counter[str] = Counter()
    for part in parts:
        for line in Path(part).read_bytes().split(b"\n"):
            if not line:
                continue
            word, _, n = line.decode("utf-8").rpartition("\t")
            if not word or word in counts:
                raise ValueError(f"{part}: bad or repeated word in line {line[:80]!r}")
            counts[word] = int(n)
    return counts


def differences(want: Counter[str], got: Counter[str], show: int = 5) -> list[str]:
    keys = sorted(k for k in want.keys() | got.keys() if want[k] != got[k])
    if not keys:
        return []
    shown = [f"  {k!r}: baseline {want[k]}, cmr {got[k]}" for k in keys[:show]]
    return [f"{len(keys)} words differ", *shown]


def stack_problem() -> str | None:
    """Why the aws rows cannot run, or None when the local stack answers."""
    try:
        importlib.import_module("cmr.backends.aws")
    except Exception as e:
        return f"aws backend does not import ({type(e).__name__}: {e})"
    script = REPO / "scripts" / "stack.sh"
    if not script.exists():
        return "scripts/stack.sh is missing"
    status = subprocess.run([script, "status"], capture_output=True, text=True, check=False)
    if status.returncode != 0:
        return "local stack is down (scripts/stack.sh start)"
    env = subprocess.run([script, "env"], capture_output=True, text=True, check=True).stdout
    for line in env.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ.setdefault(key, value.strip("'\""))
    return None


# ---------------------------------------------------------------------------------- rows


@dataclass
class Row:
    name: str
    seconds: float | None = None  # the best of the trials
    trials: list[float] = field(default_factory=list)
    mb_s: float | None = None
    vs_baseline: float | None = None
    cpu_s: float | None = None  # CPU seconds used by this process and its children
    cores_busy: float | None = None  # cpu_s / seconds
    requests: dict[str, int] = field(default_factory=dict)  # by service
    requests_per_mb: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # by operation
    peak_mb: float | None = None  # summed RSS of the run's processes, sampled every 50 ms
    start_mb: float | None = None  # the same sum at the row's start (this process: imports)
    setup_s: float | None = None  # peers: seconds spent building the venv (not timed)
    exact: bool | None = None
    note: str = ""


def cpu_seconds() -> float:
    # The fork server reaps the pool's processes: ended and waited for here, their CPU time
    # is counted in RUSAGE_CHILDREN, as a spawned pool's was.
    poolstart.stop_server()
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


T = TypeVar("T")


def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float, float]:
    """fn's result, its wall seconds and the CPU seconds it used (here and in children)."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    out = fn(*args, **kwargs)
    wall = time.perf_counter() - wall
    return out, wall, cpu_seconds() - cpu


async def aws_in_process(workers: int, *args: Any, **kwargs: Any) -> cmr.RunResult:
    """The aws backend with the workers in this process, sharing one client, so that
    RunResult.calls counts every request (with worker processes it counts the client's)."""
    aws, ws = AwsSettings(), WorkerSettings()
    async with open_backend("aws", aws) as be:
        with cpu_pool(ws.processes) as pool:
            fleet: list[Worker] = []
            tasks: list[asyncio.Task[None]] = []

            def start(job_id: str) -> None:
                fleet.extend(Worker(be, ws, pool, only_job=job_id) for _ in range(workers))
                tasks.extend(asyncio.create_task(w.run()) for w in fleet)

            try:
                return await run_on(be, *args, aws=aws, workers=0, on_submit=start, **kwargs)
            finally:
                for w in fleet:
                    w.done.set()
                await asyncio.gather(*tasks, return_exceptions=True)


def cmr_run(kind: str, workers: int, timeout: float, *args: Any, **kw: Any) -> cmr.RunResult:
    """One cmr job; one that hangs becomes an error after ``timeout`` seconds."""
    if not structlog.is_configured():
        cmr.logs.configure()
    job = (
        aws_in_process(workers, *args, **kw)
        if kind == "aws-inproc"
        else cmr.run_async(*args, backend=kind, workers=workers, **kw)
    )
    return asyncio.run(asyncio.wait_for(job, timeout))


def trial_cmr(
    kind: str,
    workers: int,
    *,
    path: Path,
    size_mb: float,
    reducers: int | None,
    want: Counter[str],
    timeout: float,
) -> Row:
    row = Row(f"cmr {kind} w={workers}")
    out = HERE / "out" / f"{path.name}-{kind}-w{workers}"
    try:
        with load_peers().PeakRss(os.getpid()) as peak:  # this process and the workers it starts
            result, wall, cpu = timed(
                cmr_run,
                kind,
                workers,
                timeout,
                JOB,
                str(path),
                str(out),
                reducers=reducers,
                overwrite=True,
            )
    except TimeoutError:
        row.note = f"failed: no result after {timeout:g}s (hung?)"
        return row
    except Exception as e:
        row.note = f"failed: {type(e).__name__}: {e}"
        return row
    row.seconds, row.trials, row.cpu_s, row.cores_busy = wall, [wall], cpu, cpu / wall
    row.peak_mb, row.start_mb = peak.mb, peak.first / MB
    row.calls = dict(sorted(result.calls.items()))
    for op, n in result.calls.items():
        service = op.split(".")[0]
        row.requests[service] = row.requests.get(service, 0) + n
    row.requests_per_mb = {s: n / size_mb for s, n in row.requests.items()}
    diff = differences(want, read_parts(result.parts))
    row.exact = not diff
    if diff:
        console.print(f"[bold red]MISMATCH in {row.name}:[/]\n" + "\n".join(diff))
    if kind == "aws":
        row.note = "requests: client only (workers are processes)"
    return row


def peer_name(peer: peers.Peer) -> str:
    return f"{peer.label} {peer.version()}"


def trial_peer(
    peer: peers.Peer,
    *,
    files: list[Path],
    path: Path,
    workers: int,
    want: Counter[str],
    timeout: float,
    setup_s: float,
) -> Row:
    row = Row(peer_name(peer), setup_s=setup_s, note=peer.method.format(workers=workers))
    out = HERE / "out" / f"{path.name}-peer-{peer.name}"
    scratch = HERE / "out" / f".scratch-{peer.name}"
    run = load_peers().run(peer, files, out, workers=workers, timeout=timeout, scratch=scratch)
    row.peak_mb, row.start_mb = run.peak_mb, run.start_mb
    if run.failure or run.seconds is None:
        row.note = f"{run.failure} (log: {scratch / 'output.txt'})"
        return row
    shutil.rmtree(scratch, ignore_errors=True)  # Lithops' storage, Spark's shuffle files
    row.seconds, row.trials, row.cpu_s = run.seconds, [run.seconds], run.cpu_s
    row.cores_busy = (run.cpu_s or 0) / run.seconds
    try:
        diff = differences(want, read_parts(run.parts))
    except (ValueError, UnicodeDecodeError) as e:
        diff = [f"unreadable output: {e}"]
    row.exact = not diff
    if diff:
        console.print(f"[bold red]MISMATCH in {row.name}:[/]\n" + "\n".join(diff))
        row.note = f"{diff[0]}; {row.note}"
    return row


def best_of(trials: list[Row]) -> Row:
    """The fastest trial, unless one failed the check: a mismatch is never hidden."""
    wrong = [r for r in trials if r.exact is False]
    done = wrong or [r for r in trials if r.seconds is not None]
    if not done:
        return trials[-1]
    best = min(done, key=lambda r: r.seconds or 0)
    best.trials = [t for r in trials for t in r.trials]
    return best


def table(rows: list[Row], title: str) -> Table:
    t = Table(title=title)
    for col in (
        "run",
        "seconds",
        "MB/s",
        "x baseline",
        "CPU s",
        "cores busy",
        "peak MB",
        *SERVICES,
        "req/MB",
        "exact",
        "note",
    ):
        t.add_column(col, justify="left" if col in ("run", "note") else "right")

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        per_mb = sum(r.requests_per_mb.values()) if r.requests else None
        exact = {None: "-", True: "[green]yes[/]", False: "[bold red]NO[/]"}[r.exact]
        t.add_row(
            r.name,
            f(r.seconds, ".2f"),
            f(r.mb_s, ".1f"),
            f(r.vs_baseline, ".2f"),
            f(r.cpu_s, ".1f"),
            f(r.cores_busy, ".2f"),
            f(r.peak_mb, ".0f"),
            *[str(r.requests.get(s, 0)) if r.requests else "-" for s in SERVICES],
            f(per_mb, ".1f"),
            exact,
            r.note,
        )
    return t


def write_results(path: Path, fields: dict[str, Any], *, date: str | None = None) -> None:
    """A benchmark's results JSON: when (``date``, else local time) and how it was run, on
    how many cores and which Python, then its own ``fields``."""
    doc = {
        "date": date or time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **fields,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> int:
    peers = load_peers()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--path", type=Path, help="count these files instead of a generated corpus")
    ap.add_argument(
        "--backends",
        default="embedded,aws",
        help="any of embedded, aws, aws-inproc (aws, workers in this process); none",
    )
    ap.add_argument("--workers", default="1,3", help="worker counts for the aws backends")
    ap.add_argument("--reducers", type=int, help="default: the job's own (4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every row N times, interleaved; report the fastest",
    )
    ap.add_argument(
        "--peers",
        default="all",
        help=f"all, none, or any of {','.join(peers.PEERS)} (each in its own venv)",
    )
    ap.add_argument(
        "--peer-workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes for the peers (default: cores, like the baseline)",
    )
    ap.add_argument("--timeout", type=float, default=600, help="seconds before a run fails")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        chosen = peers.select(args.peers)
    except ValueError as e:
        ap.error(str(e))

    path = args.path or corpus(args.size_mb, args.seed)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    size_mb = sum(p.stat().st_size for p in files) / MB

    runs = []
    for kind in [k for k in args.backends.split(",") if k not in ("", "none")]:
        counts = [1] if kind == "embedded" else [int(w) for w in args.workers.split(",")]
        runs += [(kind, w) for w in counts]
    aws_problem = stack_problem() if any(k.startswith("aws") for k, _ in runs) else None
    ready: dict[str, tuple[str | None, float]] = {}  # peer: (why it cannot run, set-up s)
    for peer in chosen:  # set-up, not timed: build each venv once (pyspark's takes a minute)
        ready[peer.name] = peers.prepare(peer, console.print)

    want: Counter[str] = Counter()
    trials: dict[str, list[Row]] = {}
    for _ in range(args.repeat):
        with peers.PeakRss(os.getpid()) as peak:
            want, wall, cpu = timed(baseline, files)
        trials.setdefault("baseline", []).append(
            Row(
                "baseline",
                wall,
                [wall],
                cpu_s=cpu,
                cores_busy=cpu / wall,
                peak_mb=peak.mb,
                start_mb=peak.first / MB,
                note=f"multiprocessing x{os.cpu_count()}, {len(want)} distinct words",
            )
        )
        for kind, workers in runs:
            name = f"cmr {kind} w={workers}"
            if kind.startswith("aws") and aws_problem:
                trials[name] = [Row(name, note=f"not run: {aws_problem}")]
                continue
            trials.setdefault(name, []).append(
                trial_cmr(
                    kind,
                    workers,
                    path=path,
                    size_mb=size_mb,
                    reducers=args.reducers,
                    want=want,
                    timeout=args.timeout,
                )
            )
        for peer in chosen:
            name = peer_name(peer)
            problem, setup_s = ready[peer.name]
            if problem:
                trials[name] = [Row(name, setup_s=setup_s, note=f"not run: {problem}")]
                continue
            trials.setdefault(name, []).append(
                trial_peer(
                    peer,
                    files=files,
                    path=path,
                    workers=args.peer_workers,
                    want=want,
                    timeout=args.timeout,
                    setup_s=setup_s,
                )
            )

    rows = [best_of(t) for t in trials.values()]
    base_s = rows[0].seconds or 1.0
    for r in rows:
        if r.seconds:
            r.mb_s, r.vs_baseline = size_mb / r.seconds, base_s / r.seconds

    title = (
        f"word count, {size_mb:.1f} MB in {len(files)} files ({path}), "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, best of {args.repeat}"
    )
    console.print(table(rows, title))
    if args.json:
        write_results(
            args.json,
            {
                "input": str(path),
                "input_mb": size_mb,
                "files": len(files),
                "rows": [asdict(r) for r in rows],
            },
        )
    if any(r.exact is False for r in rows):
        console.print("[bold red]output differs from the baseline[/]")
        return 1
    if any(r.note.startswith("failed") for r in rows):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
