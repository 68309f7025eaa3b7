"""``--max-task-attempts N``: a task that raises N times fails the job, map and reduce, on both
backends; the reason names the task, the count and the user's error. Starts that never end
(dead workers) have a bound of their own, and a raise is never blamed on a dead worker. On a
terminal the failing job is one error line and the user's traceback; attempts are -v's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path

import pytest

from cmr.api import cpu_pool, run_on
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import JobFailed
from cmr.testing import StepChaos, chaos_run
from cmr.virtualtime import in_virtual_time
from tests.stack import remove_test_resources

# Every run of map (or reduce) appends a line to the file named by the `runs` param, so a test
# counts the runs themselves, not what the engine says of them.
BUGGY = """\
import cmr

class Buggy(cmr.Job):
    def map(self, key, line):
        with open(self.params["runs"], "a") as f:
            f.write("map\\n")
        raise ValueError("cannot parse " + line)
        yield

    def reduce(self, key, values):
        yield key, sum(values)
"""

BAD_REDUCE = """\
import cmr

class BadReduce(cmr.Job):
    def map(self, key, line):
        for word in line.split():
            yield word, 1

    def reduce(self, key, values):
        with open(self.params["runs"], "a") as f:
            f.write("reduce\\n")
        raise ValueError("cannot reduce " + key)
        yield
"""

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d \[")  # a structlog line: "12:00:00 [warning  ] ..."


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with cpu_pool(1) as p:
        yield p


def _job(tmp: Path, source: str) -> tuple[Path, Path, Path]:
    job = tmp / "job.py"
    job.write_text(source)
    (tmp / "in").mkdir()
    (tmp / "in" / "words.txt").write_text("alpha beta\n")
    return job, tmp / "in", tmp / "runs.txt"


def _runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


@pytest.mark.parametrize("attempts", [1, 6])
async def test_a_map_that_raises_runs_exactly_max_task_attempts_times(
    embedded: Backend, tmp_path: Path, attempts: int
) -> None:
    job, src, runs = _job(tmp_path, BUGGY)
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded, str(job), str(src), str(tmp_path / "out"),
            reducers=2, max_task_attempts=attempts, params={"runs": str(runs)},
        )  # fmt: skip
    reason = info.value.reason
    first = reason.splitlines()[0]
    assert first == (
        f"map task 0 failed {_times(attempts)} (--max-task-attempts {attempts}): "
        "Buggy.map raised ValueError: cannot parse alpha beta"
    ), reason
    assert "died" not in reason and "started" not in reason  # raised: no dead worker
    assert "job.py" in reason  # the user's frames follow
    assert _runs(runs) == attempts


@pytest.mark.parametrize("attempts", [1, 4])
async def test_a_reduce_that_raises_runs_exactly_max_task_attempts_times(
    embedded: Backend, tmp_path: Path, attempts: int
) -> None:
    job, src, runs = _job(tmp_path, BAD_REDUCE)
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded, str(job), str(src), str(tmp_path / "out"),
            reducers=1, max_task_attempts=attempts, params={"runs": str(runs)},
        )  # fmt: skip
    reason = info.value.reason
    assert reason.startswith(
        f"reduce of partition 0 failed {_times(attempts)} (--max-task-attempts {attempts}): "
        "BadReduce.reduce raised ValueError: cannot reduce "
    ), reason
    assert "died" not in reason and "started" not in reason
    assert _runs(runs) == attempts


@in_virtual_time
async def test_raises_never_count_against_the_bound_on_starts_that_never_end(
    pool: Executor, tmp_path: Path
) -> None:
    """One start without finishing allowed, five raises: five runs, and the reason is the
    raise's (the old count took every retry after a raise for a dead worker's restart)."""
    job, src, runs = _job(tmp_path, BUGGY)
    result = await chaos_run(
        str(job), src / "words.txt", tmp_path / "out",
        seed=0, pool=pool, plan=FaultPlan(seed=0), steps=StepChaos(crash=0, pause=0),
        workers=1, reducers=1, clientless=True, params={"runs": str(runs)},
        job_options={"max_task_failures": 5, "max_task_attempts": 1},
    )  # fmt: skip
    assert result.record["state"] == "failed"
    error = result.record["error"]
    assert error.startswith("map task 0 failed 5 times (--max-task-attempts 5)"), error
    assert "without finishing" not in error and "died" not in error
    assert _runs(runs) == 5
    assert result.leftovers == []


def _cmr(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_a_failing_job_is_one_error_line_and_the_users_traceback_attempts_with_v(
    tmp_path: Path,
) -> None:
    job, src, runs = _job(tmp_path, BAD_REDUCE)
    (src / "more.txt").write_text("gamma delta epsilon zeta\n")
    argv: tuple[str, ...] = ("run", str(job), "-i", str(src), "-o", str(tmp_path / "out"))
    argv += ("--no-progress", "--reducers", "4", "--max-task-attempts", "2", "-p", f"runs={runs}")
    quiet = _cmr(*argv, cwd=tmp_path)
    assert quiet.returncode == 1, quiet.stderr
    lines = quiet.stderr.splitlines()
    assert [line for line in lines if LOG_LINE.match(line)] == [], quiet.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "failed 2 times (--max-task-attempts 2)" in errors[0], lines
    assert "ValueError: cannot reduce" in errors[0]
    assert lines[-1].startswith("ValueError: cannot reduce"), quiet.stderr  # the user's own
    assert len(lines) <= 12, quiet.stderr  # fits a screen whatever the partitions
    # -v: every attempt, one line each.
    loud = _cmr(*argv, "-v", cwd=tmp_path)
    assert loud.returncode == 1, loud.stderr
    attempts = [line for line in loud.stderr.splitlines() if "task failed" in line]
    assert len(attempts) >= 2, loud.stderr


@pytest.mark.parametrize(
    ("source", "attempts", "what"),
    [
        (BUGGY, 4, "map task 0 failed 4 times"),
        (BAD_REDUCE, 1, "reduce of partition 0 failed once"),
    ],
    ids=["map", "reduce"],
)
@pytest.mark.slow
def test_on_aws_max_task_attempts_bounds_raises_and_status_shows_the_retries(
    aws_stack: dict[str, str], tmp_path: Path, source: str, attempts: int, what: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    store: tuple[str, ...] = ("--bucket", f"cmr-att-{tag}", "--table", f"cmr-att-{tag}")
    store += ("--queue-prefix", f"cmra-{tag}-")
    job, src, runs = _job(tmp_path, source)
    try:
        run = _cmr(
            "run", str(job), "--backend", "aws", "-i", str(src), "-o", str(tmp_path / "out"),
            "--no-progress", "--reducers", "1", "--visibility-timeout", "5",
            "--max-task-attempts", str(attempts), "-p", f"runs={runs}", *store,
            cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 1, run.stderr
        lines = run.stderr.splitlines()
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1, run.stderr
        assert f"{what} (--max-task-attempts {attempts})" in errors[0], run.stderr
        assert "ValueError" in errors[0] and "died" not in run.stderr
        assert [line for line in lines if LOG_LINE.match(line)] == [], run.stderr
        assert _runs(runs) == attempts
        job_id = next(w for w in errors[0].split() if w.count("-") == 2 and w[:8].isdigit())
        status = _cmr("status", job_id, *store, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        # The reason, the bound the user set, and the retries (attempts are status's, not run's).
        assert what in status.stdout
        assert re.search(rf"max_task_attempts\W+{attempts}\b", status.stdout), status.stdout
        if attempts > 1:
            assert re.search(rf"tasks_retried\W+{attempts - 1}\b", status.stdout), status.stdout
    finally:
        remove_test_resources(f"cmr-att-{tag}", f"cmr-att-{tag}", f"cmra-{tag}-")
