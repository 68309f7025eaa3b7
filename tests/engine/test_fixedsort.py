"""Fixed records sorted as arrays (cmr.cpu.fixedsort): a map task packs them as msgpack rows,
partitioned by the cut points; a reducer checks every row's layout and sorts them by key.
Each must give byte for byte what the general path gives (every pair once, keys in bytes
order, equal keys in arrival order), in memory, spilled, merged in passes; and spools of
other pairs go the general way, whatever the fast path had begun."""

from __future__ import annotations

import bisect
import itertools
import operator
import os
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cmr import wire
from cmr.cpu import fixedsort
from cmr.cpu.mapping import FileSlice, run_map
from cmr.cpu.reducing import run_reduce
from cmr.cpu.results import ReduceResult
from cmr.cpu.runs import MERGE_FANIN
from cmr.cpu.specs import MapSpec, ReduceSpec
from cmr.job import JobRef
from cmr.virtualtime import in_virtual_time

from .spooling import spool_files

SORT = """
import cmr


class Sort(cmr.Job):
    input_format = "fixed:{record}:{key}"
    output_format = "raw"

    def steps(self):
        return [cmr.Step()]
"""
KEY, RECORD = 10, 100


def _job(tmp_path: Path) -> JobRef:
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=RECORD, key=KEY))
    return JobRef.parse(f"{code}:Sort")


def _pairs(n: int, seed: int, value_len: int = RECORD - KEY) -> list[tuple[bytes, bytes]]:
    """Keys from a few bytes (NUL and 0xff among them: many repeats, trailing NULs), each
    value naming where it came from, so arrival order shows in the output."""
    rnd = random.Random(seed)
    return [
        (
            bytes(rnd.choice(b"\x00\x01\x41\x42\xff") for _ in range(KEY)),
            (b"%03d%09d" % (seed, i)).ljust(value_len, b"v")[:value_len],
        )
        for i in range(n)
    ]


def _reduce(tmp_path: Path, spools: list[str], memory: int) -> tuple[ReduceResult, bytes]:
    out = tmp_path / f"out-{memory}"
    spill = tmp_path / f"spill-{memory}"
    spill.mkdir()
    result = run_reduce(
        _job(tmp_path), {}, spools, ReduceSpec("fixed-sort", str(out), memory, str(spill))
    )
    assert result.error == ""
    assert os.listdir(spill) == []  # runs removed however the task ended
    return result, out.read_bytes()


def _expected(groups: list[list[tuple[Any, Any]]]) -> bytes:
    """The general path's output: the spools' pairs in order, sorted stably by key."""
    pairs = sorted(itertools.chain.from_iterable(groups), key=operator.itemgetter(0))
    return b"".join(k + v for k, v in pairs)


@pytest.mark.parametrize(
    ("memory", "min_run", "spilled"),
    [(64 << 20, None, False), (0, 16 * 1024, True), (0, 2 * 1024, True)],
    ids=["in memory", "spilled", "merged in passes"],
)
def test_rows_sort_as_the_general_path_sorts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: int, min_run: int | None, spilled: bool
) -> None:
    if min_run is not None:
        # Runs this small make a partition of ~1.5 MB ~80 runs (past a merge's 64): what a
        # spill of a 30 GB partition does with the default budget.
        monkeypatch.setattr(fixedsort, "MIN_RUN", min_run)
        monkeypatch.setattr(fixedsort, "MIN_BLOCK", 1024)
    groups = [_pairs(6000, 1), _pairs(5000, 2), _pairs(4000, 3)]
    result, out = _reduce(tmp_path, spool_files(tmp_path, groups), memory)
    assert out == _expected(groups)
    assert result.records_out == 15_000
    assert (result.spills > 0) == spilled
    if min_run == 2 * 1024:
        assert result.spills > MERGE_FANIN
    with open(tmp_path / "direct", "wb") as f:  # the path run_reduce took: this one
        assert fixedsort.sort_spools(spool_files(tmp_path, groups), memory, str(tmp_path), f, [])[0]
    assert (tmp_path / "direct").read_bytes() == out


def test_spools_of_sorted_runs_are_merged_without_sorting_again(tmp_path: Path) -> None:
    """What map tasks write since they sort each piece (Cuts.partitioned): spools of a few
    sorted runs each. Past the budget they are merged as they lie, nothing spilled, with
    equal keys in arrival order, as a stable sort of the spools would leave them."""

    def runs(seed: int, pieces: int) -> list[tuple[bytes, bytes]]:
        pairs = _pairs(900 * pieces, seed)
        return list(
            itertools.chain.from_iterable(
                sorted(pairs[i : i + 900], key=operator.itemgetter(0))
                for i in range(0, len(pairs), 900)
            )
        )

    groups = [runs(1, 3), runs(2, 1), runs(3, 4)]
    result, out = _reduce(tmp_path, spool_files(tmp_path, groups), 0)
    assert out == _expected(groups)
    assert result.records_out == 900 * 8
    assert result.spills == 0  # merged as they lay: no run written


@pytest.mark.parametrize("memory", [64 << 20, 0], ids=["in memory", "spilled"])
def test_spools_of_other_pairs_go_the_general_way(tmp_path: Path, memory: int) -> None:
    # Rows of one layout first (sorted into runs when spilled), then values of another
    # length: the layout check refuses them and the general path does the whole partition.
    groups = [_pairs(30_000, 1), _pairs(500, 2, value_len=40), _pairs(100, 3)]
    result, out = _reduce(tmp_path, spool_files(tmp_path, groups), memory)
    assert out == _expected(groups)
    assert result.records_out == 30_600


def test_a_row_with_another_header_is_not_a_row(tmp_path: Path) -> None:
    # A str key packs as a str header (0xaa), not bin: the same width, another layout.
    groups: list[list[tuple[Any, Any]]] = [
        _pairs(50, 1),
        [("A" * KEY, b"v" * (RECORD - KEY))],
        _pairs(50, 2),
    ]
    spools = spool_files(tmp_path, groups)
    assert fixedsort.spools_layout(spools) == fixedsort.Layout(KEY, RECORD - KEY)
    with open(tmp_path / "out", "wb") as out, pytest.raises(fixedsort.NotRows):
        fixedsort.sort_spools(spools, 64 << 20, str(tmp_path), out, [])
    assert (tmp_path / "out").stat().st_size == 0  # nothing written before the check
    spec = ReduceSpec("fixed-sort", str(tmp_path / "out2"), 64 << 20, str(tmp_path))
    result = run_reduce(_job(tmp_path), {}, spools, spec)
    assert "Sort.reduce yielded ('AAAAAAAAAA'" in result.error  # the general path's diagnosis


@pytest.mark.parametrize(
    "head",
    [b"", b"\x92", b"\x93\xc4\x01a\xc4\x01b", b"\x92\xc5\x00\x05abcde\xc4\x01b", b"\x92\xc4\x00"],
    ids=["empty", "short", "three items", "a bigger header than msgpack's", "an empty key"],
)
def test_a_spool_head_that_is_no_row_has_no_layout(head: bytes) -> None:
    assert fixedsort.layout_of(head + bytes(64)) is None
    assert fixedsort.layout_of(head) is None
    assert fixedsort.layout_of(head[: fixedsort.head_needed(head[:6])]) is None


def test_layouts_read_back_as_msgpack_packs_them() -> None:
    for key_len, value_len in [(1, 1), (10, 90), (255, 256), (300, 70_000)]:
        row = msgpack.packb((b"k" * key_len, b"v" * value_len), use_bin_type=True)
        layout = fixedsort.layout_of(row[: fixedsort.head_needed(row[:6])])
        assert layout == fixedsort.Layout(key_len, value_len)
        assert layout.width == len(row)


def _records(n: int, seed: int) -> bytes:
    return b"".join(k + v for k, v in _pairs(n, seed))


@pytest.mark.parametrize("cuts", [(), (b"\x01" * KEY,), (b"\x00" * KEY, b"A" * KEY, b"B\xff" * 5)])
@pytest.mark.parametrize("spare", [0, 3], ids=["a cut per partition", "fewer cuts"])
def test_a_map_task_packs_rows_partitioned_and_sorted_by_piece(
    tmp_path: Path, cuts: tuple[bytes, ...], spare: int
) -> None:
    """``spare``: partitions past the cuts' (a plan's sample of few distinct keys has fewer
    cuts than partitions less one: the parts past the last cut's get nothing)."""
    data = [_records(7000, 1), _records(3000, 2)]
    partitions = len(cuts) + 1 + spare
    spec = MapSpec(
        "fixed-map", 0, "a1", partitions, 256 * 1024, str(tmp_path),
        piece_bytes=64 * 1024,  # several pieces a chunk
        input_format=f"fixed:{RECORD}:{KEY}", cuts=cuts,
    )  # fmt: skip
    result = run_map(_job(tmp_path), {}, [("a", data[0]), ("b", data[1])], spec)
    assert result.error == ""
    assert result.records_in == 10_000
    got: dict[int, list[tuple[bytes, bytes]]] = {}
    with open(result.spool, "rb") as f:
        for p, _, n, body, spilled in msgpack.Unpacker(f, raw=False, use_list=False):
            assert not spilled
            batch = wire.decode(body)
            assert isinstance(batch, wire.Batch) and batch.partition == p
            pairs = list(wire.iter_pairs(batch.pairs))
            assert len(pairs) == n
            got.setdefault(p, []).extend(pairs)
    whole = b"".join(data)
    records = [
        (whole[i : i + KEY], whole[i + KEY : i + RECORD]) for i in range(0, len(whole), RECORD)
    ]
    want: dict[int, list[tuple[bytes, bytes]]] = {}
    for k, v in records:
        want.setdefault(bisect.bisect_right(cuts, k), []).append((k, v))
    # Each piece's part of a partition is sorted by key, equal keys in input order: the
    # partition's records, sorted stably, are the same as a stable sort of its input...
    assert {p: sorted(rs, key=lambda r: r[0]) for p, rs in got.items()} == {
        p: sorted(rs, key=lambda r: r[0]) for p, rs in want.items()
    }
    # ...and arrive as at most one sorted run per piece a chunk was cut into.
    per = fixedsort.Layout(KEY, RECORD - KEY).piece_records(spec.piece_bytes)
    pieces = sum(-(-len(d) // (per * RECORD)) for d in data)
    for rs in got.values():
        falls = sum(1 for a, b in itertools.pairwise(rs) if b[0] < a[0])
        assert falls < pieces, (falls, pieces)
    assert result.records == [len(want.get(p, [])) for p in range(partitions)]


def test_runs_spilled_before_another_layout_are_not_the_general_paths(tmp_path: Path) -> None:
    # Review: rows of one layout past a run (spilled, sorted, as raw records), then pairs of
    # the same width but another layout (a 9-byte key, a 91-byte value): the spools' size
    # check passes, the row check refuses them; the general path must not merge the raw
    # runs as its own msgpack runs ("TypeError: 'int' object is not subscriptable").
    odd = [(k[:9], v + b"x") for k, v in _pairs(2000, 9)]
    groups = [_pairs(20_000, 1), odd, _pairs(3000, 2)]
    assert len({len(msgpack.packb(p[0])) for p in groups}) == 1  # one width
    result, out = _reduce(tmp_path, spool_files(tmp_path, groups), 0)
    assert out == _expected(groups)
    assert result.records_out == 25_000


def test_a_row_cut_between_two_spools_is_not_a_row(tmp_path: Path) -> None:
    # Review: spool 0's last row ends in spool 1 (the concatenation is whole rows): the
    # layout check alone would take it; each spool must hold whole rows.
    spools = spool_files(tmp_path, [_pairs(100, 1), _pairs(100, 2)])
    first, second = Path(spools[0]), Path(spools[1])
    data = first.read_bytes()
    first.write_bytes(data[:-40])
    second.write_bytes(data[-40:] + second.read_bytes())
    with open(tmp_path / "out", "wb") as out, pytest.raises(fixedsort.NotRows):
        fixedsort.sort_spools(spools, 64 << 20, str(tmp_path), out, [])


def test_a_spool_cut_inside_a_record_fails_the_task(tmp_path: Path) -> None:
    # Review: msgpack stops quietly at a record cut short; its pairs were lost, silently.
    spools = spool_files(tmp_path, [[(b"k%d" % i, b"v" * i) for i in range(50)]])
    Path(spools[0]).write_bytes(Path(spools[0]).read_bytes()[:-3])
    spec = ReduceSpec("fixed-sort", str(tmp_path / "out"), 64 << 20, str(tmp_path))
    result = run_reduce(_job(tmp_path), {}, spools, spec)
    assert "a spool ends inside a record" in result.error


def test_a_jobs_own_partition_is_called_with_one_reducer(tmp_path: Path) -> None:
    # Review: one partition needs no cut points, but a job's own partition() still runs
    # for every record (its mistakes are reported as on the general path).
    code = tmp_path / "own.py"
    code.write_text(
        SORT.format(record=RECORD, key=KEY)
        + "\n\nclass Own(Sort):\n"
        + "    def partition(self, key, n):\n"
        + "        raise ValueError('mine')\n"
    )
    spec = MapSpec(
        "fixed-own", 0, "a1", 1, 256 * 1024, str(tmp_path), input_format=f"fixed:{RECORD}:{KEY}"
    )
    result = run_map(JobRef.parse(f"{code}:Own"), {}, [("a", _records(10, 1))], spec)
    assert "ValueError: mine" in result.error


def test_small_records_are_partitioned_in_bounded_pieces() -> None:
    # Review: a piece of 2-byte records held ~12x its bytes (indexes, copies, rows).
    tiny, tera = fixedsort.Layout(1, 1), fixedsort.Layout(KEY, RECORD - KEY)
    piece = 32 << 20
    for layout in (tiny, tera):
        n = layout.piece_records(piece)
        assert n * (2 * layout.record_len + layout.width + 16) <= piece
    assert tera.piece_records(piece) * RECORD >= piece // 4  # big records: big pieces still


def test_a_slice_of_a_local_file_is_read_by_the_map_task(tmp_path: Path) -> None:
    # Fixed records in local files reach the pool as slices, read there (not pickled).
    data = _records(500, 1)
    (tmp_path / "in.bin").write_bytes(b"x" * RECORD + data)
    spec = MapSpec(
        "fixed-slice", 0, "a1", 1, 256 * 1024, str(tmp_path), input_format=f"fixed:{RECORD}:{KEY}"
    )
    whole = FileSlice(str(tmp_path / "in.bin"), RECORD, RECORD + len(data))
    result = run_map(_job(tmp_path), {}, [("in.bin", whole)], spec)
    assert result.error == ""
    assert (result.records_in, result.bytes_in) == (500, len(data))
    gone = FileSlice(str(tmp_path / "gone.bin"), 0, RECORD)
    result = run_map(_job(tmp_path), {}, [("gone.bin", gone)], spec)
    assert "input gone.bin (" in result.error
    assert "cannot be read (No such file or directory)" in result.error
    assert result.permanent  # gone since the worker looked: no retry would read it


@pytest.mark.parametrize("action", ["deleted", "directory"])
@in_virtual_time
async def test_fixed_input_gone_mid_job_fails_it_at_once(tmp_path: Path, action: str) -> None:
    # Review: slices read by the pool turned a vanished input into a retried failure (4-15
    # attempts, no URL named); as the blob path does, the job fails at once, naming it.
    from cmr.backends.faults import FaultPlan
    from cmr.pool import cpu_pool
    from cmr.settings import WorkerSettings
    from cmr.testing import chaos_run

    data = tmp_path / "in"
    data.mkdir()
    (data / "keep.bin").write_bytes(_records(200, 1))
    (data / "victim.bin").write_bytes(_records(200, 2))
    code = tmp_path / "sort.py"
    code.write_text(SORT.format(record=RECORD, key=KEY))
    victim = data / "victim.bin"

    async def delete_after_first_commit(rt: Any, step: str, context: dict[str, Any]) -> None:
        # Local inputs are read through a checked descriptor, not the blob store: the file
        # goes once one map task (of 10, one at a time) has read its input and committed.
        if step == "map.committed" and victim.is_file():
            victim.unlink()
            if action == "directory":
                victim.mkdir()

    with cpu_pool(1) as pool:
        run = await chaos_run(
            f"{code}:Sort", data, tmp_path / "out", seed=0, pool=pool, plan=FaultPlan(seed=0),
            workers=1, reducers=2, split_bytes=4000, hooks=[delete_after_first_commit],
            clientless=True, timeout_s=120,
            settings=WorkerSettings(map_slots=1, reduce_slots=2, processes=1, memory_mb=1),
        )  # fmt: skip
    assert run.record["state"] == "failed"
    error = run.record["error"]
    assert "failed, and would fail again" in error
    assert "victim.bin (file://" in error and "no longer exists" in error
    assert not run.record.get("tasks_retried")
    assert run.leftovers == []


@pytest.mark.parametrize("width", [1, 3, 8, 9, 10, 17])
@pytest.mark.parametrize("alphabet", [b"\x00\xff", b"\x00\x01\x41\x42\xff", bytes(range(256))])
def test_key_order_is_a_stable_sort_of_the_keys_as_bytes(width: int, alphabet: bytes) -> None:
    """key_order sorts by the first 8 bytes as an integer and settles shared ones apart:
    its order must be exactly Python's stable sort of the keys as bytes, whatever the keys
    share (two letters: nearly every key shares its first word; NULs trailing and
    leading), for keys shorter and longer than the word."""
    import numpy as np

    rnd = random.Random(width * 1000 + len(alphabet))
    for n in (0, 1, 2, 50, 3000):
        keys = [bytes(rnd.choice(alphabet) for _ in range(width)) for _ in range(n)]
        if n > 2:  # some keys differing only past their first word, and exact repeats
            keys[1] = keys[0][:-1] + bytes([keys[0][-1] ^ 1])
            keys[2] = keys[0]
        want = sorted(range(n), key=keys.__getitem__)
        got = fixedsort.key_order(np.array(keys, dtype=f"S{width}")).tolist()
        assert got == want
