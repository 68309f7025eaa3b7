"""A table writer adds a map commit record for a task the job does not have (``map#`` past its
maps): a reducer must not count it among the winners. Counted, it stood in for a real task
still running, and the partition was reduced without that task's pairs: a job that
"succeeded" with wrong output (found by review, 2026-11-27)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.records import MapCommit, job_pk, map_sk

from .reference import counts_from_parts, word_count

SLOW_JOB = """
import time
import cmr


class SlowWordCount(cmr.Job):
    def map(self, key, line):
        if line.startswith("slow"):
            time.sleep(2)  # the reducer polls the table meanwhile
        for word in line.split():
            yield word, 1

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


@pytest.mark.parametrize(
    "sk",
    [
        map_sk(9_999_999),
        # Not a number int() reads, though str.isdigit() says it is: the reducer's drain
        # raised ValueError on it (the job failed), found by review (2026-11-29).
        "map#\u00b2",
    ],
)
async def test_a_commit_record_of_no_task_is_not_a_winner(
    embedded: Backend, tmp_path: Path, sk: str
) -> None:
    job = tmp_path / "slow.py"
    job.write_text(SLOW_JOB)
    data = tmp_path / "in"
    data.mkdir()
    (data / "a-fast.txt").write_text("fast words here\nwords again\n")
    (data / "b-slow.txt").write_text("slow words\nmore slow words\n")
    forged: list[asyncio.Task[None]] = []

    def forge(job_id: str) -> None:
        # Past the job's map tasks, with nothing sent anywhere: complete at once.
        item = MapCommit("f" * 12, {0: 0}, {0: 0}).to_item()
        put = embedded.table.put(job_pk(job_id), sk, item)
        forged.append(asyncio.get_running_loop().create_task(put))

    result = await run_on(
        embedded,
        str(job),
        str(data),
        str(tmp_path / "out"),
        reducers=1,
        split_bytes=32,
        on_submit=forge,
    )
    await forged[0]
    assert result.record["maps"] >= 2
    assert counts_from_parts(tmp_path / "out", 1) == word_count(data)
