"""mrjob 0.7.4's own examples (``mrjob/examples/``), unmodified, on cmr: each that needs
neither Hadoop, shell commands nor Spark runs with mrjob's inline runner (in the pinned venv
of the benchmarks' mrjob peer, benchmarks/peers/mrjob.txt) and with ``cmr run`` on the
embedded backend and on the local stack; the outputs are equal as multisets of lines.
The others are refused by ``cmr run`` with one line saying why. EXAMPLES.md lists them all.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.base import Backend
from cmr.settings import AwsSettings
from tests.everyday import spread

# benchmarks/peers.py, imported by name: mypy would take benchmarks/peers/ (the runners'
# directory) for it.
peers: Any = importlib.import_module("benchmarks.peers")
DATA = Path(__file__).parent / "data"
PEER = peers.PEERS["mrjob-inline"]  # the pinned venv the benchmarks' mrjob peer runs in
EXAMPLES = PEER.venv / "lib" / "python3.11" / "site-packages" / "mrjob" / "examples"


@dataclass(frozen=True)
class Case:
    example: str
    inputs: tuple[str, ...] = ("leaves.txt", "perfumes.txt")  # in DATA, or examples' dir
    args: tuple[str, ...] = ()  # the job's own (after `cmr run ... --`)
    ident: str = ""
    # Its values compared as JSON data, not as text: dict order ignored, floats to 1e-9.
    as_data: bool = False

    @property
    def id(self) -> str:
        return self.ident or self.example


CASES = [
    Case("mr_word_freq_count"),
    Case("mr_wc"),
    Case("mr_count_lines_right"),
    # Its output is one count per map task, by design ("what mapper_final doesn't do"), and
    # mrjob's inline runner splits even a small file in two or more: one line, one task.
    Case("mr_count_lines_wrong", ("one_line.txt",)),
    Case("mr_count_lines_by_file"),  # jobconf_from_env('mapreduce.map.input.file')
    Case("mr_most_used_word"),  # two steps, FILES = ['stop_words.txt'], JSONValueProtocol
    Case(
        "mr_most_used_word",
        args=("--stop-words-file", str(DATA / "stop_words_small.txt")),
        ident="mr_most_used_word-file-arg",  # add_file_arg
    ),
    Case("mr_next_word_stats"),  # SORT_VALUES, two steps
    # mapper_raw (whole files), four steps, add_passthru_arg, increment_counter. Its text is
    # not a function of its input, so it is compared as data (EXAMPLES.md): each score dict's
    # key order is a set's iteration order (str hashes: mrjob's inline runner differs from
    # itself under another PYTHONHASHSEED), and each document's scores are float sums in
    # the order its values arrive, which Hadoop leaves undefined (the inline runner's is
    # its map tasks' output order; cmr's, the shuffle's).
    Case("mr_text_classifier", ("docs-to-classify",), args=("--min-df", "1"), as_data=True),
    # mapper_raw reading WARC records with warcio (Common Crawl's WET files), two steps:
    # one plain file and one gzipped per record, as Common Crawl ships them (both runners
    # decompress it into one split for mapper_raw). Made by warcio's WARCWriter.
    Case("mr_phone_to_url", ("phones.wet", "phones2.wet.gz")),
]


def inputs_dir(case: Case, tmp: Path) -> Path:
    """The case's input files, copied into one directory (cmr's --input; mrjob is given
    each file's absolute path, so both see the same file names and URIs)."""
    root = tmp / "in" / case.id
    if root.exists():
        return root
    root.mkdir(parents=True)
    for name in case.inputs:
        src = DATA / name if (DATA / name).exists() else EXAMPLES / name
        if src.is_dir():
            for f in sorted(src.iterdir()):
                shutil.copy(f, root / f.name)
        else:
            shutil.copy(src, root / name)
    return root


@dataclass
class Inline:
    """What mrjob's inline runner gave, once per case per session, and the one copy of each
    case's inputs that every run reads (the input file's URI is part of some outputs)."""

    tmp: Path
    outputs: dict[str, Counter[str]] = field(default_factory=dict)


@pytest.fixture(scope="session")
def mrjob_python() -> Path:
    problem, _ = peers.ensure_venv(PEER)
    assert problem is None, problem
    python: Path = PEER.python
    return python


@pytest.fixture(scope="session")
def inline(tmp_path_factory: pytest.TempPathFactory) -> Inline:
    return Inline(tmp_path_factory.mktemp("mrjob-examples"))


def lines(text: str) -> Counter[str]:
    return Counter(text.splitlines())


def inline_output(case: Case, python: Path, cache: Inline, tmp: Path) -> Counter[str]:
    if case.id not in cache.outputs:
        root = inputs_dir(case, cache.tmp)
        done = subprocess.run(
            [
                str(python),
                str(EXAMPLES / f"{case.example}.py"),
                "-r",
                "inline",
                "--no-conf",
                *case.args,
                *(str(p) for p in sorted(root.iterdir())),
            ],
            capture_output=True,
            text=True,
            cwd=tmp,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        cache.outputs[case.id] = lines(done.stdout)
    return cache.outputs[case.id]


def cmr_run(case: Case, root: Path, out: Path, *store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cmr",
            "run",
            str(EXAMPLES / f"{case.example}.py"),
            "--input",
            str(root),
            "--output",
            str(out),
            *store,
            "--",
            *case.args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def close(a: Any, b: Any) -> bool:
    """Equal as JSON data, floats to a relative 1e-9 (a sum's order moves its last bits)."""
    if float in (type(a), type(b)) and {type(a), type(b)} <= {int, float}:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def same_data(got: Counter[str], expected: Counter[str]) -> None:
    """``got`` and ``expected`` hold the same keys (exact text), each with values that are
    ``close`` as JSON data, matched one for one."""

    def by_key(found: Counter[str]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for line, n in found.items():
            key, _, value = line.partition("\t")
            out.setdefault(key, []).extend([json.loads(value)] * n)
        return out

    mine, theirs = by_key(got), by_key(expected)
    assert mine.keys() == theirs.keys(), sorted(mine.keys() ^ theirs.keys())[:5]
    for key, values in theirs.items():
        left = list(mine[key])
        for value in values:
            match = next((i for i, v in enumerate(left) if close(v, value)), None)
            assert match is not None, (key, value, left)
            del left[match]
        assert not left, (key, left)


def assert_same(case: Case, got: Counter[str], expected: Counter[str]) -> None:
    if case.as_data:
        same_data(got, expected)
    else:
        assert got == expected


def parts(out: Path) -> Counter[str]:
    found: Counter[str] = Counter()
    for p in sorted(out.glob("part-*")):
        found += lines(p.read_text())
    return found


@pytest.mark.parametrize("case", spread(CASES, lambda c: c.id, every=10))  # everyday: one
def test_example_on_embedded_equals_inline(
    case: Case, mrjob_python: Path, inline: Inline, tmp_path: Path
) -> None:
    expected = inline_output(case, mrjob_python, inline, tmp_path)
    root = inputs_dir(case, inline.tmp)
    done = cmr_run(case, root, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same(case, parts(tmp_path / "out"), expected)
    assert expected  # every case has output


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.parametrize("shuffle", ["queue", "blob"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.slow
def test_example_on_local_stack_equals_inline(
    case: Case,
    shuffle: str,
    mrjob_python: Path,
    inline: Inline,
    aws: tuple[Backend, AwsSettings],
    tmp_path: Path,
) -> None:
    """mrjob's own examples on the local stack, their map output through queues and
    through the blob store (its pages, its objects), against mrjob's inline runner."""
    _, s = aws
    expected = inline_output(case, mrjob_python, inline, tmp_path)
    root = inputs_dir(case, inline.tmp)
    store = ["--backend", "aws", "--bucket", s.bucket, "--table", s.table]
    done = cmr_run(
        case, root, tmp_path / "out", *store, "--queue-prefix", s.queue_prefix,
        "--shuffle", shuffle,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same(case, parts(tmp_path / "out"), expected)


@pytest.mark.slow
def test_a_failing_job_fails_on_both(mrjob_python: Path, tmp_path: Path) -> None:
    """mr_boom: mapper_init raises; mrjob fails, and so does cmr, naming it."""
    case = Case("mr_boom")
    root = inputs_dir(case, tmp_path)
    script = str(EXAMPLES / "mr_boom.py")
    done = subprocess.run(
        [str(mrjob_python), script, "-r", "inline", "--no-conf", *map(str, root.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "Exception: BOOM" in done.stderr
    ran = cmr_run(case, root, tmp_path / "out")
    assert ran.returncode != 0
    assert "MRBoom.mapper_init raised Exception: BOOM" in ran.stderr


REFUSED = [
    ("mr_log_sampler", ("--sample-size", "3"), "MRLogSampler uses ReprProtocol for step 1's"),
    ("mr_grep", ("-e", "atom"), "MRGrepJob step 1 uses mapper_cmd (a shell command): that needs"),
    (
        "mr_words_containing_u_freq_count",
        (),
        "MRWordsContainingUFreqCount step 1 uses mapper_pre_filter (a shell command)",
    ),
    ("mr_jar_step_example", (), "MRJarStepExample step 1 is a JarStep: that needs Hadoop"),
    ("mr_spark_wordcount", (), "MRSparkWordcount step 1 is a SparkStep: that needs Spark"),
    ("mr_spark_most_used_word", (), "MRSparkMostUsedWord step 1 is a SparkStep: that needs Spark"),
    ("mr_sparkaboom", (), "MRSparKaboom step 1 is a SparkStep: that needs Spark"),
    (
        "mr_spark_wordcount_script",
        (),
        "MRSparkScriptWordcount step 1 is a SparkScriptStep: that needs Spark",
    ),
    ("mr_nick_nack", (), "MRNickNack sets HADOOP_OUTPUT_FORMAT"),
    ("mr_nick_nack_input_format", (), "MRNickNackWithHadoopInputFormat sets HADOOP_INPUT_FORMAT"),
]


@pytest.mark.usefixtures("mrjob_python")  # the examples are files of mrjob's venv
@pytest.mark.parametrize(
    ("example", "args", "message"), spread(REFUSED, [r[0] for r in REFUSED], 5)
)
def test_what_needs_hadoop_spark_or_eval_is_refused(
    example: str, args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    case = Case(example, args=args)
    root = inputs_dir(case, tmp_path)
    done = cmr_run(case, root, tmp_path / "out")
    assert done.returncode != 0
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
    assert not (tmp_path / "out").exists()


PICKLE_JOB = """
from mrjob.job import MRJob
from mrjob.protocol import PickleProtocol


class MRPickled(MRJob):
    INTERNAL_PROTOCOL = PickleProtocol

    def mapper(self, _, line):
        yield line, 1

    def reducer(self, key, ones):
        yield key, sum(ones)
"""


def test_pickle_protocol_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "pickled.py"
    job.write_text(PICKLE_JOB)
    (tmp_path / "in.txt").write_text("a\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cmr",
            "run",
            str(job),
            "-i",
            str(tmp_path / "in.txt"),
            "-o",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "MRPickled uses PickleProtocol for step 1's mapper: it evaluates" in done.stderr
    assert "data, never code, on the wire" in done.stderr


def test_args_after_dashes_are_refused_for_a_cmr_job(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cmr",
            "run",
            "examples/wordcount.py",
            "-i",
            str(tmp_path / "in.txt"),
            "-o",
            str(tmp_path / "out"),
            "--",
            "--min",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "arguments after -- (--min 3) are for mrjob jobs" in done.stderr
    assert "give it --param KEY=VALUE" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-r", "local"), "-r is an option of mrjob's runners, not of the job"),
        (("--max-ngram-size", "x"), "argument --max-ngram-size: invalid int value: 'x'"),
    ],
)
@pytest.mark.usefixtures("mrjob_python")
def test_bad_job_arguments_are_named(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    case = Case("mr_text_classifier", ("docs-to-classify",), args=args)
    done = cmr_run(case, inputs_dir(case, tmp_path), tmp_path / "out")
    assert done.returncode != 0
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ------------------------------------------------------------- an instance lives for one task

JOBS = Path(__file__).parent / "jobs"


@pytest.fixture(scope="session")
def many_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """13 MB of the examples' text lines in 40 files: with --memory-mb 32 (4 MiB splits),
    four map tasks and four reduce tasks for one worker's two pool processes."""
    import random

    text = "".join((DATA / n).read_text() for n in ("leaves.txt", "perfumes.txt"))
    source = text.splitlines()
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("many-tasks")
    for i in range(40):
        lines = [rng.choice(source) for _ in range(6000)]
        (root / f"part{i:02}.txt").write_text("\n".join(lines) + "\n")
    return root


def run_many(job: Path, root: Path, out: Path) -> Counter[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cmr", "run", str(job), "-i", str(root), "-o", str(out),
         "--memory-mb", "32", "--reducers", "4"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return parts(out)


@pytest.mark.slow
def test_mr_wc_counts_each_line_once_when_a_process_runs_several_tasks(
    mrjob_python: Path, many_tasks: Path, tmp_path: Path
) -> None:
    """mrjob's mr_wc keeps its counts on self from __init__ and yields them in mapper_final.
    A worker process that kept one instance for all its map tasks yielded the earlier tasks'
    counts again (lines 600,137 instead of 240,000 here); mrjob's inline runner is the
    oracle."""
    case = Case("mr_wc")
    done = subprocess.run(
        [str(mrjob_python), str(EXAMPLES / "mr_wc.py"), "-r", "inline", "--no-conf",
         *(str(p) for p in sorted(many_tasks.iterdir()))],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    expected = lines(done.stdout)
    assert expected['"lines"\t240000'] == 1
    assert_same(case, run_many(EXAMPLES / "mr_wc.py", many_tasks, tmp_path / "out"), expected)


@pytest.mark.slow
def test_every_task_gets_a_fresh_instance(many_tasks: Path, tmp_path: Path) -> None:
    got: dict[str, list[Any]] = {}
    for line in run_many(JOBS / "mr_task_state.py", many_tasks, tmp_path / "out").elements():
        key, _, value = line.partition("\t")
        got.setdefault(json.loads(key), []).append(json.loads(value))
    pids = got["map_task_in_process"][0]
    # The test means something only if some process ran two map tasks.
    assert len(pids) > len(set(pids)), pids
    assert sum(got["lines_by_task"][0]) == 240_000  # each map task counted its own lines
    # words, lines_by_task, map_task_in_process: reduced once each, whatever the process
    assert sum(got["keys_by_reduce_task"]) == 3
    assert len(got["keys_by_reduce_task"]) == 4  # one line per reduce task
    assert "combiner_saw_the_mappers_instance" not in got
