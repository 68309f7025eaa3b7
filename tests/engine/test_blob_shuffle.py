"""The blob shuffle (cmr.bulk): map output as one object per attempt, named part by part by its
commit record, on both backends: exact output, no partition queue, nothing left once the
job is cleaned up; the commit record's parts checked. Attempts racing, crashing and a
spoiled object: tests/chaos/test_blob_shuffle_chaos.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from blake3 import blake3

from cmr import bulk, lifecycle, wire
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import TaskError, Throttled, WireError
from cmr.lifecycle import job_scratch
from cmr.records import PART_DIGEST, MapCommit
from cmr.runtime import Runtime
from cmr.settings import AwsSettings, WorkerSettings
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


async def test_auto_keeps_queues_on_the_embedded_store(
    embedded: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its requests cost nothing: the blob path would only copy and hash every byte again."""
    data = edge_cases(tmp_path / "in")
    monkeypatch.setattr(bulk, "AUTO_BLOB_BYTES", 1)
    result = await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2)
    assert result.record.get("shuffle", "queue") == "queue"
    assert counts_from_parts(tmp_path / "out", 2) == word_count(data)


@pytest.mark.usefixtures("aws_stack")
async def test_auto_picks_the_blob_store_for_a_large_input_on_aws(
    aws: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    be, settings = aws
    data = edge_cases(tmp_path / "in")
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    modes = []
    for threshold in (size + 1, size):
        monkeypatch.setattr(bulk, "AUTO_BLOB_BYTES", threshold)
        out = tmp_path / f"out{threshold}"
        result = await run_on(
            be, WORDCOUNT, str(data), str(out), reducers=2, workers=1, aws=settings
        )
        modes.append(result.record.get("shuffle", "queue"))
        assert counts_from_parts(out, 2) == word_count(data)
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


# Reading one part, on the embedded store: what cmr.bulk refuses, and what it passes on.

JOB_ID = "20260101-000000-0123456789abcdef"
ATTEMPT = "0123456789ab"


def _spec(scratch: str) -> Any:
    return SimpleNamespace(job_id=JOB_ID, scratch=scratch)


def _spool(path: Path, parts: dict[int, list[bytes]]) -> None:
    """A map task's spool as cmr.cpu.shuffle writes it: [partition, seq, records, body,
    spilled?] arrays, partitions interleaved."""
    packer = msgpack.Packer(use_bin_type=True)
    with open(path, "wb") as f:
        for seq in range(max(len(v) for v in parts.values())):
            for p, streams in parts.items():
                if seq < len(streams):
                    body = wire.encode(wire.Batch(JOB_ID, 0, ATTEMPT, p, seq, 1, streams[seq]))
                    f.write(packer.pack((p, seq, 1, body, False)))


async def _written(
    be: Backend, tmp_path: Path, parts: dict[int, list[bytes]]
) -> tuple[Runtime, Any, MapCommit]:
    rt = Runtime(be, WorkerSettings(), None, str(tmp_path))  # type: ignore[arg-type]
    spec = _spec((tmp_path / "scratch").as_uri())
    _spool(tmp_path / "spool", parts)

    async def no_spills(p: int, seq: int, n: int, data: bytes) -> bytes:
        raise AssertionError("nothing here is spilled")

    written = await bulk.write_object(rt, spec, 0, ATTEMPT, str(tmp_path / "spool"), no_spills)
    batches = {p: len(v) for p, v in parts.items()}
    return rt, spec, MapCommit(ATTEMPT, batches, batches, parts=written.parts)


def _pair(key: str) -> bytes:
    return msgpack.packb((key, 1), use_bin_type=True)  # type: ignore[no-any-return]


async def _never_spilled(batch: wire.Batch) -> bytes:
    raise AssertionError("nothing here is spilled")


async def test_a_part_reads_back_as_its_batches_pairs(embedded: Backend, tmp_path: Path) -> None:
    parts = {0: [_pair("a"), _pair("b")], 2: [_pair("c")], 5: [_pair("d"), _pair("e")]}
    rt, spec, commit = await _written(embedded, tmp_path, parts)
    for p, streams in parts.items():
        out = tmp_path / f"p{p}"
        n = await bulk.read_part(rt, spec, p, 0, commit, str(out), _never_spilled)
        assert out.read_bytes() == b"".join(streams) and n == len(out.read_bytes())


async def test_a_part_that_ends_inside_a_batch_is_refused(
    embedded: Backend, tmp_path: Path
) -> None:
    """A cut-off item after the last batch (a bin header), its digest made to match: the
    part is refused, not read as if whole."""
    rt, spec, commit = await _written(embedded, tmp_path, {0: [_pair("a")], 1: [_pair("b")]})
    url = lifecycle.shuffle_url(spec.scratch, JOB_ID, 0, ATTEMPT)
    data = await embedded.blobs.get(url) + b"\xc4\x10"
    await embedded.blobs.put(url, data)
    offset, length, _ = commit.parts[1]
    length += 2
    digest = blake3(data[offset : offset + length]).digest()[:PART_DIGEST]
    forged = dataclasses.replace(commit, parts={**commit.parts, 1: (offset, length, digest)})
    with pytest.raises(TaskError, match="ends inside a batch"):
        await bulk.read_part(rt, spec, 1, 0, forged, str(tmp_path / "out"), _never_spilled)


async def test_a_store_error_on_the_way_is_passed_on_as_itself(
    embedded: Backend, tmp_path: Path
) -> None:
    """A throttled read of a spilled value is the store's to retry, not a forged part: it
    passes on as Throttled (a TaskError would fail the job at once, blaming the table)."""
    rt, spec, commit = await _written(embedded, tmp_path, {0: [_pair("a"), _pair("b")]})

    async def throttled(batch: wire.Batch) -> bytes:
        raise Throttled("SlowDown")

    # The first batch, as if spilled: its pairs are fetched through `throttled`.
    url = lifecycle.shuffle_url(spec.scratch, JOB_ID, 0, ATTEMPT)
    pointer = wire.encode(
        wire.Batch(JOB_ID, 0, ATTEMPT, 0, 0, 1, b"", spec.scratch + "/spill", "00" * 32)
    )
    second = wire.encode(wire.Batch(JOB_ID, 0, ATTEMPT, 0, 1, 1, _pair("b")))
    data = wire.pack(pointer) + wire.pack(second)
    await embedded.blobs.put(url, data)
    digest = blake3(data).digest()[:PART_DIGEST]
    changed = dataclasses.replace(commit, parts={0: (0, len(data), digest)})
    with pytest.raises(Throttled):
        await bulk.read_part(rt, spec, 0, 0, changed, str(tmp_path / "out"), throttled)


def test_a_page_of_parts_is_checked() -> None:
    """A page is a table record: each way a stranger's could be wrong is refused."""
    from cmr.records import PAGE_PARTITIONS, MapPage

    d = b"x" * PART_DIGEST
    good = MapPage.of(
        1, {64: (0, 10, d), 70: (10, 5, d), 3: (15, 1, d)}, {64: 2, 70: 1, 3: 1}, {64: 9}
    )
    assert set(good.rows) == {64, 70}  # partition 3 is page 0's
    assert MapPage.from_item(good.to_item(), 1, 130) == good
    commit = MapCommit("abcdef012345", {}, {}, 7, 8, pages=3)
    assert good.commit_for(commit, 70).parts == {70: (10, 5, d)}
    assert good.commit_for(commit, 70).batches == {70: 1}
    assert good.commit_for(commit, 65).batches == {} and not good.commit_for(commit, 65).parts

    def page(rows: Any, number: int = 1) -> dict[str, Any]:
        return {"page": number, "rows": msgpack.packb(rows)}

    row = [64, 0, 10, 2, 9, d]
    bad = {
        "another page's number": page([row], 2),
        "a partition of another page": page([[3, 0, 10, 1, 1, d]]),
        "past the page": page([[64 + PAGE_PARTITIONS, 0, 10, 1, 1, d]]),
        "out of order": page([[70, 10, 5, 1, 1, d], row]),
        "overlapping parts": page([row, [70, 5, 5, 1, 1, d]]),
        "an empty part": page([[64, 0, 0, 1, 1, d]]),
        "no batches": page([[64, 0, 10, 0, 1, d]]),
        "a short digest": page([[64, 0, 10, 1, 1, b"x"]]),
        "a short row": page([[64, 0, 10, 1, d]]),
        "too many rows": page([[64 + i, i * 10, 10, 1, 1, d] for i in range(PAGE_PARTITIONS + 1)]),
        "rows not bytes": {"page": 1, "rows": "x"},
        "extra bytes": {"page": 1, "rows": msgpack.packb([row]) + b"\x00"},
        "a negative count": page([[64, 0, 10, -1, 1, d]]),
    }
    for why, item in bad.items():
        with pytest.raises(WireError, match="map page record is malformed"):
            MapPage.from_item(item, 1, 130)
        assert why
    with pytest.raises(WireError, match="partition 75 is out of order, or not of this page"):
        MapPage.from_item(page([[75, 0, 10, 1, 1, d]]), 1, 70)  # a job of 70 partitions
    with pytest.raises(WireError, match="a paged commit names counts"):
        MapCommit.from_item({**MapCommit("abcdef012345", {1: 1}, {1: 1}).to_item(), "pages": 2})


def test_many_reducers_poll_the_table_less_often_each() -> None:
    """Every reducer's poll reads the commits past its first unknown task, all under the
    job's one partition key (DynamoDB: at most 3,000 read units a second on it): a job's
    polls a second stay bounded however many reducers it has, and a small job's are as
    quick as before."""
    assert bulk.poll_intervals(3) == (0.25, 1.0)
    for partitions in (1, 64, 65, 130, 1280, 10_000):
        fast, most = bulk.poll_intervals(partitions)
        assert fast <= most and partitions / fast <= 256, partitions
    assert bulk.poll_intervals(1280) == (20.0, 40.0)
