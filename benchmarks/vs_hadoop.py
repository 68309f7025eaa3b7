"""cmr next to Hadoop 3.4.2 (local mode, one JVM), in one sitting: word count, many small
files, word count on real text and on many small files of it, TeraSort. Each cmr figure
sits next to Hadoop's, with peak memory.

    .venv/bin/python benchmarks/vs_hadoop.py [--scale 1]
        [--only wordcount,smallfiles,realtext,realsmallfiles,terasort]
        [--workers N] [--reducers 4] [--json benchmarks/results-vs-hadoop.json]
    .venv/bin/python benchmarks/vs_hadoop.py --scale 0.01      # smoke: under a minute

At ``--scale 1``: word count over 200 MB (word count's seeded corpus), 20,000 small files
holding 100 MB (the small files benchmark's corpus; Hadoop reads them with TextInputFormat,
a map task per file, and with CombineTextInputFormat), word count over 200 MB of real text
and over 4,000 small files holding 80 MB of it (benchmarks/realtext.py: this machine's
docs, man pages and Python sources, with far more distinct words than the seeded corpus),
and TeraSort of 20,000,000 TeraGen records (2 GB). Sizes and file counts are multiplied by
``--scale``.

Every word count also runs a hand-written two-process ``Counter`` (``counter_run``): the
input's bytes in two halves, cut at line ends; this process counts one while a forked one
counts the other, each ``Counter(data.decode("utf-8", "replace").split())`` (cmr's words);
the other's counts come back pickled, are added to these, and written as cmr writes them
(``word\\tcount`` lines in key order), so both rows end with the counts on disk.

Checks: cmr's word counts, and the two-process Counter's, equal the hand-written baseline's
word for word (as in benchmarks/wordcount.py). Hadoop's WordCount splits words with Java's
StringTokenizer (``" \\t\\n\\r\\f"``), not Python's ``str.split()``, so its words differ
on the corpus's Unicode spaces; its check is the total: the sum of its counts equals the
number of tokens that tokenizer finds in the bytes. TeraSort: TeraValidate passes (one
checksum line, no error) and its checksum (the sum of the records' CRC-32s) equals the
input's, so no record was lost or doubled; cmr's output is validated the same way
(benchmarks/hadoop.py's ``validate_cmr_output``). The cmr side of TeraSort is
``examples/terasort.py``; without it the row says "not available".
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import psutil

import cmr

if __package__:  # imported as benchmarks.vs_hadoop (the tests)
    from benchmarks import hadoop, peers, realtext, smallfiles, wordcount
else:  # run as a script: benchmarks/ is on sys.path
    import hadoop  # type: ignore[no-redef]
    import peers  # type: ignore[no-redef]
    import realtext  # type: ignore[no-redef]
    import smallfiles  # type: ignore[no-redef]
    import wordcount  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORDCOUNT_JOB = f"{REPO / 'examples' / 'wordcount.py'}:WordCount"
TERASORT_JOB = REPO / "examples" / "terasort.py"
MB = 1_000_000
T = TypeVar("T")
TOKENIZER_SPACE = bytes.maketrans(b"\x0b", b"\x01")  # \v splits for Python, not for Java


@dataclass
class Row:
    task: str
    run: str  # "cmr embedded" or "Hadoop 3.4.2 local"
    seconds: float | None = None
    cpu_s: float | None = None
    peak_mb: float | None = None
    start_mb: float | None = None  # the measured tree's RSS when the row started
    maps: int | None = None  # map tasks
    ok: bool | None = None  # the row's check (see the module docstring)
    check: str = ""
    note: str = ""


# -------------------------------------------------------------------------------- checks


def tokenizer_total(files: list[Path]) -> int:
    """Words Java's ``StringTokenizer`` (delimiters space, \\t, \\n, \\r, \\f) finds in these
    files. Byte-wise is exact: the delimiters are ASCII, which UTF-8 never uses inside a
    character, and decoding replaces invalid bytes without eating the ASCII after them."""
    return sum(len(p.read_bytes().translate(TOKENIZER_SPACE).split()) for p in files)


def settle() -> None:
    """Before each measured run: the set-up's written data (TeraGen's 2 GB, a corpus) on
    disk, so its write-back does not slow whichever peer runs first."""
    os.sync()


def _apart(
    conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """In a spawned process: say ready, wait for the word, then send back ``("ok", (out,
    wall, cpu))`` of ``wordcount.timed(fn, *args, **kwargs)``, or ``("timeout" | "error",
    why)``."""
    try:
        conn.send("ready")
        conn.recv()
        try:
            conn.send(("ok", wordcount.timed(fn, *args, **kwargs)))
        except TimeoutError as e:
            conn.send(("timeout", str(e)))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


_EXIT_S = 30.0  # how long a measured process may take to exit once it has answered


def _kill_tree(pid: int | None) -> None:
    """Kill the measured process and whatever it left running (its pool's processes)."""
    if pid is None:
        return
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.Error):
                p.kill()


def measured_apart(
    fn: Callable[..., T], *args: Any, **kwargs: Any
) -> tuple[T, float, float, peers.PeakRss]:
    """``fn(*args, **kwargs)`` in a process of its own, started fresh (spawned, not forked): its
    result, wall and CPU seconds (that process and its children), and its tree's peak RSS.

    Why not in this process: this one holds the checks' baselines (a Counter per corpus,
    ~660,000 words for the small files of real text) and the heap of the tasks run before.
    Measured in here, cmr's submit side (which moves every shuffle batch) paid for them in
    the collector's passes: the same code ran 8.34 s after the other tasks and 5.0-5.5 s
    alone (issue 27's sixth sitting), and the peak counted the harness's memory as cmr's.
    A user's ``cmr run`` starts in a process of its own; so does each measured row here.
    Raises TimeoutError or RuntimeError (the child's error, in one line)."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_apart, args=(theirs, fn, args, kwargs))
    child.start()
    theirs.close()
    try:
        if ours.recv() != "ready":
            raise RuntimeError("the measured process did not start")
        with peers.PeakRss(child.pid or 0) as peak:
            ours.send("go")
            kind, got = ours.recv()
        child.join(_EXIT_S)  # a child that cannot exit (a leftover thread) is killed below
    except EOFError:
        child.join(_EXIT_S)
        raise RuntimeError(f"the measured process died (exit code {child.exitcode})") from None
    finally:
        if child.exitcode is None:  # still running (not reaped: its pid is still ours)
            _kill_tree(child.pid)
        child.join()
        ours.close()
    if kind == "timeout":
        raise TimeoutError(got)
    if kind != "ok":
        raise RuntimeError(got)
    out, wall, cpu = got
    return out, wall, cpu, peak


CMR = {"shuffle": "auto"}  # --cmr-shuffle: how cmr's rows shuffle (cmr run --shuffle)


def cmr_row(
    task: str,
    job: str,
    inp: Path,
    out: Path,
    check: Callable[[cmr.RunResult], tuple[bool, str]],
    *,
    reducers: int,
    timeout: float,
) -> Row:
    """One cmr job on the embedded backend, measured as benchmarks/wordcount.py measures
    it (the submitting process and its pool, submit to output on disk), in a process of
    its own (``measured_apart``)."""
    row = Row(task, "cmr embedded")
    settle()
    try:
        result, wall, cpu, peak = measured_apart(
            wordcount.cmr_run, "embedded", 1, timeout, job, str(inp), str(out),
            reducers=reducers, overwrite=True, shuffle=CMR["shuffle"],
        )  # fmt: skip
    except TimeoutError:
        row.note = f"failed: no result after {timeout:g}s (hung?)"
        return row
    except Exception as e:
        row.note = f"failed: {type(e).__name__}: {e}"
        return row
    row.seconds, row.cpu_s, row.peak_mb, row.start_mb = wall, cpu, peak.mb, peak.first / MB
    row.maps = int(result.record.get("maps_done", 0)) or None
    row.ok, row.check = check(result)
    row.check += f"; {result.record.get('shuffle', 'queue')} shuffle"
    return row


def hadoop_row(task: str, ran: hadoop.HadoopRun, note: str = "") -> Row:
    row = Row(task, f"Hadoop {hadoop.VERSION} local", note=note)
    row.peak_mb, row.start_mb, row.cpu_s = ran.peak_mb, ran.start_mb, ran.cpu_s
    row.maps = ran.maps or None
    if ran.failure:
        row.note = ran.failure
    else:
        row.seconds = ran.seconds
    return row


def counts_check(want: Counter[str]) -> Callable[[cmr.RunResult], tuple[bool, str]]:
    def check(result: cmr.RunResult) -> tuple[bool, str]:
        diff = wordcount.differences(want, wordcount.read_parts(result.parts))
        return (False, diff[0]) if diff else (True, f"{len(want)} distinct words = baseline's")

    return check


def hadoop_words(row: Row, out: Path, want_total: int) -> None:
    if row.seconds is None:
        return
    total = hadoop.word_total(out)
    row.ok = total == want_total
    row.check = f"{total} words in all" + (" = tokenizer's" if row.ok else f", not {want_total}")


# ------------------------------------------------------------- the two-process Counter

Ranges = list[tuple[str, int, int]]
COUNTER_RANGE = 1 << 20  # bytes read and counted at a time (cut at line ends)


def halves(files: list[Path]) -> tuple[Ranges, Ranges]:
    """The files' bytes as two lists of line-aligned ranges holding about half each (within
    a range's size), the files in order."""
    ranges = [r for p in files for r in wordcount.line_ranges(p, COUNTER_RANGE)]
    total = sum(b - a for _, a, b in ranges)
    held = 0
    for i, (_, a, b) in enumerate(ranges):
        if held + (b - a) / 2 >= total / 2:
            return ranges[:i], ranges[i:]
        held += b - a
    return ranges, []


def count_ranges(ranges: Ranges) -> Counter[str]:
    """cmr's words of these ranges, counted. A range ends at a line end, and b"\\n" never
    occurs inside a UTF-8 sequence: decoding range by range equals decoding the whole."""
    counts: Counter[str] = Counter()
    for name, start, end in ranges:
        with open(name, "rb") as f:
            f.seek(start)
            counts.update(f.read(end - start).decode("utf-8", "replace").split())
    return counts


def counter_run(files: list[Path], out: Path) -> Path:
    """The hand-written two-process word count (see the module docstring); its output
    file."""
    first, second = halves(files)
    with multiprocessing.Pool(1) as pool:
        theirs = pool.apply_async(count_ranges, (second,))
        counts = count_ranges(first)
        counts.update(theirs.get())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    part = out / "part-00000"
    # Sorting the words, not the (word, count) items: tuples compare slower (~1.5x here).
    part.write_bytes("".join([f"{w}\t{counts[w]}\n" for w in sorted(counts)]).encode())
    return part


def counter_row(task: str, files: list[Path], out: Path, want: Counter[str]) -> Row:
    row = Row(task, "Python Counter x2")
    settle()
    part, wall, cpu, peak = measured_apart(counter_run, files, out)
    row.seconds, row.cpu_s, row.peak_mb, row.start_mb = wall, cpu, peak.mb, peak.first / MB
    diff = wordcount.differences(want, wordcount.read_parts([str(part)]))
    row.ok, row.check = (False, diff[0]) if diff else (True, f"{len(want)} distinct words")
    row.note = "2 processes, Counter(text.split()) each, merged, written sorted"
    return row


# --------------------------------------------------------------------------------- tasks


def word_count(args: argparse.Namespace, env: hadoop.Env, rows: list[Row]) -> None:
    path = wordcount.corpus(args.wordcount_mb * args.scale, args.seed).resolve()
    one_corpus("word count", path, args.out / "wordcount", args, env, rows)


def real_text(args: argparse.Namespace, env: hadoop.Env, rows: list[Row]) -> None:
    path = realtext.corpus(args.realtext_mb * args.scale, args.seed).resolve()
    one_corpus("real text", path, args.out / "realtext", args, env, rows)


def one_corpus(
    name: str, path: Path, out: Path, args: argparse.Namespace, env: hadoop.Env, rows: list[Row]
) -> None:
    """Word count of a corpus of a few big files: cmr, the two-process Counter, Hadoop."""
    files = sorted(p for p in path.rglob("*") if p.is_file())
    mb = sum(p.stat().st_size for p in files) / MB
    task = f"{name} {mb:.1f} MB, {len(files)} files"
    want = wordcount.baseline(files)
    rows.append(
        cmr_row(task, WORDCOUNT_JOB, path, out / "cmr", counts_check(want),
                reducers=args.reducers, timeout=args.timeout)
    )  # fmt: skip
    rows.append(counter_row(task, files, out / "counter", want))
    settle()
    ran = hadoop.wordcount(path, out / "hadoop", env, reducers=args.reducers)
    rows.append(hadoop_row(task, ran, "WordCount example, TextInputFormat"))
    hadoop_words(rows[-1], out / "hadoop", tokenizer_total(files))


def small_files(args: argparse.Namespace, env: hadoop.Env, rows: list[Row]) -> None:
    count = max(2, round(args.smallfiles * args.scale))
    _, many = smallfiles.corpora(args.smallfiles_mb * args.scale, count, args.seed)
    many_files("small files", many, args.out / "smallfiles", args, env, rows)


def real_small_files(args: argparse.Namespace, env: hadoop.Env, rows: list[Row]) -> None:
    count = max(2, round(args.realsmallfiles * args.scale))
    many = realtext.small_files(args.realsmallfiles_mb * args.scale, count, args.seed)
    many_files("small files of real text", many, args.out / "realsmallfiles", args, env, rows)


def many_files(
    name: str, many: Path, out: Path, args: argparse.Namespace, env: hadoop.Env, rows: list[Row]
) -> None:
    """Word count of many small files: cmr, the two-process Counter, and Hadoop with a map
    task per file (TextInputFormat) and with files combined into splits."""
    files = sorted(p for p in many.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    task = f"{len(files)} {name}, {total / MB:.1f} MB"
    want = wordcount.baseline(files)
    want_total = tokenizer_total(files)
    rows.append(
        cmr_row(task, WORDCOUNT_JOB, many, out / "cmr", counts_check(want),
                reducers=args.reducers, timeout=args.timeout)
    )  # fmt: skip
    rows.append(counter_row(task, files, out / "counter", want))
    settle()
    ran = hadoop.wordcount(many, out / "hadoop-text", env, reducers=args.reducers)
    rows.append(hadoop_row(task, ran, "WordCount, TextInputFormat (a map task per file)"))
    hadoop_words(rows[-1], out / "hadoop-text", want_total)
    split = args.combine_max_split or max(1 << 20, math.ceil(total / env.workers))
    settle()
    ran = hadoop.wordcount(many, out / "hadoop-combine", env, split, reducers=args.reducers)
    note = f"WordCount, CombineTextInputFormat, max split {split / MB:.1f} MB"
    rows.append(hadoop_row(task, ran, note))
    hadoop_words(rows[-1], out / "hadoop-combine", want_total)


def link_inputs(src: Path, into: Path) -> Path:
    """TeraGen's data files (not its _SUCCESS and .crc files, which cmr would read as
    records) hard-linked into a directory of their own: cmr's input, the same bytes."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for p in sorted(src.glob("part-m-*")):
        try:
            os.link(p, into / p.name)
        except OSError:  # another file system
            shutil.copyfile(p, into / p.name)
    return into


def tera_sort(args: argparse.Namespace, env: hadoop.Env, rows: list[Row]) -> None:
    records = max(1000, round(args.terasort_rows * args.scale))
    task = f"TeraSort {records:,} records ({records * hadoop.RECORD / MB:,.0f} MB)"
    out = args.out / "terasort"
    gen = hadoop.teragen(records, out / "input", env)  # set-up: not a row
    if gen.failure:
        rows.append(Row(task, "both", note=f"not run: TeraGen {gen.failure}"))
        return
    _, _, lines = hadoop.validate_run(out / "input", replace(env, scratch=out / ".check-input"))
    want = hadoop.checksum(lines)

    def verdict(ok: bool, lines: list[str]) -> tuple[bool, str]:
        got = hadoop.checksum(lines)
        if not ok:
            return False, f"TeraValidate: {' | '.join(lines[:3])[:300]}"
        if got != want:
            return False, f"checksum {got} != input's {want}"
        return True, f"TeraValidate ok, checksum {got} = input's"

    if TERASORT_JOB.exists():
        cmr_out = out / "cmr"

        def check(result: cmr.RunResult) -> tuple[bool, str]:
            check_env = replace(env, scratch=out / ".check-cmr")
            return verdict(*hadoop.validate_cmr_output(Path(result.output), check_env))

        cmr_in = link_inputs(out / "input", out / "cmr-input")
        rows.append(
            cmr_row(task, str(TERASORT_JOB), cmr_in, cmr_out, check,
                    reducers=args.reducers, timeout=args.timeout)
        )  # fmt: skip
    else:
        rows.append(Row(task, "cmr embedded", note="not available: examples/terasort.py missing"))
    settle()
    ran = hadoop.terasort(out / "input", out / "hadoop", env, args.reducers)
    rows.append(hadoop_row(task, ran, f"TeraSort example, {args.reducers} reducers"))
    if ran.failure is None:
        check_env = replace(env, scratch=out / ".check-hadoop")
        rows[-1].ok, rows[-1].check = verdict(*hadoop.teravalidate(out / "hadoop", check_env))


TASKS = {
    "wordcount": word_count,
    "smallfiles": small_files,
    "realtext": real_text,
    "realsmallfiles": real_small_files,
    "terasort": tera_sort,
}


# -------------------------------------------------------------------------------- report


def markdown(rows: list[Row]) -> str:
    """The rows as a markdown table; "vs cmr" is a row's seconds over cmr's on its task."""
    cmr_s = {r.task: r.seconds for r in rows if r.run.startswith("cmr") and r.seconds}
    head = "| task | run | seconds | vs cmr | CPU s | peak MB | map tasks | check | note |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---|---|"]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        base = cmr_s.get(r.task)
        ratio = r.seconds / base if r.seconds and base else None
        ok = {None: "", True: "ok: ", False: "FAILED: "}[r.ok]
        lines.append(
            f"| {r.task} | {r.run} | {f(r.seconds, '.2f')} | {f(ratio, '.2f')} | "
            f"{f(r.cpu_s, '.1f')} | {f(r.peak_mb, '.0f')} | {r.maps or '-'} | "
            f"{ok}{r.check} | {r.note} |"
        )
    return "\n".join(lines)


def java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).splitlines()[0] if done.returncode == 0 else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every size")
    ap.add_argument("--only", default=",".join(TASKS), help=f"any of {','.join(TASKS)}")
    ap.add_argument("--wordcount-mb", type=float, default=200)
    ap.add_argument("--smallfiles", type=int, default=20_000, help="number of small files")
    ap.add_argument("--smallfiles-mb", type=float, default=100)
    ap.add_argument("--realtext-mb", type=float, default=200, help="real text (realtext.py)")
    ap.add_argument("--realsmallfiles", type=int, default=4000, help="small files of real text")
    ap.add_argument("--realsmallfiles-mb", type=float, default=80)
    ap.add_argument("--terasort-rows", type=int, default=20_000_000)
    ap.add_argument("--combine-max-split", type=int, help="bytes; default input / workers")
    ap.add_argument("--reducers", type=int, default=4, help="for cmr and Hadoop alike")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Hadoop's tasks")
    ap.add_argument(
        "--hadoop-jvm",
        default="",
        help="JVM options for Hadoop, e.g. '-Xmx1g' (default: the JVM's own heap size, a "
        "quarter of memory, as the hadoop launcher leaves it)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--cmr-shuffle", default="auto", choices=("auto", "queue", "blob"), help="cmr's rows"
    )
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "vs-hadoop")
    ap.add_argument("--json", type=Path, help="e.g. benchmarks/results-vs-hadoop.json")
    args = ap.parse_args()
    CMR["shuffle"] = args.cmr_shuffle
    chosen = [t.strip() for t in args.only.split(",") if t.strip()]
    if unknown := [t for t in chosen if t not in TASKS]:
        ap.error(f"unknown task {', '.join(unknown)}: choose from {', '.join(TASKS)}")
    if why := hadoop.problem():
        print(f"cannot run Hadoop: {why}", file=sys.stderr)
        return 2
    hadoop_install = hadoop.install(on_build=print)  # set-up: not timed
    jvm = tuple(args.hadoop_jvm.split())
    env = hadoop.Env(args.out / ".hadoop-scratch", args.workers, args.timeout, hadoop_install, jvm)

    rows: list[Row] = []
    for name in chosen:
        TASKS[name](args, env, rows)
        print(markdown([r for r in rows if r.task == rows[-1].task]), flush=True)
    print()
    print(markdown(rows))
    if args.json:
        doc: dict[str, Any] = {
            "java": java_version(),
            "hadoop": hadoop.VERSION,
            "hadoop_jars_sha256": hadoop_install.jars_sha256,
            "hadoop_install_s": hadoop_install.seconds,
            "hadoop_workers": args.workers,
            "hadoop_jvm": list(jvm),
            "scale": args.scale,
            "rows": [asdict(r) for r in rows],
        }
        wordcount.write_results(args.json, doc)
    if any(r.ok is False for r in rows):
        return 1
    return 2 if any(r.note.startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
