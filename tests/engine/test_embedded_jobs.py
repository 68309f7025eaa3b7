"""Whole jobs on the embedded backend, compared with sequential Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobCodeError, JobFailed, UsageError
from cmr.records import JOBS_PK, job_pk
from cmr.testing import task_records

from .corpus import edge_cases, small_files
from .reference import counts_from_parts, index_from_parts, inverted_index, word_count

WORDCOUNT = "examples/wordcount.py"


@pytest.mark.parametrize(
    ("split_bytes", "reducers"),
    # 13-byte splits: some 3,600 map tasks
    [pytest.param(13, 3, marks=pytest.mark.slow), (100, 1), (4096, 5), (None, 2)],
)
async def test_wordcount_edge_cases_match_sequential(
    embedded: Backend, tmp_path: Path, split_bytes: int | None, reducers: int
) -> None:
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        embedded,
        WORDCOUNT,
        str(data),
        str(tmp_path / "out"),
        reducers=reducers,
        split_bytes=split_bytes,
    )
    assert counts_from_parts(tmp_path / "out", reducers) == word_count(data)
    assert result.record["state"] == "succeeded"
    assert result.record["bytes_in"] == sum(
        p.stat().st_size for p in data.rglob("*") if p.is_file()
    )


async def test_many_small_files_are_packed_into_few_tasks(
    embedded: Backend, tmp_path: Path
) -> None:
    data = small_files(tmp_path / "in", 300)
    result = await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=3)
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)
    assert result.record["maps"] < 10  # 300 files of a few bytes: one or a few map tasks


async def test_more_reducers_than_keys_gives_empty_parts(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a b a\nc\n")
    await run_on(embedded, WORDCOUNT, str(src), str(tmp_path / "out"), reducers=20)
    assert counts_from_parts(tmp_path / "out", 20) == {"a": 2, "b": 1, "c": 1}
    assert sum(1 for p in (tmp_path / "out").iterdir() if p.stat().st_size == 0) == 17


@pytest.mark.slow
async def test_inverted_index_matches_sequential(embedded: Backend, tmp_path: Path) -> None:
    data = edge_cases(tmp_path / "in")
    await run_on(
        embedded,
        "examples/invertedindex.py",
        str(data),
        str(tmp_path / "out"),
        reducers=3,
        split_bytes=50,
    )
    assert index_from_parts(tmp_path / "out", 3) == inverted_index(data)


async def test_grep_reads_its_pattern_from_params(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "log.txt"
    src.write_text("ok 1\nERROR disk\nok 2\nFATAL cpu\n")
    result = await run_on(
        embedded,
        "examples/grep.py",
        str(src),
        str(tmp_path / "out"),
        reducers=1,
        params={"pattern": "ERROR|FATAL"},
    )
    assert Path(result.parts[0]).read_text() == 'log.txt\t["ERROR disk", "FATAL cpu"]\n'


async def test_empty_input_gives_empty_parts(embedded: Backend, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "e.txt").write_bytes(b"")
    result = await run_on(
        embedded, WORDCOUNT, str(tmp_path / "in"), str(tmp_path / "out"), reducers=2
    )
    assert counts_from_parts(tmp_path / "out", 2) == {}
    assert result.record["maps"] == 0


FAILING_JOB = """
import cmr

class Boom(cmr.Job):
    def map(self, key, line):
        if "bad" in line:
            raise ValueError(f"cannot handle {line!r}")
        yield line, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


async def test_map_that_raises_fails_the_job_and_cleans_up(
    embedded: Backend, tmp_path: Path
) -> None:
    job = tmp_path / "boom.py"
    job.write_text(FAILING_JOB)
    src = tmp_path / "in.txt"
    src.write_text("fine\nbad line\n")
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded, str(job), str(src), str(tmp_path / "out"), reducers=2, max_task_attempts=3
        )
    reason = info.value.reason
    assert "map task 0 failed 3 times" in reason
    assert "ValueError: cannot handle 'bad line'" in reason
    assert "boom.py" in reason  # the user's own frame is in the traceback
    job_id = info.value.job_id
    record = await embedded.table.get(job_pk(job_id), "job")
    assert record is not None and record["state"] == "failed"
    assert (await embedded.table.get(JOBS_PK, job_id) or {})["state"] == "failed"
    # Everything but the job record is gone: queues, task records, scratch blobs.
    assert await embedded.queues.list(f"cmr-{job_id}") == []
    assert await task_records(embedded, job_id) == ["job"]
    assert await embedded.blobs.list(f"{embedded.scratch}/jobs/{job_id}/") == []


async def test_missing_input_is_a_usage_error(embedded: Backend, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        await run_on(embedded, WORDCOUNT, str(tmp_path / "nope"), str(tmp_path / "out"))
    assert await embedded.queues.list("cmr-") == []  # nothing was created


async def test_broken_job_file_is_reported_before_submitting(
    embedded: Backend, tmp_path: Path
) -> None:
    job = tmp_path / "broken.py"
    job.write_text("import cmr\nclass J(cmr.Job):\n    def map(self, k, v)\n")
    src = tmp_path / "in.txt"
    src.write_text("x\n")
    with pytest.raises(JobCodeError, match="SyntaxError"):
        await run_on(embedded, str(job), str(src), str(tmp_path / "out"))
    assert await embedded.queues.list("cmr-") == []


async def test_non_empty_output_needs_overwrite(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("x y\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000").write_text("stale\t1\n")
    with pytest.raises(UsageError, match="--overwrite"):
        await run_on(embedded, WORDCOUNT, str(src), str(out), reducers=1)
    await run_on(embedded, WORDCOUNT, str(src), str(out), reducers=1, overwrite=True)
    assert counts_from_parts(out, 1) == {"x": 1, "y": 1}


def test_wordcount_fast_path_agrees_with_map(tmp_path: Path) -> None:
    from collections import Counter

    from cmr.job import JobRef, load_job_class

    job = load_job_class(JobRef.parse(WORDCOUNT))()
    data = edge_cases(tmp_path / "in")
    for path in data.rglob("*.txt"):
        raw = path.read_bytes()
        slow: Counter[str] = Counter()
        for line in raw.split(b"\n"):
            slow.update(w for w, _ in job.map(path.name, line.decode("utf-8", "replace")))
        assert Counter(dict(job.map_chunk(path.name, raw))) == slow, path.name


BIG_VALUES = """
import cmr

class Big(cmr.Job):
    def map(self, key, line):
        if line:
            yield line[0], line * 40_000  # far larger than one queue message

    def reduce(self, key, values):
        yield key, sorted(len(v) for v in values)
"""


async def test_values_larger_than_a_message_travel_through_the_blob_store(
    embedded: Backend, tmp_path: Path
) -> None:
    job = tmp_path / "big.py"
    job.write_text(BIG_VALUES)
    src = tmp_path / "in.txt"
    src.write_text("abcdefghij\nabc\nxyz\n")
    result = await run_on(embedded, str(job), str(src), str(tmp_path / "out"), reducers=1)
    assert Path(result.parts[0]).read_text() == ("a\t[120000, 400000]\nx\t[120000]\n")
    assert result.calls["s3.PutObject"] >= 3  # each big value went through a blob


async def test_reducers_spill_to_disk_past_their_memory_budget(
    embedded: Backend, tmp_path: Path
) -> None:
    from cmr.settings import WorkerSettings

    data = edge_cases(tmp_path / "in")
    result = await run_on(
        embedded,
        "examples/invertedindex.py",
        str(data),
        str(tmp_path / "out"),
        reducers=1,
        split_bytes=200,
        worker_settings=WorkerSettings(memory_mb=0),
    )
    assert index_from_parts(tmp_path / "out", 1) == inverted_index(data)
    assert result.record["reduce_spills"] >= 2


EXITING_JOB = """
import os
import cmr

class Exits(cmr.Job):
    def map(self, key, line):
        os._exit(3)  # the process vanishes, as under the OOM killer
        yield line, 1

    def reduce(self, key, values):
        yield key, 0
"""


async def test_a_dying_pool_process_stops_the_run_with_a_clear_error(
    embedded: Backend, tmp_path: Path
) -> None:
    from cmr.errors import CmrError

    job = tmp_path / "exits.py"
    job.write_text(EXITING_JOB)
    src = tmp_path / "in.txt"
    src.write_text("x\n")
    with pytest.raises(CmrError, match="pool process of this worker died"):
        await run_on(embedded, str(job), str(src), str(tmp_path / "out"), reducers=1)


@pytest.mark.slow
async def test_splits_follow_the_workers_memory_budget(embedded: Backend, tmp_path: Path) -> None:
    """A budget of 8 MiB caps splits at 4 MiB (budget / 8, at least 4 MiB): with one map
    slot, 24 MB of input becomes 6 map tasks, where the default budget makes it 4 (input /
    4 per slot), and the output is the same."""
    from cmr.settings import WorkerSettings
    from cmr.split import choose_split_bytes

    mib = 1024 * 1024
    assert choose_split_bytes(400 * 10**6, 2) == 50 * 10**6  # no budget: input / 8
    assert choose_split_bytes(400 * 10**6, 2, 512 * mib) == 50 * 10**6  # 512 MiB: 64 MiB cap
    assert choose_split_bytes(400 * 10**6, 2, 1 * mib) == 4 * mib  # never below 4 MiB
    data = tmp_path / "in"
    data.mkdir()
    line = b"alpha beta gamma delta epsilon zeta eta theta iota kappa\n"
    (data / "big.txt").write_bytes(line * (24 * 10**6 // len(line)))
    budget = await run_on(
        embedded,
        WORDCOUNT,
        str(data),
        str(tmp_path / "small"),
        reducers=2,
        worker_settings=WorkerSettings(memory_mb=8, map_slots=1, poll_s=0.1),
    )
    default = await run_on(
        embedded,
        WORDCOUNT,
        str(data),
        str(tmp_path / "default"),
        reducers=2,
        worker_settings=WorkerSettings(map_slots=1, poll_s=0.1),
    )
    assert budget.record["maps"] >= 6 > default.record["maps"]
    want = word_count(data)
    assert counts_from_parts(tmp_path / "small", 2) == want
    assert counts_from_parts(tmp_path / "default", 2) == want
