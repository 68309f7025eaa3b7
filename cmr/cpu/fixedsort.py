"""Fixed-length records sorted as arrays: the shuffle of a step with neither map nor reduce
over fixed records (``fixed:<len>:<key_len>`` input, raw output) — TeraSort's.

Held as Python objects, such a sort costs ~2 µs a record in tuples, dereferences and
joins, and no faster sort exists for them. Here no record ever becomes an object: a chunk
is a numpy array of (key, value) records, partitioned by the range partitioner's cut points
with ``searchsorted``; a pair on the wire is msgpack's ``[bin key, bin value]``, which for
fixed lengths is a fixed-width row, so a map task writes rows as an array and a reducer
checks that every row of its spools has exactly that layout before it sorts them by key
(``argsort``, stable: equal keys keep their arrival order, as the general path keeps it).
What one path produces, the other reads: the bytes are msgpack's own, and spools that are
not all rows of one layout (pairs of another job's map, a later step) go the general way.

Keys compare as numpy's fixed-width bytes (``S<key_len>``), byte by byte and unsigned: for
keys of one length the order of Python's ``bytes`` (cmr's key order). A partition too big
for the memory budget is sorted in runs on disk, merged a block of each run at a time; its
spools, when they already are a few sorted runs (each piece a map task partitioned), are
merged as they lie.

Past ~400 lines for a reason: it holds both halves of one format, the rows a map task
writes and the reducer's reading, sorting and merging of them; kept together, what one
side writes is next to what the other side checks.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from cmr.cpu.runs import merge_in_passes
from cmr.partition import RangePartitioner

# What sorting holds per record beyond its bytes: a key copy, argsort's int64 index and its
# scratch (timsort's, up to half the indexes), and slack; small records cost mostly this.
SORT_OVERHEAD = 8 + 8 + 16
MIN_RUN = 1 << 20  # bytes of rows sorted at once at least, however small the budget
MIN_BLOCK = 16 * 1024  # bytes of a run read at once at least (cmr.cpu.reducing's read_size floor)
MAP_PIECE_RECORDS = 1 << 18  # records a map task partitions at once at most
# Sorted runs a reducer merges at once as they lie in its spools: a map task's part of a
# partition is one per piece it partitioned (a few per task).
NATURAL_RUNS_MAX = 256
Span = tuple[str, int, int]  # (path, start, end): a stretch of a file


def _bin_header(n: int) -> bytes:
    """msgpack's header of a bin of n bytes (bin 8, 16, 32)."""
    if n < 1 << 8:
        return bytes((0xC4, n))
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


@dataclass(frozen=True)
class Layout:
    """A (key, value) pair of bytes of these lengths, as msgpack packs it: a fixed-width row
    ``92 <bin header> key <bin header> value``."""

    key_len: int
    value_len: int

    @property
    def head(self) -> bytes:
        return b"\x92" + _bin_header(self.key_len)

    @property
    def mid(self) -> bytes:
        return _bin_header(self.value_len)

    @property
    def width(self) -> int:
        return len(self.head) + self.key_len + len(self.mid) + self.value_len

    @property
    def record_len(self) -> int:
        return self.key_len + self.value_len

    @property
    def held(self) -> int:
        """Bytes a reducer holds per record while sorting in memory: the row read, the
        record unpacked from it, the record sorted, and the sort's own."""
        return self.width + 2 * self.record_len + self.key_len + SORT_OVERHEAD

    def piece_records(self, piece_bytes: int) -> int:
        """Records a map task partitions at once, for about ``piece_bytes`` held: each
        costs its bytes, the reordered copy, its row, a partition and an index (int64)."""
        per = 2 * self.record_len + self.width + 16
        return max(1, min(MAP_PIECE_RECORDS, piece_bytes // per))

    def rows(self) -> np.dtype[Any]:
        return np.dtype(
            [
                ("h", f"V{len(self.head)}"),
                ("k", f"S{self.key_len}"),
                ("m", f"V{len(self.mid)}"),
                ("v", f"V{self.value_len}"),
            ]
        )

    def records(self) -> np.dtype[Any]:
        return np.dtype([("k", f"S{self.key_len}"), ("v", f"V{self.value_len}")])

    def pack(
        self, records: np.ndarray[Any, Any], order: np.ndarray[Any, Any]
    ) -> np.ndarray[Any, Any]:
        """Records, in ``order`` (indexes into them), as msgpack rows, bytes of shape
        (records, width). A record is gathered whole, as one opaque item (a field by field
        gather of the structured array took 2.5 times as long), then its key and value are
        copied into place around the two constant headers."""
        whole = np.take(np.ascontiguousarray(records).view(f"V{self.record_len}"), order)
        gathered = whole.view(np.uint8).reshape(len(whole), self.record_len)
        rows = np.empty((len(whole), self.width), np.uint8)
        h, k = len(self.head), self.key_len
        rows[:, :h] = np.frombuffer(self.head, np.uint8)
        rows[:, h : h + k] = gathered[:, :k]
        rows[:, h + k : h + k + len(self.mid)] = np.frombuffer(self.mid, np.uint8)
        rows[:, h + k + len(self.mid) :] = gathered[:, k:]
        return rows

    def unpack(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """Bytes of whole rows as records; None unless every row has this layout exactly."""
        if len(data) % self.width:
            return None
        rows = data.view(self.rows())
        if (
            not (rows["h"] == np.void(self.head)).all()
            or not (rows["m"] == np.void(self.mid)).all()
        ):
            return None
        records = np.empty(len(rows), self.records())
        records["k"] = rows["k"]
        records["v"] = rows["v"]
        return records


def _bin(head: bytes, at: int) -> tuple[int, int] | None:
    """(length, header bytes) of the bin whose header starts at ``at``; None unless it is
    one, in msgpack's smallest header for its length (what msgpack packs), of a byte or
    more."""
    size = {0xC4: 1, 0xC5: 2, 0xC6: 4}.get(head[at]) if at < len(head) else None
    if size is None or len(head) < at + 1 + size:
        return None
    n = int.from_bytes(head[at + 1 : at + 1 + size], "big")
    if n < 1 or _bin_header(n) != head[at : at + 1 + size]:
        return None
    return n, 1 + size


def head_needed(head: bytes) -> int:
    """Bytes of a row's start that ``layout_of`` needs, from at least its first 6."""
    key = _bin(head, 1)
    return 1 + key[1] + key[0] + 5 if key is not None else len(head)


def layout_of(head: bytes) -> Layout | None:
    """The layout of the row ``head`` starts (``head_needed`` bytes of it); None unless it
    is a pair of two bins."""
    if head[:1] != b"\x92" or (key := _bin(head, 1)) is None:
        return None
    value = _bin(head, 1 + key[1] + key[0])
    return Layout(key[0], value[0]) if value is not None else None


# The map side ----------------------------------------------------------------------------


class Cuts:
    """A total-order job's cut points as an array of keys, when they are all bytes of the
    records' key length (sampled keys are); else the step's records go the general way."""

    def __init__(self, layout: Layout, keys: np.ndarray[Any, Any], partitions: int) -> None:
        self.layout = layout
        self.keys = keys
        self.partitions = partitions

    @classmethod
    def of(
        cls, part: Any, partitions: int, key_len: int, record_len: int, floor: int
    ) -> Cuts | None:
        """None unless records of this shape are rows (a key and a value of at least a
        byte; a row small enough to batch whole: ``floor``) and ``part`` a range
        partitioner over such keys or a single partition."""
        layout = Layout(key_len, record_len - key_len)
        if not 1 <= key_len < record_len or layout.width > floor:
            return None
        if type(part) is not RangePartitioner:
            return cls(layout, np.empty(0, f"S{key_len}"), 1) if partitions == 1 else None
        cuts: Sequence[Any] = part.cuts
        if not all(type(c) is bytes and len(c) == key_len for c in cuts):
            return None
        # RangePartitioner sends a key to the part counting the cuts at or before it.
        return cls(layout, np.array(cuts, dtype=f"S{key_len}"), partitions)

    def partitioned(self, data: bytes | memoryview) -> Packed:
        """Whole records (``len(data)`` a multiple of the record length) as rows, grouped
        by partition, each partition's sorted by key (stably: equal keys in input order).
        Sorted here, a map task's part of a partition is a run its reducer can merge
        without sorting it again (``sort_spools``)."""
        records = np.frombuffer(data, self.layout.records())
        keys = np.ascontiguousarray(records["k"])
        order = key_order(keys)
        # Sorted by key is grouped by partition: a key's part counts the cuts at or before
        # it, so part p starts at the first key at or past cut p - 1. A plan may have fewer
        # cuts than partitions less one (a sample of few distinct keys): the parts past the
        # last cut's are empty.
        at = np.full(self.partitions + 1, len(records), np.int64)
        at[0] = 0
        at[1 : len(self.keys) + 1] = np.searchsorted(keys[order], self.keys, side="left")
        return Packed(self.layout, self.layout.pack(records, order), at)


@dataclass
class Packed:
    """A chunk's records as rows, partition by partition: ``rows[at[p]:at[p + 1]]``."""

    layout: Layout
    rows: np.ndarray[Any, Any]
    at: np.ndarray[Any, Any]

    def parts(self) -> Iterator[tuple[int, memoryview, int]]:
        """(partition, its rows' bytes, how many) of each partition with rows."""
        data = self.rows.reshape(-1).data
        w = self.layout.width
        for p in np.flatnonzero(np.diff(self.at)).tolist():
            a, b = int(self.at[p]), int(self.at[p + 1])
            yield p, data[a * w : b * w], b - a


# The reduce side -------------------------------------------------------------------------


def spools_layout(spools: list[str]) -> Layout | None:
    """The layout of the first row of the spools; None when they hold none or another kind
    of pair. Every row is checked against it as it is read (``unpack``)."""
    for spool in spools:
        with open(spool, "rb") as f:
            head = f.read(6)
            if head:
                return layout_of(head + f.read(head_needed(head) - len(head)))
    return None


def _read_rows(spools: list[str], layout: Layout, run_bytes: int) -> Iterator[np.ndarray[Any, Any]]:
    """The spools' rows, concatenated, in pieces of about run_bytes (whole rows)."""
    per = max(1, run_bytes // layout.width) * layout.width
    buf = np.empty(per, np.uint8)
    filled = 0
    for spool in spools:
        with open(spool, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf.data[filled:])
                if not got:
                    break
                filled += got
                if filled == per:
                    yield buf
                    buf, filled = np.empty(per, np.uint8), 0
    if filled:
        yield buf[:filled]


class NotRows(Exception):
    """The spools hold something other than rows of one layout: the general path reads them."""


def key_order(keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The stable sorting order of fixed-width byte keys (``S<n>``): equal keys keep their
    positions' order. Their first 8 bytes, as one big-endian integer, are sorted by
    numpy's quicksort (vectorised: a third of the time of a stable sort of the keys as
    bytes, which moves each key with a call of its own); the keys whose first 8 bytes
    some other key shares are then put in order among themselves by the whole key and by
    position. Random keys share almost none; keys that share many cost one more stable
    sort of those."""
    n, width = len(keys), keys.dtype.itemsize
    if n < 2:
        return np.arange(n)
    head = np.zeros((n, 8), np.uint8)
    head[:, : min(8, width)] = keys.view(np.uint8).reshape(n, width)[:, :8]
    first = head.view(">u8").reshape(n).astype(np.uint64)
    order = np.argsort(first)
    ranked = first[order]
    tie = ranked[1:] == ranked[:-1]
    if not tie.any():
        return order
    # The sorted positions in a run of equal first words: contiguous for each word, so
    # sorting them all together (by key, whose first 8 bytes are that word, then by
    # position) fills each run's positions with its own keys, in their order.
    shared = np.zeros(n, bool)
    shared[1:] |= tie
    shared[:-1] |= tie
    where = np.flatnonzero(shared)
    tied = np.sort(order[where])
    order[where] = tied[np.argsort(keys[tied], kind="stable")]
    return order


def sorted_records(records: np.ndarray[Any, Any], *, runs: bool = False) -> np.ndarray[Any, Any]:
    """The records sorted by key, stably. ``runs``: they are a few sorted runs laid end to
    end, which the stable sort of the keys (timsort) merges as it finds them, faster than
    ``key_order`` sorts them afresh. Each record is gathered whole, as one opaque item."""
    keys = np.ascontiguousarray(records["k"])
    order = np.argsort(keys, kind="stable") if runs else key_order(keys)
    whole = records.view(f"V{records.dtype.itemsize}")
    return np.take(whole, order).view(records.dtype)


def sort_spools(
    spools: list[str], memory_bytes: int, spill_dir: str, out: BinaryIO, runs: list[str]
) -> tuple[int, int]:
    """Write the spools' records sorted by key to ``out`` as raw records (key then value);
    how many, and how many sorted runs were spilled. Raises NotRows before writing anything
    when the spools are not rows of one layout. Past the memory budget, sorted runs are
    spilled (named in ``runs``, which the caller removes) and merged."""
    layout = spools_layout(spools)
    if layout is None:
        raise NotRows
    sizes = [os.path.getsize(s) for s in spools]
    if any(size % layout.width for size in sizes):  # a row cut between two spools is none
        raise NotRows
    total = sum(sizes)
    # More non-empty spools than runs merged at once: at least as many runs, no scan.
    many = sum(1 for size in sizes if size) > NATURAL_RUNS_MAX
    fits = total // layout.width * layout.held <= memory_bytes
    runs_in = [] if fits or many else _natural_runs(spools, layout)
    if runs_in and len(runs_in) <= NATURAL_RUNS_MAX:
        # Past the budget, yet already sorted runs (a map task's part of the partition, in
        # pieces: Cuts.partitioned): merged as they lie, without sorting them again.
        return _merge(runs_in, layout, memory_bytes, out), 0
    if total // layout.width * layout.held <= memory_bytes:
        pieces = list(_read_rows(spools, layout, max(1, total)))
        records = layout.unpack(pieces[0]) if pieces else np.empty(0, layout.records())
        if records is None:
            raise NotRows
        del pieces
        done = sorted_records(records)
        out.write(done.view(np.uint8).reshape(-1).data)
        return len(done), 0
    run_bytes = max(MIN_RUN, memory_bytes // layout.held * layout.width)
    mine: list[str] = []
    try:
        for rows in _read_rows(spools, layout, run_bytes):
            records = layout.unpack(rows)
            if records is None:
                raise NotRows
            del rows
            fd, path = tempfile.mkstemp(prefix="run-", suffix=".rows", dir=spill_dir)
            mine.append(path)
            runs.append(path)
            with os.fdopen(fd, "wb") as f:
                f.write(sorted_records(records).view(np.uint8).reshape(-1).data)
    except NotRows:
        # The general path spills runs of its own into ``runs``: none of these may be there.
        for path in mine:
            os.unlink(path)
            runs.remove(path)
        raise
    spilled = len(runs)

    def merged_run(group: list[str]) -> str:
        fd, path = tempfile.mkstemp(prefix="run-", suffix=".rows", dir=spill_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                _merge(group, layout, memory_bytes, f)
        except BaseException:
            os.unlink(path)
            raise
        for run in group:
            os.unlink(run)
        return path

    merge_in_passes(runs, merged_run)  # as the general path's runs, at most MERGE_FANIN open
    return _merge(runs, layout, memory_bytes, out), spilled


def _natural_runs(spools: list[str], layout: Layout) -> list[Span]:
    """The spools as their longest sorted runs, (path, start, end) in order, each a stretch
    of rows whose keys never fall: reading them costs one pass, comparing keys only. Rows
    must be whole (the caller checked each spool's size)."""
    found: list[Span] = []
    per = max(1, MIN_RUN // layout.width)
    for spool in spools:
        start, at, last = 0, 0, None
        with open(spool, "rb") as f:
            while data := f.read(per * layout.width):
                records = layout.unpack(np.frombuffer(data, np.uint8))
                if records is None:
                    raise NotRows
                keys = np.ascontiguousarray(records["k"])
                falls = np.flatnonzero(keys[1:] < keys[:-1]) + 1
                if last is not None and len(keys) and keys[0] < last:
                    falls = np.concatenate([[0], falls])
                for i in falls.tolist():
                    cut = (at + i) * layout.width
                    found.append((spool, start, cut))
                    start = cut
                    if len(found) > NATURAL_RUNS_MAX:
                        return found  # too many to merge at once: they are sorted instead
                at += len(keys)
                last = keys[-1] if len(keys) else last
        if at * layout.width > start:
            found.append((spool, start, at * layout.width))
            if len(found) > NATURAL_RUNS_MAX:
                return found
    return found


class _Run:
    """A sorted run on disk, read a block at a time: a file of raw records (a run this
    module spilled), or a stretch of a spool's rows (a Span: a map task's sorted piece)."""

    def __init__(self, run: str | Span, layout: Layout, rows: int) -> None:
        path, start, end = run if isinstance(run, tuple) else (run, 0, -1)
        self.f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the merge)
        self.f.seek(start)
        self.left = end - start if end >= 0 else -1  # bytes still to read; -1: to the end
        self.layout = layout if isinstance(run, tuple) else None  # rows to unpack
        self.dtype = layout.records()
        self.per = rows * (layout.width if self.layout is not None else layout.record_len)
        self.block = np.empty(0, self.dtype)
        self.ended = False

    def refill(self) -> None:
        want = self.per if self.left < 0 else min(self.per, self.left)
        data = self.f.read(want)
        while data and len(data) < want:  # a short read is not the end
            more = self.f.read(want - len(data))
            if not more:
                break
            data += more
        if self.left >= 0:
            self.left -= len(data)
        if len(data) < want or self.left == 0:
            self.ended = True
            self.f.close()
        if self.layout is not None:
            unpacked = self.layout.unpack(np.frombuffer(data, np.uint8))
            if unpacked is None:  # _natural_runs read it whole: the file changed since
                raise RuntimeError(f"{self.f.name} changed while it was merged")
            block = unpacked
        else:
            block = np.frombuffer(data, self.dtype)
        self.block = np.concatenate([self.block, block]) if len(self.block) else block


def _merge(paths: Sequence[str | Span], layout: Layout, memory_bytes: int, out: BinaryIO) -> int:
    """The sorted runs merged, equal keys in run order (a stable sort of their
    concatenation): each round emits every record that sorts at or before the smallest
    (last key of its block, run) of the runs with more to read, then refills that run."""
    # Each round holds the runs' blocks, what it takes of them (at most as much), its keys,
    # their order and the records sorted: about the sort's bytes per record, all runs.
    rows = max(1, MIN_BLOCK // layout.record_len, memory_bytes // (len(paths) * layout.held))
    runs = [_Run(p, layout, rows) for p in paths]
    written = 0
    try:
        for r in runs:
            r.refill()
        while True:
            open_runs = [i for i, r in enumerate(runs) if not r.ended]
            taken = []
            if not open_runs:
                taken = [r.block for r in runs]
                for r in runs:
                    r.block = r.block[:0]
            else:
                bound_run = min(open_runs, key=lambda i: (runs[i].block["k"][-1], i))
                bound = runs[bound_run].block["k"][-1:]
                for i, r in enumerate(runs):
                    side: Literal["left", "right"] = "right" if i <= bound_run else "left"
                    n = int(np.searchsorted(r.block["k"], bound, side=side)[0])
                    taken.append(r.block[:n])
                    r.block = r.block[n:]
            merged = sorted_records(np.concatenate(taken), runs=True)
            out.write(merged.view(np.uint8).reshape(-1).data)
            written += len(merged)
            if not open_runs:
                return written
            for i in open_runs:
                if not len(runs[i].block):
                    runs[i].refill()
    finally:
        for r in runs:
            if not r.f.closed:
                r.f.close()
