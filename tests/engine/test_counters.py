"""Counters (``Job.increment_counter``) are summed exactly once per winning attempt: a map
attempt that crashed before its commit, one that lost to a duplicate, a reduce claim taken
over, never count; the totals equal a sequential run's. They reach the job record,
``cmr.run``'s result and ``cmr status``; counter records a stranger forged are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr import api, counters, wire
from cmr.backends.base import Update
from cmr.backends.faults import FaultPlan
from cmr.errors import JobFailed, WireError
from cmr.records import MapCommit, job_pk, reduce_sk
from cmr.runtime import Runtime, WorkerCrashed
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases
from tests.stack import remove_test_resources

ROOT = Path(__file__).resolve().parents[2]
REDUCERS = 2
LEASE_S = 2

COUNTED = """\
import cmr

class Counted(cmr.Job):
    reducers = 2

    def setup(self):
        self.increment_counter("setup", "calls")  # once per process: never counted

    def map(self, key, line):
        self.increment_counter("map", "lines")
        for word in line.split():
            self.increment_counter("map", "words")
            self.increment_counter("letters", word[:1] or "?", len(word))
            yield word, 1
        self.set_status(f"read {key}")

    def reduce(self, key, values):
        n = sum(values)
        self.increment_counter("reduce", "keys")
        self.increment_counter("reduce", "total", n)
        yield key, n
"""

GREEDY = """\
import cmr

class Greedy(cmr.Job):
    def map(self, key, line):
        for i in range(1_001):
            try:
                self.increment_counter("many", f"c{i}")
            except ValueError:
                pass  # caught: the task fails all the same
        yield line, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with api.cpu_pool(2) as p:
        yield p


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[str], Any]:
    """The job, its input, and what a sequential run outputs and counts."""
    root = tmp_path_factory.mktemp("counters")
    job = root / "counted.py"
    job.write_text(COUNTED)
    data = edge_cases(root / "in")
    with counters.collecting() as counted:
        expected = sequential(str(job), data, REDUCERS)
    # The sequential run counts setup's increment; a job's tasks never do.
    totals = counters.nested({k: n for k, n in counted.counts.items() if k[0] != "setup"})
    assert totals["map"]["words"] == totals["reduce"]["total"] > 0
    return str(job), data, expected, totals


def test_run_returns_the_counters(corpus: tuple[str, Path, list[str], Any], tmp_path: Path) -> None:
    job, data, expected, totals = corpus
    result = api.run(job, str(data), str(tmp_path / "out"), workers=2, reducers=REDUCERS)
    assert result.counters == totals
    assert result.record["counters"] == totals
    assert "setup" not in result.counters  # setup runs outside tasks: nothing to count once
    assert diff_outputs(expected, read_output(tmp_path / "out", REDUCERS)) == []


class CrashOnce:
    """Crash the first worker that reaches ``step`` (the other worker finishes the job)."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.context: dict[str, Any] | None = None

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == self.step and self.context is None:
            self.context = context
            raise WorkerCrashed(step)


@pytest.mark.parametrize(
    "step",
    ["map.partly_sent", "map.committed", "reduce.draining", "reduce.output_written",
     "reduce.committed"],
)  # fmt: skip
@in_virtual_time
async def test_a_crashed_attempt_never_counts_and_a_winner_counts_once(
    step: str, corpus: tuple[str, Path, list[str], Any], pool: Executor, tmp_path: Path
) -> None:
    job, data, expected, totals = corpus
    crash = CrashOnce(step)
    result = await chaos_run(
        job, data, tmp_path / "out", seed=1, pool=pool, plan=FaultPlan(seed=1),
        hooks=[crash, crash], workers=2, reducers=REDUCERS, visibility_s=LEASE_S,
        split_bytes=4096, clientless=True,
    )  # fmt: skip
    assert crash.context is not None, f"no worker reached {step}"
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert diff_outputs(expected, read_output(tmp_path / "out", REDUCERS)) == []
    # map.partly_sent: the crashed attempt counted its words and never committed; the task
    # ran again. map.committed: the winner's message comes back and is skipped, its commit
    # counted once. reduce.*: a claim taken over (or committed, then re-received) counts once.
    assert result.record["counters"] == totals


@in_virtual_time
async def test_duplicate_deliveries_and_losing_attempts_never_count(
    corpus: tuple[str, Path, list[str], Any], pool: Executor, tmp_path: Path
) -> None:
    job, data, expected, totals = corpus
    plan = FaultPlan(seed=5, duplicate_delivery=0.5, duplicate_send=0.3, lease_loss=0.1)
    result = await chaos_run(
        job, data, tmp_path / "out", seed=5, pool=pool, plan=plan, workers=3,
        reducers=REDUCERS, visibility_s=LEASE_S, split_bytes=2048,
    )  # fmt: skip
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert sum(result.duplicates_handled.values()) > 0, result.record
    assert diff_outputs(expected, read_output(tmp_path / "out", REDUCERS)) == []
    assert result.record["counters"] == totals


@in_virtual_time
async def test_a_forged_counter_record_fails_the_job_before_it_publishes(
    corpus: tuple[str, Path, list[str], Any], pool: Executor, tmp_path: Path
) -> None:
    job, data, _, _ = corpus
    submitted: list[str] = []

    async def remember(be: Any, spec: Any) -> None:
        submitted.append(spec.job_id)

    async def forge(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "reduce.committed":
            # Someone who may write the table rewrites a committed partition's counters.
            forged = wire.pack([["g", "n", 1], ["g", "n", 2]])
            key = (job_pk(submitted[0]), reduce_sk(context["partition"]))
            await rt.backend.table.update(Update(*key, set_={"counters": forged}))

    result = await chaos_run(
        job, data, tmp_path / "out", seed=2, pool=pool, plan=FaultPlan(seed=2),
        hooks=[forge], workers=1, reducers=REDUCERS, visibility_s=LEASE_S, clientless=True,
        after_submit=remember,
    )  # fmt: skip
    assert result.record["state"] == "failed"
    assert "counter 'g'/'n' appears twice" in result.record["error"], result.record["error"]
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert result.leftovers == []


def _commit(**fields: Any) -> dict[str, Any]:
    return {"attempt": "ab12", "counts": wire.pack([[0, 1, 1]]), **fields}


def test_a_map_commit_keeps_its_counters() -> None:
    flat = {("g", "n"): 3, ("g", "neg"): -2, ("h", "é"): 2**63 - 1}
    item = MapCommit("ab12", {0: 1}, {0: 1}, 1, 1, flat).to_item()
    assert MapCommit.from_item(item).counters == flat
    assert "counters" not in MapCommit("ab12", {0: 1}, {0: 1}).to_item()  # none: no field


@pytest.mark.parametrize(
    "data",
    [
        "not bytes",
        wire.pack({"g": 1}),  # not a list of rows
        wire.pack([["g", "n"]]),  # a row of two
        wire.pack([["g", "n", 1.5]]),  # not an int
        wire.pack([["g", "n", True]]),  # a bool is no count
        wire.pack([["g", "n", 2**63]]),  # out of range
        wire.pack([["g" * 129, "n", 1]]),  # a group too long
        wire.pack([["g", "n" * 65, 1]]),  # a name too long
        wire.pack([["", "n", 1]]),  # empty
        wire.pack([[b"g", "n", 1]]),  # bytes, not str
        wire.pack([["g", "n", 1], ["g", "n", 1]]),  # twice
        wire.pack([["g", f"n{i}", 1] for i in range(1_001)]),  # too many
        wire.pack([["g", "n", 1]]) + b"\x00",  # extra bytes
        b"\xdd\xff\xff\xff\xff",  # a header claiming 4 billion rows
        b"\x91\x93\xc1",  # garbage
    ],
)
def test_forged_counters_in_a_map_commit_are_refused(data: Any) -> None:
    with pytest.raises(WireError, match="map commit record is malformed"):
        MapCommit.from_item(_commit(counters=data))
    with pytest.raises(WireError):
        counters.decode(data)


def test_a_task_past_the_counter_limit_fails_saying_so(tmp_path: Path) -> None:
    job = tmp_path / "greedy.py"
    job.write_text(GREEDY)
    (tmp_path / "in.txt").write_text("a\n")
    with pytest.raises(JobFailed, match="at most 1,000 distinct counters"):
        api.run(str(job), str(tmp_path / "in.txt"), str(tmp_path / "out"), max_task_failures=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, "n"), "group must be a str"),
        (("g", ""), "name must be 1 to 64"),
        (("g", "x" * 65), "name must be 1 to 64"),
        (("g", "n", 1.5), "n must be an int"),
        (("g", "n", True), "n must be an int"),
    ],
)
def test_increment_counter_says_what_is_wrong(args: tuple[Any, ...], message: str) -> None:
    with counters.collecting(), pytest.raises((TypeError, ValueError), match=message):
        counters.increment(*args)


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
def test_status_shows_the_counters(
    corpus: tuple[str, Path, list[str], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, data, _, totals = corpus
    monkeypatch.delenv("CMR_STORE", raising=False)
    tag = uuid.uuid4().hex[:8]
    store = f"aws://cmr-ct-{tag}/cmr-ct-{tag}?prefix=cmrct-{tag}-"

    def cmr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cmr", *args],
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
        )  # fmt: skip

    try:
        run = cmr("run", job, "--input", str(data), "--output", str(tmp_path / "out"),
                  "--store", store)  # fmt: skip
        assert run.returncode == 0, run.stderr
        job_id = run.stderr.split("submitted job ", 1)[1].split()[0]
        # `cmr run` ends with the counters block, as mrjob does.
        block = run.stderr.split("Counters:\n", 1)[1].splitlines()
        assert block[: 3] == ["  letters", *(f"      {k}={v}" for k, v in
                                                list(totals["letters"].items())[:2])]  # fmt: skip
        assert f"      words={totals['map']['words']}" in block
        doc = json.loads(cmr("status", job_id, "--json", "--store", store).stdout)
        assert doc["counters"] == totals
        shown = cmr("status", job_id, "--store", store).stdout
        assert "counters:" in shown
        assert f"    keys={totals['reduce']['keys']}" in shown
    finally:
        remove_test_resources(f"cmr-ct-{tag}", f"cmr-ct-{tag}", f"cmrct-{tag}-")


def test_a_record_whose_counters_have_keys_of_other_types() -> None:
    # An Azure item keeps int map keys: of_record (what `cmr status` and the dashboard show)
    # raised TypeError sorting them among the strings, where it should leave them out.
    record = {"counters": {"g": {"b": 2, 7: 1, "a": 1}, 3: {"n": 1}, "h": {"x": "y"}}}
    assert counters.of_record(record) == {"g": {"a": 1, "b": 2}}
