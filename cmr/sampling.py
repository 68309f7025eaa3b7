"""Total order (``Job.total_order``, ``cmr run --total-order``): cut points chosen at submit.

The submitter reads a bounded sample of the input (up to SAMPLE_BYTES from each of up to
SAMPLE_RANGES places spread evenly over the plan's bytes, whole records only), runs the job's
map over it here, on the client, on an instance set up as a worker sets one up, and keeps
the keys (at most MAX_SAMPLE_KEYS, a seeded reservoir: the same input gives the same cuts).
From them it chooses at most partitions-1 cut points, distinct keys at the quantiles of the
sample by ``cmr.usercode.sort_key``; the plan carries them (``cmr.plan``), and every map
task partitions by range (``cmr.partition.RangePartitioner``): part i's keys all sort before
part i+1's. Cut points are keys that occur in the sample, so with at least as many distinct
keys as partitions every part gets one; a sample without keys (empty input) gives no cut
points: every key goes to part 0.

The sample costs at most about SAMPLE_RANGES * SAMPLE_BYTES (4 MiB) of input, read once;
the map over it runs under the time limit a map task of that size would get. What the
user's code does wrong here is said as a map task's error would be, at submit.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cmr import formats, usercode, wire
from cmr.backends.base import Blobs
from cmr.cpu.mapping import piece_mapper, universal_lines
from cmr.errors import UsageError
from cmr.job import Job, steps_of
from cmr.jobload import LoadedJob
from cmr.partition import MAX_CUT_BYTES, is_key
from cmr.split import read_split
from cmr.timelimit import TimeLimitExceeded, task_limit, time_limit
from cmr.wire import Range

SAMPLE_RANGES = 64  # places of the input sampled
SAMPLE_BYTES = 64 * 1024  # bytes read from each (whole records: a little more)
MAX_SAMPLE_KEYS = 100_000  # keys kept for choosing the cut points
READ_CONCURRENCY = 16
# A str key is cut short to this many characters (4 UTF-8 bytes each at most), a bytes key
# to this many bytes, to make a cut point: a prefix sorts at or before the key, so it cuts
# as well as the key would (a longer tuple key is left out of the sample).
SHORT_STR = MAX_CUT_BYTES // 4 - 8
SHORT_BYTES = MAX_CUT_BYTES - 8


def check(cls: type[Job], total_order: bool, steps: int = 1) -> bool:
    """Whether the job runs in total order (its class, or the submission, says so); a job
    with its own ``partition`` cannot: the range partitioner replaces it, nor a pipeline."""
    if not (total_order or cls.total_order):
        return False
    if steps > 1:
        raise UsageError(
            f"{cls.__name__} has {steps} steps and asks for total order: total order applies "
            "to one-step jobs (keys are sampled from the input at submit); sort the last "
            "step's output with a one-step job that reads it (`--input-format pairs`)"
        )
    if cls.partition is not Job.partition:
        raise UsageError(
            f"{cls.__name__} defines partition() and asks for total order "
            f"({'--total-order' if total_order else 'total_order = True'}): total order "
            "partitions by ranges of sampled keys; remove one of the two"
        )
    return True


def sample_ranges(tasks: Sequence[Sequence[Range]]) -> list[Range]:
    """Up to SAMPLE_RANGES stretches of SAMPLE_BYTES each, starting at evenly spread points
    of the plan's bytes (a stretch goes on into the next ranges when one ends first): all
    of the input when it is smaller than the sample."""
    ranges = [r for t in tasks for r in t if r.end > r.start]
    total = sum(r.end - r.start for r in ranges)
    if total <= SAMPLE_RANGES * SAMPLE_BYTES:
        return ranges
    starts = [0, *itertools.accumulate(r.end - r.start for r in ranges)]
    out: list[Range] = []
    for i in range(SAMPLE_RANGES):
        pos = i * total // SAMPLE_RANGES
        j = bisect.bisect_right(starts, pos) - 1
        offset, want = pos - starts[j], SAMPLE_BYTES
        while want > 0 and j < len(ranges):
            r = ranges[j]
            begin = r.start + offset
            end = min(r.end, begin + want)
            out.append(Range(r.url, begin, end, r.name))
            want -= end - begin
            j, offset = j + 1, 0
    return out


# One call of the user's map code over part of the sample: (method, its two arguments).
MapCall = tuple[Callable[[Any, Any], Iterable[Any]], Any, Any]


WHOLE_SAMPLE_MAX = 16 * 1024 * 1024  # a whole-file input larger than this is not sampled
# A compressed input is sampled from the first this many bytes it decodes to: it may decode
# to thousands of times its size, which the sample would otherwise hold whole.
DECODED_SAMPLE = 1024 * 1024
# Whole-file records (and decoded starts) held for the sample in all: past it, later ranges
# are left out, so 64 whole files of 16 MiB cost this, not a GiB.
WHOLE_SAMPLE_TOTAL = 64 * 1024 * 1024


class _Budget:
    """Bytes the sample may still hold of whole files and decoded starts."""

    def __init__(self, total: int = WHOLE_SAMPLE_TOTAL) -> None:
        self.left = total

    def take(self, n: int) -> bool:
        if n > self.left:
            return False
        self.left -= n
        return True


async def sample_records(
    blobs: Blobs,
    r: Range,
    job: Job,
    fmt: formats.InputFormat = formats.LINES,
    budget: _Budget | None = None,
) -> list[MapCall]:
    """The map calls that the records of one sample range make, read as a map task reads
    them: lines (whole lines starting in the range, ``map_chunk`` over them, which calls
    ``map`` per line unless overridden), jsonlines likewise; fixed records that start in the
    range; a whole-file input whole, from the stretch at its start (at most
    WHOLE_SAMPLE_MAX; a larger one is left out of the sample), a compressed one from the
    first DECODED_SAMPLE bytes it decodes to; both within ``budget``."""
    budget = budget if budget is not None else _Budget()
    step = steps_of(job)[0]  # a one-step job's (a pipeline is refused total order)
    map_piece = piece_mapper(step)
    map_record = step.map if step.map is not None else _as_pair
    head = await blobs.get_range(r.url, 0, formats.SNIFF_BYTES) if r.start == 0 else b""
    codec = formats.sniff(head) if head else ""
    max_record = WHOLE_SAMPLE_MAX
    cut = False  # a compressed input's decoded start, cut short: its last record may be too
    if fmt.line_split and not codec:
        data = await read_split(blobs, r)
        if fmt.name == "lines":
            if job.lines == "universal":
                data = universal_lines(data)
            data = data[:-1] if data.endswith(b"\n") else data
            return [(map_piece, r.name, data)] if data else []
        chunk = formats.Chunk(r.name, data, "", r.start, max_record)
    elif fmt.name == "fixed" and not codec:
        size = fmt.record_len
        start, end = -(-r.start // size) * size, r.end // size * size
        if end <= start:
            return []
        data = await blobs.get_range(r.url, start, end)
        chunk = formats.Chunk(r.name, data, "", start, max_record)
    else:
        size = await blobs.size(r.url)
        if r.start > 0 or size > WHOLE_SAMPLE_MAX:
            return []
        if not budget.take(size):
            return []
        data = await blobs.get(r.url)
        if codec:
            universal = fmt.name == "lines" and job.lines == "universal"
            data, cut = _decoded_start(r.name, codec, data, fmt, budget, universal)
            if not data:
                return []
        chunk = formats.Chunk(r.name, data, "", 0, max_record)
        if fmt.name == "lines":
            if job.lines == "universal":
                data = universal_lines(data)
            data = data[:-1] if data.endswith(b"\n") else data
            return [(map_piece, r.name, data)] if data else []
    records = formats.records(fmt, chunk, WHOLE_SAMPLE_MAX)
    calls: list[MapCall] = []
    try:
        for k, v in records:
            calls.append((map_record, k, v))
    except formats.InputError as exc:
        # The decoded start ends inside a record (cut: a CSV row, a pairs item), or a
        # record is past the sample's bound (too_big), which is smaller than a map task's:
        # the sample holds the whole records before it; a map task decides with its own.
        if not (cut or exc.too_big):
            raise
    return calls


def _decoded_start(
    name: str,
    codec: str,
    data: bytes,
    fmt: formats.InputFormat,
    budget: _Budget,
    universal: bool = False,
) -> tuple[bytes, bool]:
    """The first DECODED_SAMPLE bytes a compressed input decodes to (all of it for a whole
    file, up to WHOLE_SAMPLE_MAX; b"" past it, or past ``budget``), cut after its last
    whole line or fixed record; and whether that is less than the whole input."""
    want = WHOLE_SAMPLE_MAX if fmt.name == "whole" else DECODED_SAMPLE
    got = formats._stream(name, codec, data).read(want + 1)
    if (fmt.name == "whole" and len(got) > want) or not budget.take(min(want, len(got))):
        return b"", False
    if len(got) <= want:
        return got, False
    got = got[:want]
    if fmt.line_split:
        end = max(got.rfind(b"\n"), got.rfind(b"\r") if universal else -1)
        got = got[: end + 1]
    elif fmt.name == "fixed":
        got = got[: len(got) // fmt.record_len * fmt.record_len]
    return got, True


def _as_pair(key: Any, value: Any) -> Iterable[tuple[Any, Any]]:
    """A step without map: its record is its pair."""
    return ((key, value),)


class _Keys:
    """A seeded reservoir of the sampled keys, each as the reducer would see it (lists as
    tuples) and short enough to be a cut point."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.seen = 0
        self.rng = random.Random(0)

    def add(self, key: Any) -> None:
        key = _cut_form(key)
        if key is None:
            return  # not a key, or too long: the map task says so, or it still sorts
        self.seen += 1
        if len(self.kept) < MAX_SAMPLE_KEYS:
            self.kept.append(key)
        else:
            i = self.rng.randrange(self.seen)
            if i < MAX_SAMPLE_KEYS:
                self.kept[i] = key


def _cut_form(key: Any) -> Any:
    t = type(key)
    if t is str:
        return key[:SHORT_STR]
    if t is bytes:
        return key[:SHORT_BYTES]
    if t is int or t is float or t is bool:
        return key if t is not int or -(2**63) <= key < 2**64 else None
    try:
        arrived = wire.unpack(wire.pack(key))  # lists arrive as tuples
    except Exception:
        return None
    if not is_key(arrived) or len(wire.pack(arrived)) > MAX_CUT_BYTES:
        return None
    return arrived


def choose_cuts(keys: list[Any], partitions: int) -> tuple[Any, ...]:
    """At most partitions-1 cut points: distinct sampled keys (never the smallest) near the
    sample's quantiles, strictly increasing, so each part holds about as many sampled keys
    and, with enough distinct keys, none is empty."""
    if partitions <= 1 or not keys:
        return ()
    keys = sorted(keys, key=usercode.sort_key)
    distinct: list[Any] = []
    counts: list[int] = []
    last: Any = None
    for k in keys:
        sk = usercode.sort_key(k)
        if distinct and sk == last:
            counts[-1] += 1
        else:
            distinct.append(k)
            counts.append(1)
            last = sk
    before = list(itertools.accumulate(counts))  # before[j]: sampled keys up to distinct[j]
    want = min(partitions - 1, len(distinct) - 1)
    chosen: list[int] = []
    prev = 0
    for i in range(1, want + 1):
        # The first distinct key with at least i/partitions of the sample before it; after
        # the previous cut, and leaving room for the cuts still to come.
        j = bisect.bisect_left(before, i * len(keys) / partitions) + 1
        j = min(max(j, prev + 1), len(distinct) - 1 - (want - i))
        chosen.append(j)
        prev = j
    return tuple(distinct[j] for j in chosen)


def _sample_keys(job: Job, calls: list[MapCall], limit_s: float) -> list[Any]:
    """The keys the map yields over the sample, its setup run first, under one time limit
    (enforced in the main thread: where `cmr run` and ``cmr.run`` submit)."""
    keys = _Keys()
    mapper = f"{type(job).__name__}.map"
    source: Any = usercode.NOTHING
    try:
        with time_limit(limit_s, "sampling keys for total order"):
            job.setup()
            map_init = steps_of(job)[0].map_init
            if map_init is not None:
                map_init()  # as a map task runs it before its records
            for method, a, b in calls:
                source = method(a, b)
                for pair in source:
                    if type(pair) is tuple and len(pair) == 2:
                        keys.add(pair[0])
                    else:
                        keys.add(usercode.as_pair(pair, mapper, source)[0])
    except TimeLimitExceeded as exc:
        raise usercode.UserCodeError(f"{_SAMPLING}: {exc}") from None
    except usercode.UserCodeError as exc:
        raise usercode.UserCodeError(f"{_SAMPLING}: {exc}") from None
    except Exception as exc:
        if usercode.culprit(exc) is None and isinstance(exc, TypeError):
            # Job.map_chunk's `yield from self.map(...)`: map returned no iterable.
            problem = usercode.not_pairs(mapper, usercode.NOTHING, exc)
            raise usercode.UserCodeError(f"{_SAMPLING}: {problem}") from None
        raise usercode.UserCodeError(f"{_SAMPLING}: {usercode.describe(exc)}") from None
    return keys.kept


_SAMPLING = "sampling the input's keys for total order (at submit)"


async def cut_points(
    blobs: Blobs,
    loaded: LoadedJob,
    params: dict[str, str],
    lines: str,
    tasks: Sequence[Sequence[Range]],
    partitions: int,
    task_timeout_s: int,
    fmt: formats.InputFormat = formats.LINES,
) -> tuple[Any, ...]:
    """The job's cut points from a sample of its input (see the module's text)."""
    job = loaded.cls(params)  # the class the submitter loaded, once
    if lines:
        job.lines = lines  # type: ignore[misc]  # the submission's choice, as a worker's
    ranges = sample_ranges(tasks)
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    budget = _Budget()

    async def read(r: Range) -> list[MapCall]:
        async with gate:
            return await sample_records(blobs, r, job, fmt, budget)

    calls = [c for cs in await asyncio.gather(*(read(r) for r in ranges)) for c in cs]
    limit = task_limit(task_timeout_s, sum(r.end - r.start for r in ranges))
    return choose_cuts(_sample_keys(job, calls, limit), partitions)
