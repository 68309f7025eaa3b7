"""Cutting the input into map tasks, and reading exactly the records a split owns.

A split is a byte range [start, end) of one input; it owns every line that *starts* inside
it, so a line that crosses a boundary is read whole by the split where it begins and
skipped by the next. Every line of every input is therefore read exactly once, however
the ranges fall (the 2009 implementation cut words at split edges; this does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cmr.formats import LINES, InputError, InputFormat
from cmr.wire import Range

LOOKAHEAD = 64 * 1024  # bytes read past a split's end to finish its last line, at first
MAX_LOOKAHEAD = 4 * 1024 * 1024  # ... doubling per round up to this (a long line, few reads)
# The longest line read_split returns unless told otherwise (a map task is told its worker's
# own, cmr.cpu.specs.map_max_record): formats.Chunk's default.
MAX_LINE = 64 * 1024 * 1024
# Small files packed into one task: each distinct key of a task's map output is combined
# and shuffled once per task, so many small tasks cost per key (20,000 files of word count:
# 50 tasks of 400 files, 7.4 s; 10 of 2,000, see benchmarks/RESULTS.md). A task message
# names its task only (the ranges are in the plan: cmr.plan caps them at twice this).
MAX_RANGES_PER_TASK = 2_000
MIB = 1024 * 1024


class RangeReader(Protocol):
    """What reading a split needs of a store (cmr.backends.base.Blobs has it; so has a
    checked local file, cmr.localcheck.CheckedFile)."""

    async def get_range(self, url: str, start: int, end: int) -> bytes: ...


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


async def read_split(
    blobs: RangeReader, r: Range, size: int | None = None, max_record: int = MAX_LINE
) -> bytes:
    """The bytes of every line that starts in [r.start, r.end), each ending in ``\\n``
    except possibly the input's last line. The last line is read to its end in pieces
    joined once (linear time, however long it is); a line longer than ``max_record`` is an
    InputError naming the input and the byte it starts at, raised once that many bytes of
    it were read (a file with no newline is not read whole to find out)."""
    if r.start >= r.end:
        return b""
    lo = max(0, r.start - 1)
    data = await blobs.get_range(r.url, lo, r.end + LOOKAHEAD)
    eof = len(data) < r.end + LOOKAHEAD - lo
    begin = 0
    if r.start > 0:
        # The byte before start tells whether a line starts exactly at start; otherwise
        # the first line starting in range is the one after the next newline. What was
        # read reaches past end: no newline before end means no line starts in range
        # (the line that does is the previous split's, however long).
        nl = data.find(b"\n", 0, r.end - lo)
        if nl < 0 or lo + nl + 1 >= r.end:
            return b""
        begin = nl + 1
    # Finish the last line: it is the one containing byte end-1.
    last = r.end - 1 - lo
    nl = data.find(b"\n", max(begin, last))
    if nl >= 0 or eof:
        stop = nl + 1 if nl >= 0 else len(data)
        _check_line(r, lo, data, begin, stop, max_record)
        return data[begin:stop]
    # The last line goes on past what was read: collect its pieces, join them once.
    line_at = max(begin, data.rfind(b"\n", begin, last) + 1)
    _check_line(r, lo, data, begin, len(data), max_record)
    pieces = [data]
    fetched_to = lo + len(data)
    step = LOOKAHEAD
    while True:
        # Larger pieces as the line goes on: a long line costs few requests.
        more = await blobs.get_range(r.url, fetched_to, fetched_to + step)
        eof = len(more) < step
        step = min(step * 2, MAX_LOOKAHEAD)
        nl = more.find(b"\n")
        if nl >= 0:
            more = more[: nl + 1]  # what follows the newline is the next split's
        if fetched_to + len(more) - (lo + line_at) - (nl >= 0) > max_record:
            raise _too_long(r, lo + line_at, max_record)
        pieces.append(more)
        fetched_to += len(more)
        if nl >= 0 or eof:
            break
    joined = b"".join(pieces)
    return joined[begin:] if begin else joined


def _check_line(r: Range, lo: int, data: bytes, begin: int, stop: int, max_record: int) -> None:
    """InputError if the last line of ``data[begin:stop]`` (without its newline) is longer
    than ``max_record``; the lines before it are bounded by the split."""
    end = stop - 1 if stop > begin and data[stop - 1 : stop] == b"\n" else stop
    if end - begin <= max_record:
        return  # the whole of it is short: so is every line in it
    at = max(begin, data.rfind(b"\n", begin, end) + 1)
    if end - at > max_record:
        raise _too_long(r, lo + at, max_record)


def _too_long(r: Range, at: int, max_record: int) -> InputError:
    return InputError(
        f"input {r.name[:200]}: the line at byte {at:,} is longer than {max_record:,} bytes, "
        "the longest a map task of this worker's memory holds: is it a file without line "
        "breaks (read it as another input format), or give workers more --memory-mb"
    )


async def read_range(
    blobs: RangeReader, r: Range, fmt: InputFormat, max_record: int = MAX_LINE
) -> bytes:
    """What a map task reads of a range: the lines that start in it (line-split formats;
    none longer than ``max_record``), or exactly its bytes (whole files, fixed records)."""
    if fmt.line_split:
        return await read_split(blobs, r, max_record=max_record)
    if r.start >= r.end:
        return b""
    return await blobs.get_range(r.url, r.start, r.end)
