"""The tools users would pick instead of cmr, run by benchmarks/wordcount.py.

Each peer runs a small script from ``benchmarks/peers/`` (its tool's idiomatic word count)
in a virtual environment of its own, ``benchmarks/.venvs/<env>``, created here with uv from
the pinned ``benchmarks/peers/<env>.txt`` and rebuilt when that file changes. Creating the
environment is set-up and is not timed; the run is timed from starting the script to its
exit, so the tool's own start-up (a JVM, a Dask process pool, Lithops' local runtime) is
part of it, as starting cmr's pool is part of cmr's time.

:class:`PeakRss` samples the resident memory of a process and all its descendants; the
benchmark uses it for every row, so the peers' figures and cmr's are measured alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

try:
    import psutil
except ModuleNotFoundError as e:  # the word-count setup (scripts/setup.sh) does not install it
    raise SystemExit(
        "benchmarks/peers.py samples peak memory with psutil, which is not installed here: "
        "run scripts/setup.sh dev (the development tools) and try again"
    ) from e

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "peers"
VENVS = HERE / ".venvs"
MB = 1_000_000
STAMP = ".requirements-sha256"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


# ------------------------------------------------------------------------- peak memory


def tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its live descendants (none once root is gone)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def rss(procs: list[psutil.Process]) -> int:
    """Bytes resident in these processes, summed."""
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):  # one that exited holds nothing now
            total += p.memory_info().rss
    return total


# The sampler, a process of its own: as a thread of the measured process it took that
# process's GIL for each sample (psutil reading /proc for every process, every 50 ms), and
# the embedded backend's client moves every shuffle batch on that thread's process: cmr's
# word count of 200 MB took ~10 s measured so and ~6 s unmeasured (2026-11-27).
_SAMPLER = r"""
import json, select, sys
import psutil
root, interval, me = psutil.Process(int(sys.argv[1])), float(sys.argv[2]), psutil.Process().pid
peak = first = samples = 0
seen = {}
while True:
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    total = 0
    for p in procs:
        if p.pid == me:
            continue
        try:
            total += p.memory_info().rss
            if p.pid != root.pid and p.pid not in seen:
                seen[p.pid] = p.create_time()
        except psutil.Error:
            pass
    first = first if samples else total
    peak, samples = max(peak, total), samples + 1
    if samples == 1:
        print("ready", flush=True)
    if select.select([sys.stdin], [], [], interval)[0]:
        break
json.dump({"peak": peak, "first": first, "samples": samples, "seen": seen}, sys.stdout)
"""


class PeakRss:
    """The peak of the summed RSS of a process tree, sampled every ``interval`` seconds
    by a process of its own (_SAMPLER)::

        with PeakRss(os.getpid()) as peak:
            work()
        print(peak.mb)

    Pages shared between processes (a forked pool's copy-on-write pages, shared
    libraries) count once per process that maps them, as ``ps`` and ``top`` show them.
    The sampler is not counted, though it is a child of the process it samples.
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.first = 0  # the tree's RSS when sampling started
        self.samples = 0
        self.seen: dict[int, float] = {}  # every descendant sampled: pid -> its start time
        self._proc: subprocess.Popen[str] | None = None

    def leftovers(self) -> list[psutil.Process]:
        """Descendants seen while sampling that still run (their start times compared, so
        a recycled pid is not mistaken for one of them)."""
        alive = []
        for pid, created in self.seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == created and p.is_running():
                    alive.append(p)
        return alive

    def __enter__(self) -> PeakRss:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, str(self.pid), str(self.interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline() != "ready\n":  # its first sample taken
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError("the peak memory sampler did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._proc is not None
        try:
            out, _ = self._proc.communicate("stop\n", timeout=60)
            doc = json.loads(out)
        except (subprocess.TimeoutExpired, ValueError, OSError) as e:
            self._proc.kill()
            self._proc.wait()
            if exc is None:  # the body's own error, if any, is the one to see
                raise RuntimeError(f"the peak memory sampler failed: {e}") from e
            return
        self.peak, self.first, self.samples = doc["peak"], doc["first"], doc["samples"]
        self.seen = {int(pid): created for pid, created in doc["seen"].items()}

    @property
    def mb(self) -> float:
        return self.peak / MB


# ------------------------------------------------------------------------------- peers


@dataclass(frozen=True)
class Peer:
    name: str  # as given to --peers
    label: str  # the table's run column
    env: str  # benchmarks/peers/<env>.txt and benchmarks/.venvs/<env>
    package: str  # whose pinned version the row shows
    script: str  # in benchmarks/peers/
    method: str  # the table's note: how it counts
    args: tuple[str, ...] = ()
    java: bool = False

    @property
    def requirements(self) -> Path:
        return SCRIPTS / f"{self.env}.txt"

    @property
    def venv(self) -> Path:
        return VENVS / self.env

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def version(self) -> str:
        """The tool's pinned version, from its requirements file."""
        text = self.requirements.read_text() if self.requirements.exists() else ""
        found = re.search(rf"^{self.package}(?:\[[^\]]*\])?==(\S+)", text, re.MULTILINE)
        return found[1] if found else "?"


PEERS = {
    p.name: p
    for p in (
        Peer(
            "mrjob-inline",
            "mrjob inline",
            "mrjob",
            "mrjob",
            "mrjob_wc.py",
            "in-mapper Counter (mapper_final), reducer; every task in 1 process",
            ("--runner", "inline"),
        ),
        Peer(
            "mrjob-local",
            "mrjob local",
            "mrjob",
            "mrjob",
            "mrjob_wc.py",
            "in-mapper Counter (mapper_final), reducer; task subprocesses, pool of {workers}",
            ("--runner", "local"),
        ),
        Peer(
            "lithops",
            "lithops localhost",
            "lithops",
            "lithops",
            "lithops_wc.py",
            "map_reduce: Counter per byte range, 1 merging reduce; {workers} processes",
        ),
        Peer(
            "dask",
            "dask bag",
            "dask",
            "dask",
            "dask_wc.py",
            "read_text, str.split, flatten, frequencies; processes scheduler x{workers}",
        ),
        Peer(
            "spark",
            "pyspark",
            "pyspark",
            "pyspark",
            "spark_wc.py",
            "byte ranges, flatMap, reduceByKey(add), saveAsTextFile; local[{workers}]",
            java=True,
        ),
    )
}


def select(spec: str) -> list[Peer]:
    """``all``, ``none`` or a comma list of peer names, in the order given."""
    if spec.strip() in ("", "none"):
        return []
    if spec.strip() == "all":
        return list(PEERS.values())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    return [PEERS[n] for n in dict.fromkeys(names)]


# -------------------------------------------------------------------------------- venvs


def last_lines(text: str, n: int = 3, width: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-width:]


def uv_command() -> list[str] | None:
    if found := shutil.which("uv"):
        return [found]
    probe = subprocess.run(
        [sys.executable, "-m", "uv", "--version"], capture_output=True, check=False
    )
    return [sys.executable, "-m", "uv"] if probe.returncode == 0 else None


def requirements_hash(peer: Peer) -> str:
    return hashlib.sha256(peer.requirements.read_bytes()).hexdigest()


def venv_ready(peer: Peer) -> bool:
    """Whether the peer's venv exists and was built from its current requirements file."""
    stamp = peer.venv / STAMP
    return (
        peer.requirements.exists()
        and peer.python.exists()
        and stamp.exists()
        and stamp.read_text().strip() == requirements_hash(peer)
    )


def ensure_venv(
    peer: Peer, on_build: Callable[[str], None] | None = None
) -> tuple[str | None, float]:
    """Create the peer's venv unless an up-to-date one exists: (why it failed or None,
    seconds spent building; 0 when it was already there)."""
    if not peer.requirements.exists():
        return f"{peer.requirements.relative_to(HERE.parent)} is missing", 0.0
    if venv_ready(peer):
        return None, 0.0
    # One builder at a time (parallel test workers, two benchmarks started together): the
    # others wait on the lock, then find the venv it built instead of removing it mid-build.
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    with open(peer.venv.parent / f".{peer.venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv_ready(peer):
            return None, 0.0
        return _build_venv(peer, on_build)


def _build_venv(peer: Peer, on_build: Callable[[str], None] | None) -> tuple[str | None, float]:
    digest = requirements_hash(peer)
    uv = uv_command()
    if uv is None:
        return "uv is not installed (pip install uv)", 0.0
    if on_build:
        on_build(f"building {peer.venv.relative_to(HERE.parent)} (once) ...")
    started = time.monotonic()
    shutil.rmtree(peer.venv, ignore_errors=True)
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    req = str(peer.requirements)
    steps = [
        [*uv, "venv", "--quiet", "--python", "python3.11", str(peer.venv)],
        [*uv, "pip", "install", "--quiet", "--python", str(peer.python), "-r", req],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            shutil.rmtree(peer.venv, ignore_errors=True)
            what = "uv venv" if cmd[len(uv)] == "venv" else "uv pip install"
            return f"venv: {what} failed: {last_lines(done.stderr or done.stdout)}", 0.0
    (peer.venv / STAMP).write_text(digest + "\n")
    seconds = time.monotonic() - started
    if on_build:
        on_build(f"built {peer.venv.relative_to(HERE.parent)} in {seconds:.1f}s")
    return None, seconds


def java_problem() -> str | None:
    """Why PySpark cannot start here (it needs Java 17 or newer), or None."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        return "Java missing (PySpark 4 needs Java 17+; apt-get install openjdk-17-jre-headless)"
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"java -version failed: {e}"
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        return f"cannot tell the Java version: {last_lines(out.stderr)}"
    major = int(found[1]) if found[1] != "1" else int(found[2] or 0)
    return None if major >= 17 else f"Java {major} is too old (PySpark 4 needs Java 17+)"


def prepare(peer: Peer, on_build: Callable[[str], None] | None = None) -> tuple[str | None, float]:
    """Everything before the timed run: (why the peer cannot run or None, set-up seconds)."""
    if peer.java and (problem := java_problem()):
        return problem, 0.0
    return ensure_venv(peer, on_build)


# --------------------------------------------------------------------------------- runs


@dataclass
class PeerRun:
    seconds: float | None = None
    cpu_s: float | None = None  # of the run's processes that were waited for
    peak_mb: float | None = None
    start_mb: float | None = None  # at the first sample, just after the script started
    parts: list[str] = field(default_factory=list)  # word<TAB>count files
    failure: str | None = None  # crashed, timed out, wrote no output


def output_parts(out: Path) -> list[str]:
    """The data files a tool wrote into ``out``: not its markers or checksums."""
    return sorted(
        str(p) for p in out.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))
    )


def children_cpu() -> float:
    """CPU seconds of this process's children that were waited for, and theirs."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def subreaper(on: bool) -> bool:
    """Make this process adopt its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``).

    A tool's helpers may outlive the process that started them (PySpark's driver does not
    wait for its JVM): adopted, they are reaped here, so their CPU time is counted in
    RUSAGE_CHILDREN like everyone else's instead of vanishing with them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def kill_tree(
    proc: subprocess.Popen[bytes], peak: PeakRss, before: set[int], grace: float = 10.0
) -> None:
    """End what is left of a run: its process group (it was started in a session of its
    own), any descendant the sampler saw that left the group, and any orphan this process
    adopted during the run (children not in ``before``), reaping the adopted ones. Only
    processes this run started, so a daemon a tool leaves behind cannot disturb the next
    row."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    me = psutil.Process()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        adopted = [c for c in me.children() if c.pid not in before]
        alive = {p.pid: p for p in [*peak.leftovers(), *adopted]}
        if not alive:
            return
        for p in alive.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if p.ppid() == me.pid:  # adopted (see subreaper): reap it here
                    os.waitpid(p.pid, 0)
        time.sleep(0.02)  # an orphan is handed to this process once its parent is gone


def run(
    peer: Peer,
    files: list[Path],
    out: Path,
    *,
    workers: int,
    timeout: float,
    scratch: Path,
) -> PeerRun:
    """Run the peer's script over ``files`` once, writing word<TAB>count lines under ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    cmd = [
        str(peer.python),
        str(SCRIPTS / peer.script),
        *peer.args,
        "--workers",
        str(workers),
        "--scratch",
        str(scratch),
        "--output",
        str(out),
        *map(str, files),
    ]
    home = peer.venv / "home"  # the tools' caches and user configs stay out of ~
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"HOME": str(home), "TMPDIR": str(scratch), "PYTHONHASHSEED": "0"}
    env |= {"PYSPARK_PYTHON": str(peer.python), "PYSPARK_DRIVER_PYTHON": str(peer.python)}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1"}
    stderr_path = scratch / "output.txt"
    result = PeerRun()
    with stderr_path.open("wb") as stderr:
        adopting = subreaper(True)
        before = {c.pid for c in psutil.Process().children()}
        cpu = children_cpu()
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=scratch,
            start_new_session=True,
        )
        with PeakRss(proc.pid) as peak:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
            seconds = time.perf_counter() - started
        kill_tree(proc, peak, before)  # a daemon the tool left behind must not outlive its row
        if adopting:
            subreaper(False)
    result.cpu_s, result.peak_mb, result.start_mb = children_cpu() - cpu, peak.mb, peak.first / MB
    tail = last_lines(stderr_path.read_text(errors="replace"))
    if code is None:
        result.failure = f"failed: timed out after {timeout:g}s"
    elif code != 0:
        result.failure = f"failed: exit {code}: {tail}"
    elif not (parts := output_parts(out)):
        result.failure = f"failed: wrote nothing under {out}: {tail}"
    else:
        result.seconds, result.parts = seconds, parts
    return result
