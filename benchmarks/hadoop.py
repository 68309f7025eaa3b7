"""Hadoop 3.4.2's MapReduce examples as a benchmark peer and as an oracle (TeraValidate).

    .venv/bin/python benchmarks/hadoop.py install
    .venv/bin/python benchmarks/hadoop.py teragen 100000 DIR
    .venv/bin/python benchmarks/hadoop.py terasort IN OUT [--reducers R]
    .venv/bin/python benchmarks/hadoop.py teravalidate DIR          # a Hadoop output
    .venv/bin/python benchmarks/hadoop.py validate-cmr DIR          # a cmr output (_SUCCESS)
    .venv/bin/python benchmarks/hadoop.py wordcount IN OUT [--combine MAX_SPLIT_BYTES]

Hadoop runs in local mode: ``org.apache.hadoop.examples.ExampleDriver`` in one JVM
(``LocalJobRunner``, ``file:///``, no daemons, no ``hadoop`` launcher script). Its jars come
from Maven Central only: ``mvn dependency:copy-dependencies`` on the pinned
``benchmarks/hadoop/pom.xml`` fills ``<cache>/lib-3.4.2`` (``<cache>`` is
``$CMR_HADOOP_CACHE`` or ``benchmarks/.hadoop``, gitignored, with a Maven repository of its
own), once: the pom's sha256 is stamped into the directory, a changed pom rebuilds it. The
sorted list of jar names and sha256s is hashed (``Install.jars_sha256``) so a results file
says exactly which jars ran.

Java 17: no ``--add-opens`` is needed for the jobs run here. Checked by running each with
``-Dsun.reflect.debugModuleAccessChecks=true``, which makes the JVM print every reflective
access the module system refuses, even one the caller catches: none is printed
(``tests/benchmarks/test_hadoop_peer.py`` keeps checking it). ``JVM_FLAGS`` is where they
would go.

TeraValidate exits 0 whatever it finds: its verdict is its report (``part-r-00000`` in the
report directory), one ``checksum<TAB><hex>`` line when the input is sorted, plus an
``error<TAB>...`` line per misordered pair. :func:`teravalidate` reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__:  # imported as benchmarks.hadoop (the tests, benchmarks/vs_hadoop.py)
    from benchmarks import peers
else:  # run as a script: benchmarks/ is on sys.path
    import peers  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
POM = HERE / "hadoop" / "pom.xml"
CONF = HERE / "hadoop" / "conf"  # log4j.properties, first on the class path
VERSION = "3.4.2"
DRIVER = "org.apache.hadoop.examples.ExampleDriver"
TEXT_INPUT = "org.apache.hadoop.mapreduce.lib.input.TextInputFormat"
COMBINE_INPUT = "org.apache.hadoop.mapreduce.lib.input.CombineTextInputFormat"
JVM_FLAGS: tuple[str, ...] = ()  # Java 17 needs none here (see the module's docstring)
STAMP = ".pom-sha256"
JARS = "jars.txt"  # name<TAB>sha256 per jar, sorted
MB = 1_000_000
INSTALL_TIMEOUT_S = 900  # Maven's fetch into an empty cache takes ~10 s; a hung one ends
LOCK_SLACK_S = 60  # what an installer does besides Maven, at most, while it holds the lock
RECORD, KEY = 100, 10  # TeraGen's records: 100 bytes, the first 10 the key
_SPLITS = re.compile(rb"number of splits:(\d+)")
_CHECKSUM = re.compile(r"^checksum\t[0-9a-f]+$")
_RUNS = itertools.count(1)


def cache_dir() -> Path:
    return Path(os.environ.get("CMR_HADOOP_CACHE") or HERE / ".hadoop")


# ----------------------------------------------------------------------------- install


@dataclass(frozen=True)
class Install:
    lib: Path  # the jar directory, for ``-cp lib/*``
    jars: int
    jars_sha256: str  # of jars.txt: which jars, byte for byte
    seconds: float  # spent installing now; 0 when the cache was ready


def pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def lib_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / f"lib-{VERSION}"


def jar_list(lib: Path) -> str:
    """``name<TAB>sha256`` of every jar in ``lib``, sorted by name."""
    lines = [
        f"{p.name}\t{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
        for p in sorted(lib.glob("*.jar"))
    ]
    return "".join(lines)


def ready(cache: Path | None = None) -> Install | None:
    """The installed jars, when they were built from the current pom; else None."""
    lib = lib_dir(cache)
    stamp, listing = lib / STAMP, lib / JARS
    if not (stamp.exists() and listing.exists()) or stamp.read_text().strip() != pom_hash():
        return None
    text = listing.read_text()
    return Install(lib, text.count("\n"), hashlib.sha256(text.encode()).hexdigest(), 0.0)


def install(cache: Path | None = None, on_build: Callable[[str], None] | None = None) -> Install:
    """Hadoop's jars in the cache, fetched from Maven Central unless already there.
    Raises RuntimeError with Maven's last lines when it fails."""
    if found := ready(cache):
        return found
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven is not installed (apt-get install maven): it fetches Hadoop")
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # One installer at a time per cache: test processes start together on a fresh machine,
    # and a second installer's swap used to delete the directory a first one had returned
    # while its JVM was loading classes from it (CI: "Could not find or load main class").
    with open(cache / ".install.lock", "w") as lock:
        # Bounded: an installer holds the lock at most its Maven run's INSTALL_TIMEOUT_S.
        deadline = time.monotonic() + INSTALL_TIMEOUT_S + LOCK_SLACK_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"another process has been installing Hadoop into {cache} for over "
                        f"{INSTALL_TIMEOUT_S + LOCK_SLACK_S} s: end it, or remove {cache} and retry"
                    ) from None
                time.sleep(0.5)
        if found := ready(cache):  # installed by the one we waited for
            return found
        return _build(cache, mvn, on_build)


def _build(cache: Path, mvn: str, on_build: Callable[[str], None] | None) -> Install:
    lib = lib_dir(cache)
    tmp = cache / f".lib-{VERSION}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if on_build:
        on_build(f"installing Hadoop {VERSION} into {lib} (once) ...")
    started = time.monotonic()
    cmd = [
        mvn,
        "-q",
        "-B",  # no colours, no progress bars
        "-C",  # a jar whose checksum does not match Maven Central's fails the install
        "-f",
        str(POM),
        f"-Dmaven.repo.local={cache / 'm2'}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp}",
    ]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"mvn dependency:copy-dependencies took over {INSTALL_TIMEOUT_S} s (is Maven "
            "Central reachable?): Hadoop was not installed"
        ) from None
    if done.returncode != 0 or not any(tmp.glob("*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"mvn dependency:copy-dependencies failed (exit {done.returncode}): "
            f"{peers.last_lines(done.stdout + done.stderr)}"
        )
    listing = jar_list(tmp)
    (tmp / JARS).write_text(listing)
    (tmp / STAMP).write_text(pom_hash() + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)  # whole or not at all: a half-copied directory is never used
    seconds = time.monotonic() - started
    if on_build:
        on_build(f"installed {listing.count(chr(10))} jars in {seconds:.1f}s")
    return Install(lib, listing.count("\n"), hashlib.sha256(listing.encode()).hexdigest(), seconds)


def problem() -> str | None:
    """Why Hadoop cannot run here (no Java 17+), or None."""
    found = peers.java_problem()
    return f"{found} (Hadoop peer)" if found else None


# -------------------------------------------------------------------------------- runs


def conf(*, workers: int, scratch: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``-D`` settings of every run: local mode on the local file system, ``workers``
    map and reduce tasks at a time (LocalJobRunner runs one at a time unless told), and
    Hadoop's own scratch (``hadoop.tmp.dir``: spills, the local job directories) in
    ``scratch`` rather than /tmp/hadoop-<user>."""
    return {
        "mapreduce.framework.name": "local",
        "fs.defaultFS": "file:///",
        "mapreduce.local.map.tasks.maximum": str(workers),
        "mapreduce.local.reduce.tasks.maximum": str(workers),
        "hadoop.tmp.dir": str(scratch / "hadoop-tmp"),
        **(extra or {}),
    }


def command(
    tool: str,
    args: Sequence[str],
    settings: Mapping[str, str],
    *,
    lib: Path,
    scratch: Path,
    java: str = "java",
    jvm: Sequence[str] = (),
) -> list[str]:
    """``java ... ExampleDriver <tool> -D k=v ... <args>``: the generic options (``-D``) go
    right after the tool's name, where each example's ToolRunner parses them."""
    return [
        java,
        *JVM_FLAGS,
        *jvm,
        f"-Djava.io.tmpdir={scratch}",
        "-cp",
        f"{CONF}{os.pathsep}{lib / '*'}",
        DRIVER,
        tool,
        *[arg for k, v in settings.items() for arg in ("-D", f"{k}={v}")],
        *args,
    ]


@dataclass(frozen=True)
class Env:
    """Where and how runs go: Hadoop's scratch and logs in ``scratch``, ``workers`` tasks at
    a time, ``timeout`` seconds before a run is killed, extra JVM options (``-Xmx2g``)."""

    scratch: Path
    workers: int = os.cpu_count() or 1
    timeout: float = 3600
    hadoop: Install | None = None  # None: install() (a no-op once installed)
    jvm: tuple[str, ...] = ()


@dataclass
class HadoopRun:
    tool: str
    args: list[str]
    seconds: float | None = None  # starting the JVM to its exit
    cpu_s: float | None = None
    peak_mb: float | None = None  # the JVM's RSS (and any child's), sampled every 50 ms
    start_mb: float | None = None
    exit_code: int | None = None
    splits: list[int] = field(default_factory=list)  # map tasks, per job it submitted
    failure: str | None = None
    log: str = ""  # its stdout and stderr

    @property
    def maps(self) -> int:
        return sum(self.splits)


def splits_in(log: bytes) -> list[int]:
    """The ``number of splits:N`` Hadoop's JobSubmitter logs for each job (its map tasks)."""
    return [int(m) for m in _SPLITS.findall(log)]


def run(
    tool: str, args: Sequence[str], env: Env, extra: Mapping[str, str] | None = None
) -> HadoopRun:
    """One example, timed from starting the JVM to its exit, its peak RSS sampled with
    :class:`peers.PeakRss`; a run longer than ``env.timeout`` seconds is killed and fails."""
    hadoop = env.hadoop or install()
    env.scratch.mkdir(parents=True, exist_ok=True)
    settings = conf(workers=env.workers, scratch=env.scratch, extra=extra)
    cmd = command(tool, args, settings, lib=hadoop.lib, scratch=env.scratch, jvm=env.jvm)
    log = env.scratch / f"{tool}-{next(_RUNS):03d}.log"  # one per run, kept
    result = HadoopRun(tool, list(args), log=str(log))
    with log.open("wb") as out:
        cpu = peers.children_cpu()
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        with peers.PeakRss(proc.pid) as peak:
            try:
                code: int | None = proc.wait(env.timeout)
            except subprocess.TimeoutExpired:
                code = None
            seconds = time.perf_counter() - started
        with contextlib.suppress(ProcessLookupError):  # anything it left running
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = log.read_bytes()
    result.cpu_s = peers.children_cpu() - cpu
    result.peak_mb, result.start_mb = peak.mb, peak.first / MB
    result.exit_code, result.splits = code, splits_in(text)
    if code is None:
        result.failure = f"failed: timed out after {env.timeout:g}s (log: {log})"
    elif code != 0:
        tail = peers.last_lines(text.decode(errors="replace"))
        result.failure = f"failed: {tool} exit {code}: {tail} (log: {log})"
    else:
        result.seconds = seconds
    return result


def teragen(rows: int, out: Path, env: Env) -> HadoopRun:
    """``rows`` 100-byte records into ``out``/part-m-00000. One file: TeraGen makes one per
    map task, and local mode forces ``mapreduce.job.maps`` to 1 (LocalClientProtocolProvider)."""
    shutil.rmtree(out, ignore_errors=True)
    return run("teragen", [str(rows), str(out)], env)


def terasort(inp: Path, out: Path, env: Env, reducers: int = 1) -> HadoopRun:
    """Sort TeraGen's records into ``out``/part-r-NNNNN, which concatenate in order."""
    shutil.rmtree(out, ignore_errors=True)
    return run("terasort", [str(inp), str(out)], env, {"mapreduce.job.reduces": str(reducers)})


def wordcount_conf(combine_max_split: int | None, reducers: int = 1) -> dict[str, str]:
    """WordCount's settings. The example sets no input format, so ``-D`` chooses it: with
    ``combine_max_split`` bytes CombineTextInputFormat, which packs many small files into
    each map task up to that size; else TextInputFormat (a map task per file at least).
    Subdirectories are read too (FileInputFormat reads only the top level by default)."""
    extra = {
        "mapreduce.input.fileinputformat.input.dir.recursive": "true",
        "mapreduce.job.reduces": str(reducers),
    }
    if combine_max_split is not None:
        extra["mapreduce.job.inputformat.class"] = COMBINE_INPUT
        extra["mapreduce.input.fileinputformat.split.maxsize"] = str(combine_max_split)
    return extra


def wordcount(
    inp: Path, out: Path, env: Env, combine_max_split: int | None = None, reducers: int = 1
) -> HadoopRun:
    """Hadoop's WordCount example over ``inp``: ``word<TAB>count`` lines in ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    extra = wordcount_conf(combine_max_split, reducers)
    return run("wordcount", [str(inp), str(out)], env, extra)


def word_total(out: Path) -> int:
    """The sum of the counts in a WordCount output (its part-r-* files)."""
    total = 0
    for part in sorted(out.glob("part-r-*")):
        for line in part.read_bytes().splitlines():
            total += int(line.rpartition(b"\t")[2])
    return total


# ------------------------------------------------------------------------ TeraValidate


def read_report(report: Path) -> tuple[bool, list[str]]:
    """TeraValidate's verdict from its report directory: sorted iff the report is exactly
    one ``checksum<TAB><hex>`` line. Any other line (``error<TAB>misorder in ...``,
    ``error<TAB>bad key partitioning ...``) is a failure, and so is a report without a
    checksum (no records read) or no report at all."""
    parts = sorted(p for p in report.glob("part-r-*") if p.is_file())
    if not parts:
        return False, [f"no TeraValidate report in {report}"]
    lines = [line for p in parts for line in p.read_text(errors="replace").splitlines() if line]
    ok = len(lines) == 1 and bool(_CHECKSUM.match(lines[0]))
    if not lines:
        lines = [f"the TeraValidate report in {report} is empty: it read no records"]
    return ok, lines


def checksum(lines: Sequence[str]) -> str | None:
    """The checksum TeraValidate reported (the sum of every record's CRC-32), or None."""
    found = [line.split("\t", 1)[1] for line in lines if _CHECKSUM.match(line)]
    return found[0] if len(found) == 1 else None


def validate_run(data: Path, env: Env) -> tuple[HadoopRun, bool, list[str]]:
    """TeraValidate over ``data``: (its run, sorted?, the report's lines)."""
    report = env.scratch / "teravalidate-report"
    shutil.rmtree(report, ignore_errors=True)
    ran = run("teravalidate", [str(data), str(report)], env)
    if ran.failure:
        return ran, False, [ran.failure]
    ok, lines = read_report(report)
    return ran, ok, lines


def teravalidate(data: Path, env: Env | None = None) -> tuple[bool, list[str]]:
    """Whether ``data`` (a directory of TeraSort parts, read in file-name order) is sorted,
    and TeraValidate's report lines."""
    env = env or Env(data.parent / f".{data.name}-teravalidate")
    _, ok, lines = validate_run(data, env)
    return ok, lines


def cmr_parts(output: Path) -> list[Path]:
    """A cmr output's parts in partition order: the ones its ``_SUCCESS`` manifest lists,
    and only those (a directory may also hold a replaced output's leftovers).
    Raises ValueError naming the directory when it holds no complete cmr output."""
    from cmr.publish import MANIFEST, Manifest, OutputConflict

    manifest = output / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"{output} has no {MANIFEST}: not a complete cmr output")
    try:
        listed = Manifest.from_bytes(manifest.read_bytes()).parts
    except OutputConflict as e:
        raise ValueError(f"{manifest}: {e}") from None
    by_partition = sorted(listed, key=lambda p: int(p.name[5:10]))
    missing = [p.name for p in by_partition if not (output / p.name).is_file()]
    if missing:
        raise ValueError(f"{output}: {len(missing)} listed parts are missing, e.g. {missing[0]}")
    return [output / p.name for p in by_partition]


def link_name(i: int, n: int) -> str:
    """The ``i``-th of ``n`` names, all of one width: their name order is their number order."""
    return f"part-r-{i:0{max(5, len(str(n - 1)))}d}"


def link_in_order(parts: Sequence[Path], into: Path) -> list[Path]:
    """A fresh directory of symlinks ``part-r-NNNNN`` to ``parts``, numbered in the order
    given. TeraValidate reads every file of its input not named ``_*`` or ``.*`` (Hadoop's
    hidden-file filter), one map task per file, and checks the files against each other in
    file-name order: these names make that order the parts' order, and nothing else is in
    the directory."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    links = []
    for i, part in enumerate(parts):
        link = into / link_name(i, len(parts))
        link.symlink_to(part.resolve())
        links.append(link)
    return links


def validate_cmr_output(output: Path, env: Env | None = None) -> tuple[bool, list[str]]:
    """TeraValidate over a cmr output (``examples/terasort.py``'s): its listed parts,
    linked in partition order. (False, [why]) when it is not a complete cmr output."""
    env = env or Env(output.parent / f".{output.name}-teravalidate")
    try:
        parts = cmr_parts(output)
    except ValueError as e:
        return False, [str(e)]
    link_in_order(parts, env.scratch / "ordered")
    _, ok, lines = validate_run(env.scratch / "ordered", env)
    return ok, lines


# ---------------------------------------------------------------------------------- CLI


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    p = sub.add_parser("teragen")
    p.add_argument("rows", type=int)
    p.add_argument("out", type=Path)
    p = sub.add_parser("terasort")
    p.add_argument("inp", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--reducers", type=int, default=1)
    for name in ("teravalidate", "validate-cmr"):
        sub.add_parser(name).add_argument("dir", type=Path)
    p = sub.add_parser("wordcount")
    p.add_argument("inp", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--combine", type=int, metavar="MAX_SPLIT_BYTES")
    for p in sub.choices.values():
        p.add_argument("--scratch", type=Path, default=HERE / "out" / ".hadoop-scratch")
        p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if why := problem():
        print(why, file=sys.stderr)
        return 2
    hadoop = install(on_build=lambda m: print(m, file=sys.stderr))
    if args.cmd == "install":
        print(json.dumps(asdict(hadoop), default=str))
        return 0
    env = Env(args.scratch, args.workers, hadoop=hadoop)
    if args.cmd in ("teravalidate", "validate-cmr"):
        check = teravalidate if args.cmd == "teravalidate" else validate_cmr_output
        ok, lines = check(args.dir, env)
        print("\n".join(lines))
        print("sorted" if ok else "NOT sorted", file=sys.stderr)
        return 0 if ok else 1
    if args.cmd == "teragen":
        ran = teragen(args.rows, args.out, env)
    elif args.cmd == "terasort":
        ran = terasort(args.inp, args.out, env, args.reducers)
    else:
        ran = wordcount(args.inp, args.out, env, args.combine)
    print(json.dumps(asdict(ran)))
    return 1 if ran.failure else 0


if __name__ == "__main__":
    sys.exit(main())
