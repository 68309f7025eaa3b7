"""Cutting the input into map tasks, and reading exactly the records a split owns.

A split is a byte range [start, end) of one input; it owns every line that *starts* inside
it, so a line that crosses a boundary is read whole by the split where it begins and
skipped by the next. Every line of every input is therefore read exactly once, however
the ranges fall (the 2009 implementation cut words at split edges; this does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cmr.backends.base import Blobs
from cmr.formats import LINES, InputFormat
from cmr.wire import Range

LOOKAHEAD = 64 * 1024  # bytes read past a split's end to finish its last line, per round
# Small files packed into one task: each distinct key of a task's map output is combined
# and shuffled once per task, so many small tasks cost per key (20,000 files of word count:
# 50 tasks of 400 files, 7.4 s; 10 of 2,000, see benchmarks/RESULTS.md). A task message
# names its task only (the ranges are in the plan: cmr.plan caps them at twice this).
MAX_RANGES_PER_TASK = 2_000
MIB = 1024 * 1024


@dataclass(frozen=True)
class Input:
    url: str
    size: int
    name: str
    codec: str = ""  # its compression (cmr.formats.sniff): a whole-file task


SPLIT_OF_BUDGET = 8  # a worker holds a running split a few times over (read, sent, mapped)


def choose_split_bytes(total: int, parallelism: int, memory_bytes: int | None = None) -> int:
    """Enough splits to keep every slot busy with some left for balance, none tiny or huge.
    With the workers' memory budget known, a split is at most budget / SPLIT_OF_BUDGET (and
    at least 4 MiB): otherwise a worker's memory grows with the input through its splits,
    whatever its reducers' budget (benchmarks/RESULTS.md, growth)."""
    cap = 64 * MIB
    if memory_bytes is not None:
        cap = min(cap, max(4 * MIB, memory_bytes // SPLIT_OF_BUDGET))
    target = total // max(1, 4 * parallelism)
    return max(MIB, min(cap, target))


SLIVER = 10  # a file's last 1/SLIVER of a split is folded into the range before it


def never_cut(size: int, split_bytes: int) -> bool:
    """Whether ``plan`` keeps a file of this size whole whatever its codec: its remainder
    is always a sliver (so its compression need not be known before the worker reads it)."""
    return size < split_bytes // SLIVER


def plan(
    inputs: Sequence[Input], split_bytes: int, fmt: InputFormat = LINES
) -> list[tuple[Range, ...]]:
    """Group inputs into map tasks of about split_bytes: big files are cut into ranges,
    small files are packed together so many small files do not mean many tiny tasks.
    A compressed file, or any file of a format that cannot be cut (csv, whole, pairs), is
    one range, whole; fixed records are cut at multiples of the record length."""
    tasks: list[tuple[Range, ...]] = []
    pending: list[Range] = []
    pending_bytes = 0
    align = fmt.record_len if fmt.name == "fixed" else 1
    for inp in inputs:
        if inp.size == 0:
            continue  # an empty input has no records
        whole = bool(inp.codec) or not fmt.splittable
        start = 0
        while start < inp.size:
            end = min(inp.size, start + split_bytes - pending_bytes)
            if align > 1:
                # Never inside a record: a range holds whole records (at least one).
                end = min(inp.size, start + max(align, (end - start) // align * align))
            if whole or inp.size - end < split_bytes // SLIVER:
                end = inp.size  # a sliver left over would be a whole extra task; fold it in
            pending.append(Range(inp.url, start, end, inp.name))
            pending_bytes += end - start
            start = end
            if pending_bytes >= split_bytes or len(pending) >= MAX_RANGES_PER_TASK:
                tasks.append(tuple(pending))
                pending, pending_bytes = [], 0
    if pending:
        tasks.append(tuple(pending))
    return tasks


async def read_split(blobs: Blobs, r: Range, size: int | None = None) -> bytes:
    """The bytes of every line that starts in [r.start, r.end), each ending in ``\\n``
    except possibly the input's last line."""
    if r.start >= r.end:
        return b""
    lo = max(0, r.start - 1)
    data = await blobs.get_range(r.url, lo, r.end + LOOKAHEAD)
    fetched_to = lo + len(data)
    eof = len(data) < r.end + LOOKAHEAD - lo
    begin = 0
    if r.start > 0:
        # The byte before start tells whether a line starts exactly at start; otherwise
        # the first line starting in range is the one after the next newline.
        while True:
            nl = data.find(b"\n")
            if nl >= 0:
                begin = nl + 1
                break
            if eof:
                return b""
            more = await blobs.get_range(r.url, fetched_to, fetched_to + LOOKAHEAD)
            eof = len(more) < LOOKAHEAD
            # Nothing before the newline matters: drop it to keep memory flat on huge lines.
            lo, data, fetched_to = fetched_to, more, fetched_to + len(more)
        if lo + begin >= r.end:
            return b""  # the line that starts in range begins at or after end: not ours
    # Finish the last line: it is the one containing byte end-1.
    last = r.end - 1 - lo
    nl = data.find(b"\n", max(begin, last))
    while nl < 0 and not eof:
        more = await blobs.get_range(r.url, fetched_to, fetched_to + LOOKAHEAD)
        eof = len(more) < LOOKAHEAD
        searched = len(data)
        data += more
        fetched_to += len(more)
        nl = data.find(b"\n", searched)
    stop = nl + 1 if nl >= 0 else len(data)
    return data[begin:stop]


async def read_range(blobs: Blobs, r: Range, fmt: InputFormat) -> bytes:
    """What a map task reads of a range: the lines that start in it (line-split formats),
    or exactly its bytes (whole files, fixed records)."""
    if fmt.line_split:
        return await read_split(blobs, r)
    if r.start >= r.end:
        return b""
    return await blobs.get_range(r.url, r.start, r.end)
