"""The reduce of a job without combine holds its pairs as a sorted list (cmr.cpu.runs'
sorted-pairs path) while every key is of one plain kind (str, int or bytes), and groups in
a dict as before once a key of another kind arrives; a step without map hands the shuffle
whole blocks of records; raw output of bytes is written by C. Each must give what the
general path gives: every pair once, keys in sort_key order, each key's values in arrival
order, spilled or not."""

from __future__ import annotations

import itertools
import json
import os
import random
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cpu.reducing import run_reduce
from cmr.cpu.results import ReduceResult
from cmr.cpu.specs import ReduceSpec
from cmr.errors import JobFailed
from cmr.job import JobRef
from cmr.settings import WorkerSettings
from cmr.usercode import sort_key

from .spooling import spool_files

LISTING = """
import cmr


class Listing(cmr.Job):
    output_format = "jsonlines"

    def map(self, key, value):
        yield key, value

    def reduce(self, key, values):
        yield key, list(values)
"""

SORT = """
import cmr


class Sort(cmr.Job):
    input_format = "fixed:{record}:{key}"
    output_format = "raw"
    reducers = 3

    def steps(self):
        return [cmr.Step()]  # neither map nor reduce: the shuffle sorts


class TotalSort(Sort):
    total_order = True


class WideSort(Sort):
    reducers = 40  # a block of records spreads over more partitions than add_block splits


class JsonPass(cmr.Job):
    input_format = "jsonlines"

    def steps(self):
        return [cmr.Step()]


class Scaled(cmr.Job):
    input_format = "fixed:{record}:{key}"
    output_format = "raw"
    total_order = True

    def steps(self):
        return [cmr.Step(map=self.scaled, map_init=self.start)]

    def start(self):
        self.factor = 1  # what map needs: set before any record, at submit's sampling too

    def scaled(self, key, value):
        yield key * self.factor, value


class KeysOnly(cmr.Job):
    input_format = "fixed:{record}:{key}"
    output_format = "raw"

    def map(self, key, value):
        yield key, None  # raw writes None as nothing

    reduce = None


class TextValues(cmr.Job):
    input_format = "fixed:{record}:{key}"
    output_format = "raw"

    def map(self, key, value):
        yield key, value.decode("latin-1")  # a str: raw refuses it

    reduce = None
"""


def _reduce(tmp_path: Path, spools: list[str], memory: int) -> tuple[ReduceResult, list[Any]]:
    job = tmp_path / "listing.py"
    job.write_text(LISTING)
    out = tmp_path / f"out-{memory}"
    spill = tmp_path / f"spill-{memory}"
    spill.mkdir()
    ref = JobRef.parse(str(job))
    result = run_reduce(ref, {}, spools, ReduceSpec("sorted-reduce", str(out), memory, str(spill)))
    assert os.listdir(spill) == []  # runs removed however the task ended
    lines = out.read_text().splitlines() if out.exists() else []
    return result, [json.loads(line) for line in lines]


def _expected(groups: list[list[tuple[Any, Any]]]) -> list[Any]:
    """Keys in sort_key order, each key's values in the order the spools hold them, as the
    jsonlines output writes them (tuples as lists)."""
    held: dict[Any, list[Any]] = {}
    for k, v in itertools.chain.from_iterable(groups):
        held.setdefault(k, []).append(v)
    rows: list[Any] = json.loads(json.dumps([[k, held[k]] for k in sorted(held, key=sort_key)]))
    return rows


@pytest.mark.parametrize("memory", [64 << 20, 4096], ids=["in memory", "spilled"])
def test_one_kind_of_key_sorts_and_keeps_arrival_order(tmp_path: Path, memory: int) -> None:
    groups = [
        [(f"k{(i * 7919) % 500:03d}", i) for i in range(2000)],
        [(f"k{(i * 31) % 700:03d}", -i) for i in range(3000)],
    ]
    result, rows = _reduce(tmp_path, spool_files(tmp_path, groups), memory)
    assert result.error == ""
    assert rows == _expected(groups)
    assert result.records_out == len(rows)
    assert (result.spills > 0) == (memory == 4096)


@pytest.mark.parametrize("memory", [64 << 20, 4096], ids=["in memory", "spilled"])
def test_a_second_kind_of_key_falls_back_to_grouping(tmp_path: Path, memory: int) -> None:
    # Blocks of str keys first (held, and spilled past the small budget), then int keys
    # and tuple keys: the general path takes over from the pairs already held.
    groups: list[list[tuple[Any, Any]]] = [
        [(f"s{i % 900}", i) for i in range(9000)],
        [(i % 300, i) for i in range(3000)] + [((i % 5, "t"), i) for i in range(50)],
        [(f"s{i % 7}", -i) for i in range(100)],
    ]
    result, rows = _reduce(tmp_path, spool_files(tmp_path, groups), memory)
    assert result.error == ""
    assert rows == _expected(groups)


def test_a_spooled_record_that_is_not_a_pair_fails_the_task(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.write_bytes(msgpack.packb(("a", 1)) + msgpack.packb(("b", 2, 3)))
    result, _ = _reduce(tmp_path, [str(spool)], 64 << 20)
    assert "not a [key, value] pair" in result.error


def _records(n: int, record: int, key: int, seed: int = 7) -> bytes:
    rnd = random.Random(seed)
    return b"".join(
        rnd.randbytes(key) + struct.pack(">I", i) + bytes(record - key - 4) for i in range(n)
    )


@pytest.mark.parametrize("compress", [True, False], ids=["zstd bodies", "plain bodies"])
@pytest.mark.parametrize("job", ["Sort", "TotalSort", "WideSort"])
async def test_a_step_without_map_or_reduce_sorts_every_record(
    embedded: Backend, tmp_path: Path, compress: bool, job: str
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    data = _records(30_000, 20, 4)
    (src / "a.bin").write_bytes(data[: 20 * 12_000])
    (src / "b.bin").write_bytes(data[20 * 12_000 :])
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=20, key=4))
    result = await run_on(
        embedded, f"{code}:{job}", str(src), str(tmp_path / "out"),
        worker_settings=WorkerSettings(compress=compress),
    )  # fmt: skip
    records = [data[i : i + 20] for i in range(0, len(data), 20)]
    parts = [Path(p).read_bytes() for p in result.parts]
    got = [[p[i : i + 20] for i in range(0, len(p), 20)] for p in parts]
    for part in got:  # each part in key order, equal keys in any order
        assert [r[:4] for r in part] == sorted(r[:4] for r in part)
    assert sorted(itertools.chain.from_iterable(got)) == sorted(records)
    assert result.record["records_in"] == len(records)
    if job == "TotalSort":  # the parts concatenate into one sorted sequence
        whole = b"".join(parts)
        keys = [whole[i : i + 4] for i in range(0, len(whole), 20)]
        assert keys == sorted(keys)


async def test_records_past_half_a_message_go_by_blob(embedded: Backend, tmp_path: Path) -> None:
    # A record bigger than half a shuffle message is sent as a spilled pair, whole.
    record = 300_000
    src = tmp_path / "in"
    src.mkdir()
    data = b"".join(bytes([k]) * 8 + bytes([k % 7]) * (record - 8) for k in (9, 3, 7, 1, 5))
    (src / "big.bin").write_bytes(data)
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=record, key=8))
    result = await run_on(embedded, f"{code}:Sort", str(src), str(tmp_path / "out"), reducers=1)
    out = Path(result.parts[0]).read_bytes()
    assert [out[i] for i in range(0, len(out), record)] == [1, 3, 5, 7, 9]
    assert sorted(out[i : i + record] for i in range(0, len(out), record)) == sorted(
        data[i : i + record] for i in range(0, len(data), record)
    )


async def test_raw_output_of_none_writes_the_keys_alone(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"b-xxa-yyc-zz")
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=4, key=2))
    result = await run_on(embedded, f"{code}:KeysOnly", str(src), str(tmp_path / "out"), reducers=1)
    assert Path(result.parts[0]).read_bytes() == b"a-b-c-"


async def test_raw_output_refuses_a_str_value_naming_it(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"b-xxa-yy")
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=4, key=2))
    with pytest.raises(
        JobFailed, match=r"TextValues.reduce yielded \(b'a-' .*'yy' \(a str\)\).*bytes or None"
    ):
        await run_on(embedded, f"{code}:TextValues", str(src), str(tmp_path / "out"), reducers=1)
    assert not list((tmp_path / "out").glob("part-*"))  # nothing published


def test_big_values_are_counted_before_a_block_is_held(tmp_path: Path) -> None:
    # 300 values of 200 KB under a 4 MB budget: blocks follow the bytes per pair, so the
    # budget is checked every few pairs (a block of 4,096 pairs would hold all 60 MB).
    value = bytes(200_000)
    groups = [[(f"k{i:03d}", value) for i in range(300)]]
    job = tmp_path / "listing.py"
    job.write_text(LISTING.replace('output_format = "jsonlines"', 'output_format = "pairs"'))
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out"
    ref = JobRef.parse(str(job))
    spools = spool_files(tmp_path, groups)
    result = run_reduce(ref, {}, spools, ReduceSpec("big-values", str(out), 4 << 20, str(spill)))
    assert result.error == ""
    assert result.spills >= 10
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=1 << 27)
    unpacker.feed(out.read_bytes())
    got = list(unpacker)
    assert got == [(f"k{i:03d}", (value,)) for i in range(300)]


async def test_a_record_that_is_not_wire_data_is_named(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"n": 1}\n18446744073709551616\n')
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=4, key=2))
    with pytest.raises(JobFailed, match=r"18446744073709551616.*outside the 64-bit range"):
        await run_on(embedded, f"{code}:JsonPass", str(src), str(tmp_path / "out"), reducers=1)


async def test_total_order_samples_after_map_init(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    data = _records(2_000, 20, 4)
    src.write_bytes(data)
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=20, key=4))
    result = await run_on(embedded, f"{code}:Scaled", str(src), str(tmp_path / "out"), reducers=3)
    whole = b"".join(Path(p).read_bytes() for p in result.parts)
    keys = [whole[i : i + 4] for i in range(0, len(whole), 20)]
    assert keys == sorted(keys) and len(keys) == 2_000
