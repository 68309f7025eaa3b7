"""Pipelines: one submission runs every step of a job, each step's committed output feeding
the next, compared with a sequential run of the same steps."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobCodeError, JobFailed, UsageError
from cmr.records import ACTIVE_PK, JOBS_PK, job_pk
from cmr.testing import read_output, sequential

from .corpus import edge_cases

TOPWORDS = "examples/topwords.py"
JOBS = "tests/engine/pipeline_jobs.py"


def lines_of(out: Path, parts: int) -> list[str]:
    return [line for part in read_output(out, parts) for line in part.splitlines()]


@pytest.mark.slow
async def test_top_words_two_steps_match_a_sequential_run(
    embedded: Backend, tmp_path: Path
) -> None:
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        embedded, TOPWORDS, str(data), str(tmp_path / "out"), split_bytes=64, params={"top": "7"}
    )
    expected = sequential(TOPWORDS, data, None, {"top": "7"})
    assert read_output(tmp_path / "out", 1) == expected
    # The reference itself: the 7 most used words of the corpus, most used first.
    words: Counter[str] = Counter()
    for f in sorted(p for p in data.rglob("*") if p.is_file()):
        words.update(f.read_bytes().decode("utf-8", "replace").split())
    top = sorted(words.items(), key=lambda wc: (-wc[1], wc[0]))[:7]
    assert expected == ["".join(f"{w}\t{c}\n" for w, c in top)]
    record = result.record
    assert record["state"] == "succeeded"
    assert record["records_out"] == 7
    # The run's id is its first step's; the record is its last step's.
    assert result.job_id == record["pipeline"]
    assert record["step"] == 1


async def test_three_steps_with_map_only_identity_map_and_hooks(
    embedded: Backend, tmp_path: Path
) -> None:
    data = edge_cases(tmp_path / "in")
    result = await run_on(embedded, f"{JOBS}:ThreeSteps", str(data), str(tmp_path / "out"))
    expected = sequential(f"{JOBS}:ThreeSteps", data, None)
    got = read_output(tmp_path / "out", 4)

    # The "keys" lines of reduce_final depend on partitioning only; the step-2 map tasks
    # counted by map_final depend on how step 1's parts were packed: compare the rest.
    def rest(parts: list[str]) -> list[str]:
        return sorted(
            line
            for part in parts
            for line in part.splitlines()
            if not line.startswith('["len", 0]')
        )

    assert rest(got) == rest(expected)
    # map_final ran once per map task of step 2: as many as step 2's plan had.
    step2 = await embedded.table.get(job_pk(f"{result.job_id}-s2"), "job")
    assert step2 is not None and step2["state"] == "succeeded"
    tasks = [line for part in got for line in part.splitlines() if line.startswith('["len", 0]')]
    assert tasks == [f'["len", 0]\t{step2["maps"]}']


@pytest.mark.slow
async def test_one_step_then_the_rest_equals_the_whole_run(
    embedded: Backend, tmp_path: Path
) -> None:
    data = edge_cases(tmp_path / "in")
    job = f"{JOBS}:ThreeSteps"
    await run_on(embedded, job, str(data), str(tmp_path / "whole"))
    first = await run_on(embedded, job, str(data), str(tmp_path / "s1"), step=1)
    assert first.record["state"] == "succeeded"
    # Step 1 alone writes pairs: what --from-step 2 reads.
    await run_on(embedded, job, str(tmp_path / "s1"), str(tmp_path / "rest"), from_step=2)
    assert sorted(lines_of(tmp_path / "rest", 4)) == sorted(lines_of(tmp_path / "whole", 4))


async def test_step_options_out_of_range_are_refused(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    with pytest.raises(UsageError, match=r"--step 4: the job has 3 steps \(1 to 3\)"):
        await run_on(embedded, f"{JOBS}:ThreeSteps", str(src), str(tmp_path / "o"), step=4)
    with pytest.raises(UsageError, match="not both"):
        await run_on(
            embedded, f"{JOBS}:ThreeSteps", str(src), str(tmp_path / "o"), step=1, from_step=2
        )
    with pytest.raises(
        JobCodeError, match=r"BadSteps.steps\(\) step 1: map is 'words', not callable"
    ):
        await run_on(embedded, f"{JOBS}:BadSteps", str(src), str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


async def test_a_failing_step_fails_the_pipeline_naming_the_step(
    embedded: Backend, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b a\n")
    with pytest.raises(JobFailed) as failed:
        await run_on(embedded, f"{JOBS}:Failing", str(src), str(tmp_path / "o"))
    assert "step 2" in str(failed.value)
    assert "no b in step 2" in str(failed.value)
    pipeline = failed.value.job_id
    listed = await embedded.table.get(JOBS_PK, pipeline)
    assert listed is not None and listed["state"] == "failed"
    # Nothing published; both steps ended and left the active index.
    assert not (tmp_path / "o" / "_SUCCESS").exists()
    assert await embedded.table.query(ACTIVE_PK) == []
    first = await embedded.table.get(job_pk(pipeline), "job")
    assert first is not None and first["state"] == "succeeded"
    assert first["next"] == f"{pipeline}-s2"


@pytest.mark.slow
def test_a_pipeline_on_the_local_stack_as_a_user_runs_it(
    aws_stack: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cmr run` of a two-step job on the local stack, then `cmr status`: the pipeline is
    listed once, at its last step, and its record shows both steps; a failing pipeline
    names the step, keeps the step before's output for resuming, and `cmr cleanup` removes
    it."""
    from tests.engine.test_status_cli import cmr
    from tests.stack import remove_test_resources

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CMR_STORE", raising=False)
    tag = uuid.uuid4().hex[:8]
    store = f"aws://cmr-pl-{tag}/cmr-pl-{tag}?prefix=cmrpl-{tag}-"
    data = edge_cases(tmp_path / "in")
    try:
        run = cmr(
            "run", TOPWORDS, "--input", str(data), "--output", str(tmp_path / "out"),
            "--store", store, "--param", "top=5",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        job = run.stderr.split("submitted job ", 1)[1].split()[0]
        assert read_output(tmp_path / "out", 1) == sequential(TOPWORDS, data, None, {"top": "5"})

        [listed] = json.loads(cmr("status", "--json", "--store", store).stdout)
        assert listed["job"] == job and listed["state"] == "succeeded"
        doc = json.loads(cmr("status", job, "--json", "--store", store).stdout)
        assert doc["job"] == job
        assert [(s["step"], s["job"], s["state"]) for s in doc["steps"]] == [
            (1, job, "succeeded"),
            (2, f"{job}-s2", "succeeded"),
        ]
        assert doc["steps"][1]["records_out"] == 5
        text = cmr("status", job, "--store", store).stdout
        assert "step 1" in text and "step 2" in text

        (tmp_path / "ab.txt").write_text("a b a\n")
        failed = cmr(
            "run", f"{JOBS}:Failing", "--input", str(tmp_path / "ab.txt"),
            "--output", str(tmp_path / "o2"),
            "--store", store,
        )  # fmt: skip
        assert failed.returncode == 1
        bad = failed.stderr.split("submitted job ", 1)[1].split()[0]
        assert f"job {bad} failed: step 2 ({bad}-s2)" in failed.stderr
        assert "no b in step 2" in failed.stderr
        doc = json.loads(cmr("status", bad, "--json", "--store", store).stdout)
        assert [s["state"] for s in doc["steps"]] == ["succeeded", "failed"]
        assert doc["steps"][0]["outputs"].startswith(f"s3://cmr-pl-{tag}/")
        # Step 1's committed output is kept (a resume reads it) until `cmr cleanup`.
        kept = cmr("cleanup", bad, "--store", store)
        assert kept.returncode == 0, kept.stderr
    finally:
        remove_test_resources(f"cmr-pl-{tag}", f"cmr-pl-{tag}", f"cmrpl-{tag}-")
