"""The mistakes a new user makes, and what cmr must answer to each: one table.

Each case is run by ``test_mistakes.py`` as a user would run it: the ``cmr`` command in a
fresh directory, nothing waiting on its behalf. A case names the culprit the answer must
mention (a file, a link, an option, a method), its exit status and a bound on the time to
the answer; the harness also checks that nothing was written to the output or destroyed in
it, and that no traceback but the user's own frames is shown. docs/troubleshooting.md
lists every ``what`` here (a test keeps the two in step).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

WORDS = "a b c\nParis\nb a\n"

# The job most cases run: word count, correct.
GOOD = """\
import cmr

class WordCount(cmr.Job):
    def map(self, key, line):
        for word in line.split():
            yield word, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


def job(
    map_body: str = "for word in line.split():\n            yield word, 1", **methods: str
) -> str:
    """A job file: word count's map (or ``map_body``), and reduce or any other method given
    as ``name="def name(self, ...):\\n        ..."`` source."""
    parts = [
        "import cmr\n\nclass J(cmr.Job):\n",
        f"    def map(self, key, line):\n        {map_body}\n",
    ]
    methods.setdefault("reduce", "def reduce(self, key, values):\n        yield key, sum(values)")
    for source in methods.values():
        if source:
            parts.append(f"    {source}\n")
    return "\n".join(parts)


Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One mistake. ``argv`` follows ``cmr``; ``{job}``, ``{good}``, ``{in}``, ``{out}`` and
    ``{tmp}`` are replaced by the job file, a correct word count, the input, the output and
    the case's directory."""

    id: str
    what: str  # the mistake, as docs/troubleshooting.md lists it
    argv: tuple[str, ...]
    code: int = 1  # the exit status
    names: tuple[str, ...] = ()  # what the error line must mention (the culprit)
    source: str = GOOD  # the job file's text
    setup: Setup | None = None  # makes the input and whatever else the case needs
    seconds: float = 20.0  # the answer comes within this (a bound, not a measurement)
    user_frames: str = ""  # a user-code error: its traceback shows frames of this file only
    expect_lines: tuple[str, ...] | None = None  # a case that succeeds: its output lines
    env: dict[str, str] = field(default_factory=dict)
    needs_stack: bool = False  # runs against the local AWS stack
    keep_output: bool = False  # an earlier run's output is in place and must survive
    before: tuple[str, ...] = ()  # a command run first (it must succeed), e.g. a good run
    cwd: str = ""  # where the command runs, under the case's directory


RUN = ("run", "{job}", "--input", "{in}", "--output", "{out}")
GOOD_RUN = ("run", "{good}", "--input", "{in}", "--output", "{out}")  # an earlier, good run


def words(tmp: Path) -> None:
    (tmp / "in").mkdir()
    (tmp / "in" / "words.txt").write_text(WORDS)


def _with(*steps: Setup) -> Setup:
    def setup(tmp: Path) -> None:
        for step in steps:
            step(tmp)

    return setup


def link(name: str, target: str) -> Setup:
    def setup(tmp: Path) -> None:
        os.symlink(target, tmp / "in" / name)

    return setup


def subdir(tmp: Path) -> None:
    (tmp / "in" / "d").mkdir()
    (tmp / "in" / "d" / "more.txt").write_text("c d\n")


def fifo(name: str) -> Setup:
    def setup(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return setup


def file_at(name: str, text: str = "x\n") -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    return setup


def bad_name(tmp: Path) -> None:
    (tmp / "in" / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")


def crlf(tmp: Path) -> None:
    (tmp / "in").mkdir()
    (tmp / "in" / "win.txt").write_bytes(b"Paris London\r\nParis\r\nold\rmac\r\n")


def closed_port() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


NO_REDUCE = job(reduce="")
CASES: list[Case] = [
    # ---------------------------------------------------------------- the input
    Case("input-missing", "the input does not exist", RUN, names=("{in}",)),
    Case(
        "input-empty-dir",
        "the input directory holds no files",
        RUN,
        names=("{in}",),
        setup=lambda t: (t / "in").mkdir(),
    ),
    Case(
        "input-link-out",
        "a symbolic link in the input points outside it",
        RUN,
        names=("outside",),
        setup=_with(words, file_at("elsewhere/x.txt"), link("out", "../elsewhere")),
    ),
    Case(
        "input-link-dangling",
        "a symbolic link in the input points nowhere",
        RUN,
        names=("dangling",),
        setup=_with(words, link("dangling", "nowhere.txt")),
    ),
    Case(
        "input-link-loop",
        "a symbolic link in the input leads back to where it is (a loop)",
        RUN,
        names=("up",),
        setup=_with(words, subdir, lambda t: os.symlink("..", t / "in" / "d" / "up")),
    ),
    Case(
        "input-link-dir",
        "a symbolic link to a directory inside the input (followed, not skipped)",
        RUN,
        code=0,
        setup=_with(words, subdir, link("alias", "d")),
        expect_lines=("Paris\t1", "a\t2", "b\t2", "c\t3", "d\t2"),
    ),
    Case(
        "input-name-not-utf8",
        "an input file whose name is not UTF-8",
        RUN,
        names=("caf",),
        setup=_with(words, bad_name),
    ),
    Case(
        "input-fifo",
        "a named pipe (or other special file) in the input",
        RUN,
        names=("pipe",),
        setup=_with(words, lambda t: os.mkfifo(t / "in" / "pipe")),
    ),
    Case(
        "input-is-fifo",
        "the input itself is a named pipe",
        ("run", "{job}", "--input", "{tmp}/pipe", "--output", "{out}"),
        names=("pipe",),
        setup=fifo("pipe"),
    ),
    Case(
        "input-s3-embedded",
        "an s3:// input with the embedded backend",
        ("run", "{job}", "--input", "s3://bucket/in/", "--output", "{out}"),
        names=("s3://",),
    ),
    Case(
        "input-crlf",
        "Windows (CRLF) input: --lines universal",
        (*RUN, "--lines", "universal"),
        code=0,
        setup=crlf,
        expect_lines=("London\t1", "Paris\t2", "mac\t1", "old\t1"),
    ),
    Case(
        "input-unicode-name",
        "an input name with spaces and accents reaches map exactly",
        RUN,
        code=0,
        source=job("yield key, 1"),
        setup=file_at("in/fïlé with space.txt", "x\ny\n"),
        expect_lines=("fïlé with space.txt\t2",),
    ),
    # ---------------------------------------------------------------- the output
    Case(
        "output-dev-null",
        "the output is /dev/null",
        ("run", "{job}", "--input", "{in}", "--output", "/dev/null"),
        names=("/dev/null",),
        setup=words,
    ),
    Case(
        "output-under-file",
        "the output lies under a regular file",
        ("run", "{job}", "--input", "{in}", "--output", "{tmp}/afile/out"),
        names=("afile",),
        setup=_with(words, file_at("afile")),
    ),
    Case(
        "output-is-file",
        "the output is a regular file",
        ("run", "{job}", "--input", "{in}", "--output", "{tmp}/afile"),
        names=("afile",),
        setup=_with(words, file_at("afile")),
    ),
    Case(
        "output-inside-input",
        "the output lies inside the input",
        ("run", "{job}", "--input", "{in}", "--output", "{in}/out"),
        names=("inside",),
        setup=words,
    ),
    Case(
        "input-inside-output",
        "the input lies inside the output",
        ("run", "{job}", "--input", "{in}", "--output", "{tmp}"),
        names=("inside",),
        setup=words,
    ),
    Case(
        "output-is-input",
        "the output is the input",
        ("run", "{job}", "--input", "{in}", "--output", "{in}"),
        names=("{in}",),
        setup=words,
    ),
    Case(
        "output-not-empty",
        "the output already holds an earlier run's output",
        RUN,
        names=("--overwrite",),
        setup=words,
        keep_output=True,
        before=GOOD_RUN,
    ),
    Case(
        "output-s3-embedded",
        "an s3:// output with the embedded backend",
        ("run", "{job}", "--input", "{in}", "--output", "s3://bucket/out/"),
        names=("s3://",),
        setup=words,
    ),
    Case(
        "overwrite-failed-run",
        "--overwrite with a job that fails keeps the earlier output",
        (*RUN, "--overwrite"),
        names=("boom",),
        source=job(reduce="def reduce(self, key, values):\n        raise ValueError('boom')"),
        setup=words,
        keep_output=True,
        before=GOOD_RUN,
        user_frames="job.py",
    ),
    # ---------------------------------------------------------------- the job file
    Case("job-missing", "the job file does not exist", RUN, names=("job.py",), source=""),
    Case(
        "job-syntax",
        "the job file has a syntax error",
        RUN,
        names=("job.py", "line 3"),
        source="import cmr\nclass J(cmr.Job):\n    def map(self, k, v)\n",
        setup=words,
    ),
    Case(
        "job-import-error",
        "the job file imports a module that is not installed",
        RUN,
        names=("no_such_module_xyz",),
        source="import no_such_module_xyz\n" + GOOD,
        setup=words,
    ),
    Case(
        "job-no-class",
        "the job file defines no cmr.Job subclass",
        RUN,
        names=("job.py", "Job"),
        source="x = 1\n",
        setup=words,
    ),
    Case(
        "job-two-classes",
        "the job file defines two Job classes",
        RUN,
        names=("WordCount", "Other"),
        source=GOOD + "\nclass Other(WordCount):\n    pass\n",
        setup=words,
    ),
    Case(
        "job-class-missing",
        "JOB.py:Class names a class the file does not define",
        ("run", "{job}:Nope", "--input", "{in}", "--output", "{out}"),
        names=("Nope",),
        setup=words,
    ),
    Case(
        "job-no-reduce",
        "the job class defines no reduce()",
        RUN,
        names=("reduce",),
        source=NO_REDUCE,
        setup=words,
        seconds=10,
    ),
    Case(
        "job-no-map",
        "the job class defines no map()",
        RUN,
        names=("map",),
        source="import cmr\n\nclass J(cmr.Job):\n"
        "    def reduce(self, key, values):\n        yield key, 1\n",
        setup=words,
        seconds=10,
    ),
    Case(
        "job-module-missing",
        "a job module name that cannot be found",
        ("run", "no_such_pkg_xyz.jobs", "--input", "{in}", "--output", "{out}"),
        names=("no_such_pkg_xyz",),
        setup=words,
    ),
    Case(
        "job-is-directory",
        "the job file is a directory",
        ("run", "{tmp}/jobdir.py", "--input", "{in}", "--output", "{out}"),
        names=("jobdir.py",),
        setup=_with(words, lambda t: (t / "jobdir.py").mkdir()),
    ),
    Case(
        "job-setup-raises",
        "setup() raises",
        RUN,
        names=("setup", "KeyError"),
        source=job(setup="def setup(self):\n        self.x = self.params['needed']"),
        setup=words,
        user_frames="job.py",
    ),
    # ---------------------------------------------------------------- what user code yields
    Case(
        "map-yields-str",
        "map yields a 2-character string instead of a pair",
        RUN,
        names=("map", "'ab'", "pair"),
        source=job("yield 'ab'"),
        setup=words,
    ),
    Case(
        "map-yields-long-str",
        "map yields a string instead of a pair",
        RUN,
        names=("map", "pair"),
        source=job("yield line"),
        setup=words,
    ),
    Case(
        "map-yields-triple",
        "map yields a 3-tuple",
        RUN,
        names=("map", "pair"),
        source=job("yield line, 1, 2"),
        setup=words,
    ),
    Case(
        "map-yields-int",
        "map yields a number instead of a pair",
        RUN,
        names=("map", "pair"),
        source=job("yield 5"),
        setup=words,
    ),
    Case(
        "map-returns-none",
        "map returns nothing (no yield)",
        RUN,
        names=("map", "None"),
        source=job("line.split()"),
        setup=words,
    ),
    Case(
        "map-yields-object",
        "map yields a value that is not wire data (an object)",
        RUN,
        names=("map", "object"),
        source=job("yield line, object()"),
        setup=words,
    ),
    Case(
        "map-yields-set",
        "map yields a set as a value",
        RUN,
        names=("map", "set"),
        source=job("yield line, {1, 2}"),
        setup=words,
    ),
    Case(
        "map-dict-key",
        "map yields a dict as a key",
        RUN,
        names=("map", "dict"),
        source=job("yield {'w': line}, 1"),
        setup=words,
    ),
    Case(
        "map-raises",
        "map raises",
        RUN,
        names=("map", "ZeroDivisionError"),
        source=job("yield line, 1 / 0"),
        setup=words,
        user_frames="job.py",
    ),
    Case(
        "reduce-raises",
        "reduce raises (fails in seconds, not one lease per attempt)",
        RUN,
        names=("reduce", "ValueError", "boom"),
        source=job(reduce="def reduce(self, key, values):\n        raise ValueError('boom')"),
        setup=words,
        user_frames="job.py",
        seconds=20,
    ),
    Case(
        "reduce-yields-set",
        "reduce yields a set, which the output cannot show faithfully",
        RUN,
        names=("reduce", "set"),
        source=job(reduce="def reduce(self, key, values):\n        yield key, set(values)"),
        setup=words,
    ),
    Case(
        "reduce-yields-str",
        "reduce yields a string instead of a pair",
        RUN,
        names=("reduce", "pair"),
        source=job(reduce="def reduce(self, key, values):\n        yield 'xyz'"),
        setup=words,
    ),
    Case(
        "combine-raises",
        "combine raises",
        RUN,
        names=("combine", "RuntimeError"),
        source=job(
            combine="def combine(self, key, values):\n        raise RuntimeError('no')",
            map_body="for word in (line.split() * 3):\n            yield word, 1",
        ),
        setup=words,
        user_frames="job.py",
    ),
    Case(
        "partition-out-of-range",
        "partition() returns a number out of range",
        RUN,
        names=("partition", "9"),
        source=job(partition="def partition(self, key, n):\n        return n + 5"),
        setup=words,
    ),
    Case(
        "partition-not-int",
        "partition() returns something other than an int",
        RUN,
        names=("partition", "str"),
        source=job(partition="def partition(self, key, n):\n        return 'x'"),
        setup=words,
    ),
    Case(
        "format-not-str",
        "format() returns something other than a string",
        RUN,
        names=("format",),
        source=job(format="def format(self, key, value):\n        return 5"),
        setup=words,
    ),
    Case(
        "list-keys-combiner",
        "list keys with a combiner (they work; lists arrive as tuples)",
        RUN,
        code=0,
        source=job(
            "for word in line.split():\n            yield [word, len(word)], 1",
            combine="def combine(self, key, values):\n        yield key, sum(values)",
        ),
        setup=words,
        expect_lines=('["Paris", 5]\t1', '["a", 1]\t2', '["b", 1]\t2', '["c", 1]\t1'),
    ),
    Case(
        "tuple-keys-order",
        "tuple keys sort naturally within a part (element by element)",
        ("run", "{job}", "--input", "{in}", "--output", "{out}", "--reducers", "1"),
        code=0,
        source=job("for n in (10, 9, 2, 100):\n            yield (line, n), n"),
        setup=file_at("in/one.txt", "x\n"),
        expect_lines=('["x", 2]\t2', '["x", 9]\t9', '["x", 10]\t10', '["x", 100]\t100'),
    ),
    Case(
        "namedtuple-pairs",
        "map yields namedtuple pairs (they work: a 2-tuple is a pair)",
        RUN,
        code=0,
        source="from collections import namedtuple\n\nP = namedtuple('P', 'key value')\n"
        + job("for word in line.split():\n            yield P(word, 1)"),
        setup=words,
        expect_lines=("Paris\t1", "a\t2", "b\t2", "c\t1"),
    ),
    Case(
        "partition-int-like",
        "partition() returns an int-like (numpy's integers work)",
        RUN,
        code=0,
        source=job(
            partition="def partition(self, key, n):\n        class I:\n"
            "            def __index__(self):\n                return len(key) % n\n"
            "        return I()"
        ),
        setup=words,
        expect_lines=("Paris\t1", "a\t2", "b\t2", "c\t1"),
    ),
    Case(
        "combine-returns-value",
        "combine returns a value instead of yielding pairs",
        RUN,
        names=("combine", "returned"),
        source=job(
            combine="def combine(self, key, values):\n        return sum(values)",
            map_body="for word in (line.split() * 3):\n            yield word, 1",
        ),
        setup=words,
    ),
    Case(
        "reduce-bytes-not-utf8",
        "reduce yields bytes that are not UTF-8 (the output would garble them)",
        RUN,
        names=("reduce", "bytes", "utf-8"),
        source=job("yield b'\\xff' + line.encode(), 1"),
        setup=words,
    ),
    Case(
        "job-reducers-attribute",
        "the job class sets reducers to something other than an int",
        RUN,
        names=("J.reducers",),
        source=job(reducers='reducers = "4"'),
        setup=words,
    ),
    Case(
        "job-init-no-params",
        "the job class's __init__ takes no params",
        RUN,
        names=("J.__init__",),
        source=job(init="def __init__(self):\n        super().__init__()"),
        setup=words,
    ),
    Case(
        "relative-dotdot",
        "input and output given with .. (relative paths work)",
        ("run", "../job.py", "--input", "../in", "--output", "../out"),
        code=0,
        setup=_with(words, lambda t: (t / "sub").mkdir()),
        cwd="sub",
        expect_lines=("Paris\t1", "a\t2", "b\t2", "c\t1"),
    ),
    # ---------------------------------------------------------------- options
    Case(
        "reducers-zero",
        "--reducers 0",
        (*RUN, "--reducers", "0"),
        names=("--reducers",),
        setup=words,
    ),
    Case(
        "reducers-huge",
        "--reducers 100000",
        (*RUN, "--reducers", "100000"),
        names=("--reducers",),
        setup=words,
    ),
    Case(
        "reducers-not-int",
        "--reducers abc",
        (*RUN, "--reducers", "abc"),
        code=2,
        names=("--reducers",),
        setup=words,
    ),
    Case(
        "memory-negative",
        "--memory-mb -5",
        (*RUN, "--memory-mb", "-5"),
        names=("--memory-mb",),
        setup=words,
    ),
    Case(
        "memory-huge",
        "--memory-mb larger than any machine",
        (*RUN, "--memory-mb", "99999999"),
        names=("--memory-mb",),
        setup=words,
    ),
    Case(
        "visibility-zero",
        "--visibility-timeout 0",
        (*RUN, "--visibility-timeout", "0"),
        names=("--visibility-timeout",),
        setup=words,
    ),
    Case(
        "visibility-huge",
        "--visibility-timeout past SQS's 12 hours",
        (*RUN, "--visibility-timeout", "99999"),
        names=("--visibility-timeout",),
        setup=words,
    ),
    Case(
        "task-timeout-negative",
        "--task-timeout -1",
        (*RUN, "--task-timeout", "-1"),
        names=("--task-timeout",),
        setup=words,
    ),
    Case(
        "attempts-zero",
        "--max-task-attempts 0",
        (*RUN, "--max-task-attempts", "0"),
        names=("--max-task-attempts",),
        setup=words,
    ),
    Case(
        "workers-negative",
        "--workers -1",
        (*RUN, "--workers", "-1"),
        names=("--workers",),
        setup=words,
    ),
    Case(
        "workers-zero-embedded",
        "--workers 0 with the embedded backend (nobody could serve the job)",
        (*RUN, "--workers", "0"),
        names=("--workers",),
        setup=words,
    ),
    Case(
        "param-no-equals",
        "--param without KEY=VALUE",
        (*RUN, "--param", "foo"),
        code=2,
        names=("--param", "foo"),
        setup=words,
    ),
    Case(
        "param-empty-key",
        "--param =value",
        (*RUN, "--param", "=x"),
        code=2,
        names=("--param",),
        setup=words,
    ),
    Case(
        "missing-input",
        "no --input",
        ("run", "{job}", "--output", "{out}"),
        code=2,
        names=("--input",),
        setup=words,
    ),
    Case(
        "missing-output",
        "no --output",
        ("run", "{job}", "--input", "{in}"),
        code=2,
        names=("--output",),
        setup=words,
    ),
    Case(
        "unknown-option",
        "an option cmr does not have",
        (*RUN, "--frobnicate"),
        code=2,
        names=("--frobnicate",),
        setup=words,
    ),
    Case(
        "unknown-command",
        "a command cmr does not have",
        ("runn", "{job}"),
        code=2,
        names=("runn",),
    ),
    Case(
        "output-empty-string",
        "--output given as an empty string",
        ("run", "{job}", "--input", "{in}", "--output", ""),
        names=("--output",),
        setup=words,
    ),
    Case(
        "bad-store",
        "--store with a scheme cmr does not know",
        (*RUN, "--store", "bogus://x"),
        names=("bogus://x",),
        setup=words,
    ),
    Case(
        "bad-store-env",
        "$CMR_STORE set to something cmr cannot read",
        RUN,
        names=("CMR_STORE",),
        setup=words,
        env={"CMR_STORE": "nope://"},
    ),
    Case(
        "bad-lines",
        "--lines with a value cmr does not know",
        (*RUN, "--lines", "dos"),
        names=("--lines", "dos"),
        setup=words,
    ),
    Case(
        "bad-input-format",
        "--input-format with a format cmr does not know",
        (*RUN, "--input-format", "parquet"),
        names=("--input-format", "parquet", "jsonlines", "fixed:<record_len>:<key_len>"),
        setup=words,
    ),
    Case(
        "bad-output-format",
        "--output-format with a format cmr does not know",
        (*RUN, "--output-format", "xml"),
        names=("--output-format", "xml", "raw"),
        setup=words,
    ),
    Case(
        "fixed-size-mismatch",
        "--input-format fixed:R:K and a file that is not whole records",
        (*RUN, "--input-format", "fixed:5:1"),
        names=("words.txt", "16 bytes", "5-byte records"),
        setup=words,
    ),
    # ---------------------------------------------------------------- stores and jobs
    Case(
        "status-after-embedded",
        "`cmr status` right after an embedded run (no credentials asked for)",
        ("status",),
        code=0,
        names=("embedded",),
        setup=words,
        before=GOOD_RUN,
    ),
    Case(
        "wait-embedded",
        "`cmr wait` on the embedded backend, which keeps no jobs",
        ("wait", "20990101-000000-0000000000000000", "--store", "embedded"),
        names=("embedded", "--store aws"),
    ),
    Case(
        "aws-unreachable",
        "--store aws with an endpoint nothing answers",
        (*RUN, "--store", "aws"),
        names=("127.0.0.1",),
        setup=words,
        env={
            "AWS_ENDPOINT_URL": "{closed}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    ),
    Case(
        "aws-no-credentials",
        "--store aws with no credentials",
        (*RUN, "--store", "aws"),
        names=("credentials",),
        setup=words,
        env={"AWS_DEFAULT_REGION": "us-east-1"},
    ),
    Case(
        "status-missing-bucket",
        "`cmr status` on a bucket that does not exist",
        ("status", "--store", "aws://cmr-usage-no-such-bucket/cmr-usage-no-such-table"),
        names=("cmr-usage-no-such-bucket",),
        needs_stack=True,
    ),
    Case(
        "run-output-bucket-missing",
        "`cmr run` with its output in a bucket that does not exist",
        (*RUN[:-1], "s3://cmr-usage-no-such-bucket/out", "--store", "aws"),
        names=("s3://cmr-usage-no-such-bucket/out", "bucket does not exist", "create it"),
        setup=words,
        needs_stack=True,
    ),
    # ---------------------------------------------------------------- side files
    Case(
        "side-file-missing",
        "--file names a file that does not exist",
        (*RUN, "--file", "{tmp}/nope.txt"),
        names=("nope.txt", "--file", "does not exist"),
        setup=words,
    ),
    Case(
        "side-file-dir",
        "--file names a directory",
        (*RUN, "--file", "{tmp}/in"),
        names=("in", "directory"),
        setup=words,
    ),
    Case(
        "side-file-same-name",
        "two side files with the same name",
        (*RUN, "--file", "{tmp}/a/stop.txt", "--file", "{tmp}/b/stop.txt"),
        names=("stop.txt", "#NAME"),
        setup=_with(words, file_at("a/stop.txt"), file_at("b/stop.txt")),
    ),
    Case(
        "side-file-bad-name",
        "--file PATH#NAME with a / in NAME",
        (*RUN, "--file", "{tmp}/stop.txt#sub/stop.txt"),
        names=("sub/stop.txt", "plain file name"),
        setup=_with(words, file_at("stop.txt")),
    ),
    Case(
        "side-file-class-missing",
        "the job class's files lists a file that does not exist",
        RUN,
        names=("J.files", "stop.txt"),
        source=job(files='files = ["stop.txt"]'),
        setup=words,
    ),
    Case(
        "side-file-unknown-name",
        "self.file() with a name the job did not ship",
        RUN,
        names=("J.file('nope.txt')", "stop.txt"),
        source=job(
            files='files = ["stop.txt"]',
            setup="def setup(self):\n        open(self.file('nope.txt'))",
        ),
        setup=_with(words, file_at("stop.txt")),
        user_frames="job.py",
    ),
]


def _topics() -> list[Case]:
    """The cases of ``cases_<topic>.py`` beside this file (each a ``CASES`` list of its
    own): one table, as if written here."""
    import importlib
    import pkgutil

    found: list[Case] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name.startswith("cases_"):
            found += importlib.import_module(f"tests.usage.{info.name}").CASES
    return found


CASES += _topics()
