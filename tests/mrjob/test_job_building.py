"""mrjob jobs of ``jobs/`` that use what mrjob's own examples leave out, on cmr and (where
mrjob runs them) on mrjob's inline runner: a file arg opened while the job is made, the
input file's URI in ``mapper_init``, steps chosen by the job's arguments, and the reducer
count a one-step job's jobconf asks for."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.mrjob import test_examples as ex

JOBS = Path(__file__).parent / "jobs"
TREE = Path(__file__).resolve().parents[2]  # `cmr run` runs this tree's cmr, wherever it is


@pytest.fixture(scope="session")
def mrjob_python() -> Path:
    problem, _ = ex.peers.ensure_venv(ex.PEER)
    assert problem is None, problem
    python: Path = ex.PEER.python
    return python


@pytest.fixture
def words(tmp_path: Path) -> Path:
    """The examples' two text files in one directory (small: one map task on cmr)."""
    return ex.inputs_dir(ex.Case("words"), tmp_path)


def inline(python: Path, job: str, root: Path, cwd: Path, *args: str) -> Counter[str]:
    done = subprocess.run(
        [str(python), str(JOBS / job), "-r", "inline", "--no-conf", *args,
         *(str(p) for p in sorted(root.iterdir()))],
        capture_output=True, text=True, cwd=cwd, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return ex.lines(done.stdout)


def cmr(
    job: str, root: Path, out: Path, cwd: Path, *args: str, opts: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", "run", str(JOBS / job), "-i", str(root), "-o", str(out),
         *opts, "--", *args],
        capture_output=True, text=True, cwd=cwd, timeout=240, check=False,
        env={**os.environ, "PYTHONPATH": str(TREE)},
    )  # fmt: skip


@pytest.mark.slow
def test_a_file_arg_opened_in_load_args(mrjob_python: Path, words: Path, tmp_path: Path) -> None:
    """The client makes the job from the path given (relative to where cmr runs), each
    task from the file's name in the side files' directory; was refused at submit with
    "No such file or directory: 'n_file' (give the job's arguments after --...)"."""
    (tmp_path / "side").mkdir()
    (tmp_path / "side" / "n_file").write_text("5\n")
    args = ("--n-file", "side/n_file")
    expected = inline(mrjob_python, "mr_file_arg_at_load.py", words, tmp_path, *args)
    assert expected and all(int(v.partition("\t")[2]) % 5 == 0 for v in expected)  # n read
    done = cmr("mr_file_arg_at_load.py", words, tmp_path / "out", tmp_path, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ex.parts(tmp_path / "out") == expected


@pytest.mark.slow
def test_mapper_init_sees_the_input_file(mrjob_python: Path, words: Path, tmp_path: Path) -> None:
    """jobconf_from_env('mapreduce.map.input.file') in mapper_init: the URI of the file the
    task maps first (was None); mapper sees each file's as it moves on, in a task that reads
    both files (mrjob's inline runner: one file per task)."""
    expected = inline(mrjob_python, "mr_input_file_in_init.py", words, tmp_path)
    done = cmr("mr_input_file_in_init.py", words, tmp_path / "out", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = ex.parts(tmp_path / "out")
    assert got.pop('"most_files_in_a_task"\t2') == 1  # cmr packed both files in one task
    assert expected.pop('"most_files_in_a_task"\t1') == 1
    assert expected['"mapper_init_saw_the_first_file"\ttrue'] == 1
    assert len(expected) == 3  # that line and one count per file
    assert got == expected


STEPS_REFUSED = [
    (
        ("--mapper-cmd", "cat"),
        "error: MRStepsByArgs step 1 uses mapper_cmd (a shell command): that needs Hadoop "
        "Streaming; cmr runs the job's Python mapper, combiner and reducer only",
    ),
    (
        ("--mapper-filter", "grep foo"),
        "error: MRStepsByArgs step 1 uses mapper_pre_filter (a shell command): that needs "
        "Hadoop Streaming; cmr runs the job's Python mapper, combiner and reducer only",
    ),
    ((), "error: MRStepsByArgs.steps() raised ValueError: Step has no mappers and no reducers"),
]


@pytest.mark.parametrize(("args", "line"), STEPS_REFUSED, ids=["cmd", "filter", "no-args"])
def test_steps_chosen_by_arguments(args: tuple[str, ...], line: str, tmp_path: Path) -> None:
    """steps() raises when the job is made without its arguments: cmr asks the steps of the
    job made with them, and refuses a shell command with its one line (was "unexpected
    ValueError: Step has no mappers and no reducers (a bug in cmr ...)")."""
    (tmp_path / "in.txt").write_text("foo\nbar\n")
    done = cmr("mr_steps_by_args.py", tmp_path / "in.txt", tmp_path / "out", tmp_path, *args)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "out").exists()


REDUCES = [
    ("mr_jobconf_reduces.py", (), 2),  # JOBCONF
    ("mr_step_jobconf_reduces.py", (), 3),  # the step's jobconf
    ("mr_jobconf_reduces.py", ("--reducers", "5"), 5),  # cmr's command line wins
    ("mr_step_jobconf_reduces.py", ("--reducers", "1"), 1),
]


@pytest.mark.parametrize(("job", "opts", "parts"), REDUCES)
@pytest.mark.slow
def test_a_one_step_jobs_jobconf_reducers(
    job: str,
    opts: tuple[str, ...],
    parts: int,
    mrjob_python: Path,
    words: Path,
    tmp_path: Path,
) -> None:
    """mapreduce.job.reduces (mapred.reduce.tasks) in JOBCONF or the step's jobconf sets a
    one-step job's partitions, as in a two-step job (4, cmr's default, were written);
    --reducers, the command line, overrides it as Hadoop's -D overrides the job's."""
    expected = inline(mrjob_python, job, words, tmp_path)
    done = cmr(job, words, tmp_path / "out", tmp_path, opts=opts)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((tmp_path / "out").glob("part-*"))) == parts
    assert ex.parts(tmp_path / "out") == expected
