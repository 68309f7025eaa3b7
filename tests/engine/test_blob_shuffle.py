"""The blob shuffle (cmr.bulk): map output as one object per attempt, named part by part by its
commit record, on both backends: exact output, no partition queue, nothing left once the
job is cleaned up; the commit record's parts checked. Attempts racing, crashing and a
spoiled object: tests/chaos/test_blob_shuffle_chaos.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cmr import bulk
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import WireError
from cmr.lifecycle import job_scratch
from cmr.records import PART_DIGEST, MapCommit
from cmr.settings import AwsSettings
from cmr.testing import read_output

from .corpus import edge_cases
from .reference import counts_from_parts, word_count

WORDCOUNT = "examples/wordcount.py"


def _quiet() -> FaultPlan:
    return FaultPlan(seed=0)


async def _scratch_left(be: Backend, job_id: str) -> list[str]:
    return [b.url for b in await be.blobs.list(job_scratch(be.scratch, job_id))]


async def test_a_blob_shuffle_word_count_is_exact_and_uses_no_partition_queue(
    embedded: Backend, tmp_path: Path
) -> None:
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        embedded,
        WORDCOUNT,
        str(data),
        str(tmp_path / "out"),
        reducers=3,
        workers=2,
        split_bytes=2048,
        shuffle="blob",
    )
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)
    assert result.record["shuffle"] == "blob"
    assert result.record["maps"] > 3
    # Task messages only: map tasks and reduce tasks, ten to a call, at submit.
    maps = result.record["maps"]
    assert result.calls["sqs.SendMessageBatch"] == -(-maps // 10) + 1, result.calls
    assert result.calls["sqs.CreateQueue"] == 2, result.calls  # input and reduce queues
    assert await _scratch_left(embedded, result.job_id) == []


async def test_blob_and_queue_shuffles_write_the_same_parts(
    embedded: Backend, tmp_path: Path
) -> None:
    data = edge_cases(tmp_path / "in")
    parts = {}
    for mode in ("queue", "blob"):
        await run_on(
            embedded,
            "examples/invertedindex.py",
            str(data),
            str(tmp_path / mode),
            reducers=2,
            workers=1,
            split_bytes=4096,
            shuffle=mode,
        )
        parts[mode] = read_output(tmp_path / mode, 2)
    assert parts["blob"] == parts["queue"]


BIG_VALUES = """
import cmr


class BigValues(cmr.Job):
    '''A value far past what one queue message holds: it travels as a blob of its own,
    its batch in the shuffle object a pointer to it.'''

    def map(self, key, line):
        yield line.split()[0], "x" * 600_000 if line.startswith("big") else line

    def reduce(self, key, values):
        yield key, sum(len(v) for v in values)
"""


async def test_a_value_too_big_for_a_batch_travels_beside_the_object(
    embedded: Backend, tmp_path: Path
) -> None:
    job = tmp_path / "big.py"
    job.write_text(BIG_VALUES)
    src = tmp_path / "in.txt"
    src.write_text("big one\nsmall two\nbig three\nsmall four\n")
    result = await run_on(
        embedded, str(job), str(src), str(tmp_path / "out"), reducers=2, shuffle="blob"
    )
    lines = sorted("".join(read_output(tmp_path / "out", 2)).splitlines())
    assert lines == ["big\t1200000", "small\t19"]
    assert result.record["shuffle"] == "blob"
    assert await _scratch_left(embedded, result.job_id) == []


async def test_auto_picks_the_blob_store_for_a_large_input(
    embedded: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = edge_cases(tmp_path / "in")
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    modes = []
    for threshold in (size + 1, size):
        monkeypatch.setattr(bulk, "AUTO_BLOB_BYTES", threshold)
        result = await run_on(
            embedded, WORDCOUNT, str(data), str(tmp_path / f"out{threshold}"), reducers=2
        )
        modes.append(result.record.get("shuffle", "queue"))
        assert counts_from_parts(tmp_path / f"out{threshold}", 2) == word_count(data)
    assert modes == ["queue", "blob"]


def test_a_commit_records_parts_are_checked() -> None:
    good = MapCommit(
        "abcdef012345",
        {0: 2, 3: 1},
        {0: 10, 3: 4},
        parts={0: (0, 100, b"x" * PART_DIGEST), 3: (100, 50, b"y" * PART_DIGEST)},
    )
    assert MapCommit.from_item(good.to_item()) == good
    from cmr import wire

    def with_parts(rows: Any) -> dict[str, Any]:
        return {**good.to_item(), "parts": wire.pack(rows)}

    bad = {
        "a part fewer than partitions with batches": [[0, 100, b"x" * PART_DIGEST]],
        "out of order": [[3, 50, b"y" * PART_DIGEST], [0, 100, b"x" * PART_DIGEST]],
        "a partition without batches": [[0, 100, b"x" * 16], [2, 50, b"y" * 16]],
        "a short digest": [[0, 100, b"x" * 8], [3, 50, b"y" * PART_DIGEST]],
        "an empty part": [[0, 0, b"x" * PART_DIGEST], [3, 50, b"y" * PART_DIGEST]],
        "a negative length": [[0, -1, b"x" * PART_DIGEST], [3, 50, b"y" * PART_DIGEST]],
        "not rows": [b"x"],
    }
    for why, rows in bad.items():
        item = with_parts(rows)
        with pytest.raises(WireError):
            MapCommit.from_item(item)
        assert why
    with pytest.raises(WireError):
        MapCommit.from_item({**good.to_item(), "parts": "not bytes"})


@pytest.mark.usefixtures("aws_stack")
async def test_a_blob_shuffle_on_the_aws_backend_with_worker_processes(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        be,
        WORDCOUNT,
        str(data),
        str(tmp_path / "out"),
        reducers=3,
        workers=2,
        visibility_timeout=10,
        aws=settings,
        split_bytes=2048,
        shuffle="blob",
    )
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)
    assert result.record["shuffle"] == "blob"
    assert await be.queues.list(settings.queue_prefix) == []
    assert await _scratch_left(be, result.job_id) == []
