"""The dashboard's read model on real jobs (the embedded backend, in this process): what it
says of finished jobs, that it reads a finished, cleaned-up job once and never again, that the
list pages, and that rows it cannot trust are shown as such, not believed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cmr import attempts
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.dashboard.board import Board
from cmr.errors import NotFound
from cmr.records import JOBS_PK, job_pk

HERE = Path(__file__).parent
SLOW = str(HERE / "slow_count.py")
LINES = 30


@pytest.fixture
def words(tmp_path: Path) -> Path:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"alpha beta {i % 3}\n" for i in range(LINES)))
    return src


async def _run(be: Backend, src: Path, out: Path) -> str:
    result = await run_on(be, SLOW, str(src), str(out), workers=1, reducers=2)
    return result.job_id


def _reads(be: Backend, before: Counter[str]) -> Counter[str]:
    return be.table.calls - before


async def test_a_finished_job_is_shown_whole(
    embedded: Backend, words: Path, tmp_path: Path
) -> None:
    job = await _run(embedded, words, tmp_path / "out")
    board = Board(embedded, store="embedded")

    listed = await board.jobs()
    assert listed["total"] == 1 and listed["states"] == {"succeeded": 1}
    (row,) = listed["jobs"]
    assert row["job"] == job and row["state"] == "succeeded"
    assert row["progress"] == {"maps_done": 1, "maps": 1, "reduces_done": 2, "reduces": 2}
    assert row["records_in"] == LINES and row["bytes_in"] == words.stat().st_size
    assert row["ended"] >= row["started"] and row["duration_s"] > 0
    assert row["throughput_mb_s"] == round(row["bytes_in"] / 1e6 / row["duration_s"], 6)
    assert set(row["duplicates"]) == {"method1", "method2", "method3"}

    doc = await board.job(job)
    assert doc["counters"] == {"seen": {"lines": LINES}}
    (step,) = doc["steps"]
    # After cleanup the attempts come from the job's timeline: one committed map, and one
    # committed claim of each partition.
    committed = sorted(
        (a["kind"], a["task"]) for a in step["attempts"] if a["outcome"] == "committed"
    )
    assert committed == [("map", 0), ("reduce", 0), ("reduce", 1)]
    assert step["attempts"] == [a.to_json() for a in await attempts.attempts(embedded, job)]
    assert step["failures"] == []  # cleanup deleted the fail# records (there were none)


async def test_finished_jobs_are_read_once(embedded: Backend, words: Path, tmp_path: Path) -> None:
    jobs = [await _run(embedded, words, tmp_path / f"out{i}") for i in range(3)]
    board = Board(embedded, fresh_s=0)
    first = await board.jobs()
    await board.job(jobs[0])

    before = Counter(embedded.table.calls)
    again = await board.jobs()
    detail = await board.job(jobs[0])
    # The job list is read again (a job may have been added), and the shown job's usage
    # rows (its cost: processes write them again after cleanup); the three jobs, finished
    # and cleaned up, are not: neither their records, their progress, nor their timelines.
    assert _reads(embedded, before) == Counter({"dynamodb.Query": 2})
    assert detail["cost"]["total_usd"] > 0
    assert again["jobs"] == first["jobs"]
    assert detail["steps"][0]["attempts"]


async def test_the_list_pages_newest_first(embedded: Backend, words: Path, tmp_path: Path) -> None:
    jobs = [await _run(embedded, words, tmp_path / f"out{i}") for i in range(5)]
    board = Board(embedded)
    pages = [await board.jobs(offset, 2) for offset in (0, 2, 4)]
    assert [len(p["jobs"]) for p in pages] == [2, 2, 1]
    assert [j["job"] for p in pages for j in p["jobs"]] == jobs[::-1]
    assert all(p["total"] == 5 for p in pages)
    assert (await board.jobs(0, 50, "failed"))["jobs"] == []


async def test_rows_it_cannot_trust_are_shown_as_such(embedded: Backend) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    await embedded.table.put(JOBS_PK, hostile, {"state": "running", "created": 1.0})
    await embedded.table.put(JOBS_PK, "20260101-000000-0000000000000000", {"state": "x"})
    board = Board(embedded)
    rows = {r["job"]: r for r in (await board.jobs())["jobs"]}
    assert rows[hostile]["state"] == "unreadable"
    assert "not a job id" in rows[hostile]["error"]
    # A job id whose record is missing: listed, and said to be unreadable, with the reason.
    missing = rows["20260101-000000-0000000000000000"]
    assert missing["state"] == "unreadable" and "no job" in missing["error"]
    with pytest.raises(NotFound):
        await board.job(hostile)


async def test_a_damaged_record_is_not_trusted(
    embedded: Backend, words: Path, tmp_path: Path
) -> None:
    job = await _run(embedded, words, tmp_path / "out")
    pk = job_pk(job)
    record = await embedded.table.get(pk, "job")
    assert record is not None
    record.update(
        batches_dropped=-5,  # counters edited by hand: not counts
        reduce_conflicts="many",
        counters={"g": {"n": "x", "ok": 2}, 3: {"n": 1}},
        error=float("nan"),
    )
    await embedded.table.put(pk, "job", {k: v for k, v in record.items() if k not in ("pk", "sk")})
    doc = await Board(embedded).job(job)
    assert doc["duplicates"]["method2"]["batches_dropped"] == 0
    assert doc["duplicates"]["method3"]["reduce_conflicts"] == 0
    assert doc["counters"] == {"g": {"ok": 2}}
    assert doc["error"] == ""
