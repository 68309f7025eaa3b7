"""The CPU half of map and reduce, run in worker processes of a pool.

The event loop only moves bytes; user code, combining, partitioning, (de)serialising and
compression happen here, one task per pool process, so every core works. Results go
through local spool files rather than return values, which keeps a task's memory bounded
by its buffers, not by its output.

User exceptions are caught here and returned as text: the method that raised and the
user's own frames (:mod:`cmr.usercode`); they are recorded in the job, never re-raised
across the process boundary. What user code yields is checked as cheaply as the hot loops
allow: one type test per pair, and a diagnosis of the pair only once handling it failed.

Kept whole (past ~400 lines): it is all that pool processes run, so a pool child imports
one module, and the map and reduce halves share the spool format and error capture.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import heapq
import io
import itertools
import operator
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

import msgpack

from cmr import counters, formats, taskprogress, usercode, wire
from cmr.errors import JobCodeError, WireError
from cmr.job import Job, JobRef, Step, load_job_class, steps_of
from cmr.localcheck import InputChanged, open_checked
from cmr.partition import RangePartitioner
from cmr.plan import Check
from cmr.timelimit import TimeLimitExceeded, time_limit

if TYPE_CHECKING:  # imported where used: numpy costs every process ~0.2 s to import
    from cmr import fixedsort

COMBINE_KEYS = 200_000  # distinct keys held before a map task combines and flushes
# Bytes of whole lines handed to map_chunk at a time: a user's map_chunk may hold many
# times its input in objects (word count: ~16x), so a small memory budget gets small
# pieces; the default budget gets whole splits, as each piece costs per-key work later.
MAP_PIECE_MIN = 4 * 1024 * 1024
MAP_PIECE_OF_BUDGET = 16  # a piece is at most budget / this


def map_piece_bytes(memory_bytes: int) -> int:
    return max(MAP_PIECE_MIN, memory_bytes // MAP_PIECE_OF_BUDGET)


def map_max_record(piece_bytes: int) -> int:
    """The longest record (a line; a compressed or whole file, decoded) a map task of pieces
    this large holds: half the budget a piece is a sixteenth of."""
    return max(MAP_PIECE_MIN, piece_bytes) * (MAP_PIECE_OF_BUDGET // 2)


REDUCE_COMBINE_AT = 64  # values per key held before combining them (map and reduce side)
# After a combine that left a key n values (a combiner that does not shrink, e.g. one that
# drops duplicates), the key is combined again only at COMBINE_GROWTH * n values: each
# combine then costs at most a constant per value added since the last, so combining stays
# linear in the values, whatever the combiner yields.
COMBINE_GROWTH = 2
OBJECT_OVERHEAD = 4  # rough Python-object bytes per packed byte, for the memory budget
# What holding a pair costs the reducer beyond the sizes of its key and value objects
# (measured on CPython 3.11: ~195 B for a new 9-character key, ~31 B per added int):
KEY_COST = 136  # a new key: its dict slot and a one-element list
VALUE_COST = 8  # one more value of a key: a list slot
# The sorted-pairs path (no combine): a pair's tuple and list slot, and two object headers
# its packed bytes do not show (an int packs to 1 byte and is a 28-byte object).
PAIR_COST = 64 + 2 * 40
PAIR_BLOCK = 4096  # pairs read from a spool at a time (C loops do the rest)
BLOCK_PARTITIONS = 32  # a block spread over more partitions goes pair by pair
PAIR_SAMPLE = 8  # pairs of a block whose object sizes are measured
PLAIN_KEYS = (str, int, bytes)  # kinds whose own order is sort_key's, == its grouping
MERGE_FANIN = 64  # sorted runs merged at once; more are merged in passes first
_first = operator.itemgetter(0)  # a pair's key, by C
_second = operator.itemgetter(1)  # a pair's value


@dataclass(frozen=True)
class MapSpec:
    job: str
    task: int
    attempt: str
    partitions: int
    max_message_bytes: int  # shuffle batches are packed to at most this many bytes
    spool_dir: str
    compress: bool = True  # zstd bodies; off: plain msgpack, packed to the byte
    combine: bool = True  # run the job's combine, if it has one
    piece_bytes: int = MAP_PIECE_MIN  # map_chunk sees at most about this much at once
    limit_s: float = 0.0  # the task's time limit (cmr.timelimit); 0: none
    lines: str = ""  # line endings ("lf", "universal"); "": the job class's own
    input_format: str = ""  # cmr.formats' name ("": lines)
    codecs: tuple[str, ...] = ()  # per chunk: its compression ("" none; () all none)
    starts: tuple[int, ...] = ()  # per chunk: the byte of its file it starts at
    step: int = 0  # which of the job's steps this task runs
    files_dir: str = ""  # the job's side files on this worker (cmr.sidefiles); "": none
    cuts: tuple[Any, ...] | None = None  # total order's cut points (the plan's); None: hash


@dataclass(frozen=True)
class FileSlice:
    """Bytes [start, end) of a local file, read by the pool process that maps them rather
    than sent to it: fixed records on a backend whose blobs are local files (2 GB of
    TeraSort input cost ~7 CPU s pickled through the pool's pipes)."""

    path: str
    start: int
    end: int
    name: str = ""  # the input's name (in errors)
    check: Check | None = None  # the file's identity at submit (cmr.localcheck); None: none

    def read(self) -> bytes:
        """The slice's bytes, of the file submitted (InputChanged: another is there now)."""
        fd = open_checked(self.path, self.name, self.check)
        with open(fd, "rb") as f:
            f.seek(self.start)
            return f.read(self.end - self.start)


class InputGone(formats.InputError):
    """A map task's input could not be read: no retry would read it (MapResult.permanent)."""


@dataclass
class MapResult:
    spool: str = ""  # msgpack stream of [partition, seq, records, body, spilled?]
    batches: list[int] = field(default_factory=list)  # per partition
    records: list[int] = field(default_factory=list)  # per partition
    records_in: int = 0
    bytes_in: int = 0
    error: str = ""  # "Type: message\ntraceback" when user code raised
    counters: counters.Flat = field(default_factory=dict)  # Job.increment_counter totals
    status: str = ""  # the last Job.set_status line
    permanent: bool = False  # the error is the input's (gone): the job fails at once


@dataclass
class ReduceResult:
    records_out: int = 0
    spills: int = 0
    sha256: str = ""  # of the output file, hashed as it was written (the commit names it)
    error: str = ""
    counters: counters.Flat = field(default_factory=dict)
    status: str = ""


# Set-up instances by job id: two jobs running the same code with the same params still get
# an instance each, so state one job's tasks keep on ``self`` never reaches the other's.
_instances: collections.OrderedDict[str, tuple[JobRef, dict[str, str], Job]] = (
    collections.OrderedDict()
)
INSTANCES_KEPT = 8  # jobs whose instance a pool process keeps (a fleet worker serves many)


def job_instance(
    job_id: str, ref: JobRef, params: dict[str, str], lines: str = "", files_dir: str = ""
) -> Job:
    """One set-up instance per job per process (``setup`` runs once, not per task).
    ``lines``: the job's line endings as submitted, if it chose them ("": the class's).
    ``files_dir``: where this worker keeps the job's side files (``Job.file``)."""
    # Two workers sharing this pool keep side files of their own: an instance each, set up
    # on its worker's copies (alternating tasks must not set one instance up over and over).
    slot = f"{job_id} {files_dir}" if files_dir else job_id
    kept = _instances.get(slot)
    if kept is not None and kept[0] == ref and kept[1] == params:
        _instances.move_to_end(slot)
        return kept[2]
    inst = load_job_class(ref)(params)
    if lines:
        inst.lines = lines  # type: ignore[misc]  # the submission's choice, seen by setup too
    inst._cmr_files_dir = files_dir  # type: ignore[attr-defined]  # before setup: it may open them
    with counters.paused():
        inst.setup()
    _instances[slot] = (ref, dict(params), inst)
    while len(_instances) > INSTANCES_KEPT:
        _instances.popitem(last=False)  # the job served least recently: likely ended
    return inst


def job_step(job: Job, step: int) -> tuple[Step, str]:
    """Step ``step`` of the job (its steps() asked once per instance), and its name in
    messages: ``J`` for a one-step job, ``J step 2`` in a pipeline."""
    steps: list[Step] | None = getattr(job, "_cmr_steps", None)
    if steps is None:
        steps = steps_of(job)
        job._cmr_steps = steps  # type: ignore[attr-defined]
    name = type(job).__name__
    if step >= len(steps):
        raise JobCodeError(
            f"{name}.steps() now returns {len(steps)} steps; the job was submitted with "
            f"more (step {step + 1}): its code or parameters differ on this worker"
        )
    return steps[step], (name if len(steps) == 1 else f"{name} step {step + 1}")


def _hook(fn: Callable[[], Any] | None) -> Any:
    """A step's init/final hook's result (pairs from a final hook; None: none)."""
    return None if fn is None else fn()


def _take_counters(counted: Any, result: MapResult | ReduceResult) -> None:
    """The task's counters and status line into its result; a counter limit the task broke
    fails it, even if its code caught the error (its counters could not be kept whole)."""
    result.counters, result.status = counted.counts, counted.status
    if counted.error and not result.error:
        result.error = counted.error


def _timed_out(exc: TimeLimitExceeded) -> str:
    # The user's frames show where the code was stuck when the limit struck.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not usercode.ours(f.filename)]
    return f"TimeLimitExceeded: {exc}\n" + "".join(traceback.format_list(frames[-8:]))


class _Block(list[tuple[Any, Any]]):
    """Records of a step without map, as an input format read them: pairs already."""


def _unpackable(pairs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The first pair msgpack cannot pack (a block refused as a whole names it)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    for pair in pairs:
        try:
            pack(pair)
        except (TypeError, ValueError, OverflowError):
            return pair
    return None


def _array_header(n: int) -> int:
    """Bytes of msgpack's header of an array of n items: fixarray, array 16, array 32."""
    return 1 if n < 16 else 3 if n < 1 << 16 else 5


class _Shuffle:
    """Per-partition buffers that become compressed, tagged batch messages in a spool file."""

    def __init__(self, spec: MapSpec, out: Any) -> None:
        self.spec = spec
        self.out = out
        self.buffers: list[list[bytes]] = [[] for _ in range(spec.partitions)]
        self.sizes = [0] * spec.partitions
        self.counts = [0] * spec.partitions
        self.batches = [0] * spec.partitions
        self.records = [0] * spec.partitions
        self.packer = msgpack.Packer(use_bin_type=True)
        if spec.compress:
            # Raw bytes per batch, tuned by the compression ratio seen so far.
            self.target = [spec.max_message_bytes * 3] * spec.partitions
        else:
            # A plain body's size is known in advance: its header plus the pairs.
            header = len(
                wire.encode(
                    wire.Batch(spec.job, spec.task, spec.attempt, 2**32, 2**32, 2**32, b""),
                    compress=False,
                )
            )
            room = spec.max_message_bytes - header - 4  # bin 8/16/32 adds up to 4 bytes
            self.target = [room] * spec.partitions
        # Below this a batch is not worth a message of its own (compressed guesses shrink
        # the target when a body came out too big).
        self.floor = max(1, min(64 * 1024, spec.max_message_bytes // 4))

    def add(self, p: int, key: Any, value: Any) -> None:
        # An out-of-range p is refused before this (a custom partition() is checked); key and
        # value that are not wire data make pack raise, diagnosed by the caller.
        data = self.packer.pack((key, value))
        if len(data) > wire.MAX_DECODED:
            # A reducer takes no spilled batch past this (a bucket writer's could be any
            # size): refused here, at once, rather than lost on the way.
            raise usercode.PairTooBig(
                f"it packs to {len(data):,} bytes, past the {wire.MAX_DECODED:,} one "
                "shuffled pair may take: emit smaller values (big data belongs in the "
                "output store, named by its key)"
            )
        if len(data) > self.spec.max_message_bytes // 2:
            self._emit(p, [data], 1, spilled=True)
            return
        if not self.spec.compress and self.sizes[p] + len(data) > self.target[p]:
            self.flush(p)  # exact packing: this pair would not fit in the plain body
        self._hold(p, data, 1)

    def _hold(self, p: int, data: bytes, n: int) -> None:
        """Buffer n packed pairs for partition p; a batch once the target is reached."""
        self.buffers[p].append(data)
        self.sizes[p] += len(data)
        self.counts[p] += n
        if self.sizes[p] >= self.target[p]:
            self.flush(p)

    def add_block(self, pairs: list[tuple[Any, Any]], part: Callable[[Any, int], int]) -> None:
        """Pairs that need no checking (records of a step without map: tuples of wire data
        as an input format reads them), partitioned and packed a partition at a time by C:
        the pairs of one partition, packed as a msgpack array, are its header followed by
        each pair as add() would pack it. Plain bodies, packed exactly, and big pairs go
        one by one."""
        n = self.spec.partitions
        many = getattr(part, "many", None)
        keys = list(map(_first, pairs))
        ps = many(keys, n) if many is not None else list(map(part, keys, itertools.repeat(n)))
        which = set(ps)
        if len(which) > BLOCK_PARTITIONS:  # one pass per partition would cost more
            for p, (key, value) in zip(ps, pairs, strict=True):
                self.add(p, key, value)
            return
        for p in which:
            mine = pairs if len(which) == 1 else list(itertools.compress(pairs, map(p.__eq__, ps)))
            self._add_packed(p, mine)

    def _add_packed(self, p: int, pairs: list[tuple[Any, Any]]) -> None:
        if not self.spec.compress:
            for key, value in pairs:
                self.add(p, key, value)
            return
        packed = self.packer.pack(pairs)
        body = packed[_array_header(len(pairs)) :]
        if len(body) > self.floor and len(pairs) > 1:
            half = len(pairs) // 2  # pieces no bigger than a batch takes in one
            self._add_packed(p, pairs[:half])
            self._add_packed(p, pairs[half:])
            return
        if len(body) > self.spec.max_message_bytes // 2:
            key, value = pairs[0]
            self.add(p, key, value)  # a pair of its own blob
            return
        self._hold(p, body, len(pairs))

    def add_rows(self, p: int, rows: memoryview, n: int, width: int) -> None:
        """n pairs packed as fixed-width rows (cmr.fixedsort), in pieces of whole rows no
        bigger than a batch takes in one (a row is at most ``floor`` bytes: Cuts.of)."""
        per = max(1, self.floor // width)
        for at in range(0, n, per):
            k = min(per, n - at)
            self._hold(p, bytes(rows[at * width : (at + k) * width]), k)

    def flush(self, p: int) -> None:
        if not self.buffers[p]:
            return
        parts, n = self.buffers[p], self.counts[p]
        self.buffers[p], self.sizes[p], self.counts[p] = [], 0, 0
        self._emit(p, parts, n, spilled=False)

    def _emit(self, p: int, parts: list[bytes], n: int, *, spilled: bool) -> None:
        s = self.spec
        if spilled:
            # The loop uploads the stream to a blob and sends a small batch pointing at it.
            self.out.write(self.packer.pack((p, self.batches[p], n, b"".join(parts), True)))
        else:
            raw = b"".join(parts)
            body = wire.encode(
                wire.Batch(s.job, s.task, s.attempt, p, self.batches[p], n, raw),
                compress=s.compress,
            )
            # Too big for a message, or holding more pairs than a reader accepts from a body
            # this small (values that compress thousands of times): send it in halves.
            too_dense = len(raw) > wire.decoded_limit(len(body), wire.MAX_BATCH_PAIRS)
            if (len(body) > s.max_message_bytes or too_dense) and len(parts) > 1:
                half = len(parts) // 2
                left = sum(1 for _ in wire.iter_pairs(b"".join(parts[:half])))
                self._emit(p, parts[:half], left, spilled=False)
                self._emit(p, parts[half:], n - left, spilled=False)
                if s.compress:
                    self.target[p] = max(self.floor, self.target[p] // 2)
                return
            if s.compress:
                ratio = len(raw) / max(1, len(body))
                target = int(s.max_message_bytes * ratio * 0.85)
                if ratio > wire.MAX_RATIO / 2:
                    # Data that compresses this well looks like a bomb to a reader past
                    # MAX_RATIO: pack only what any body may decode to.
                    target = wire.DECODED_FLOOR
                self.target[p] = min(wire.MAX_BATCH_PAIRS, target)
            self.out.write(self.packer.pack((p, self.batches[p], n, body, False)))
        self.batches[p] += 1
        self.records[p] += n

    def close(self) -> None:
        for p in range(self.spec.partitions):
            self.flush(p)


class Combiner:
    """A job's combine, run on a key's values as they pile up: at REDUCE_COMBINE_AT values,
    then again only once the values doubled since the last combine (COMBINE_GROWTH), so its
    cost is linear in the values however little the combiner shrinks them. What combine
    yields is checked (it is called once per many values, not per pair)."""

    def __init__(self, combine: Callable[[Any, Iterator[Any]], Any], method: str) -> None:
        self.combine = combine
        self.method = method
        self.next_at: dict[Any, int] = {}  # keys whose combine left many values: when next

    def due(self, key: Any, held: int) -> bool:
        """Whether a key now holding ``held`` values (>= REDUCE_COMBINE_AT) is combined now."""
        return held >= self.next_at.get(key, REDUCE_COMBINE_AT)

    def values(self, key: Any, values: list[Any]) -> list[Any]:
        """The key's values, combined; remembers when to combine the key next."""
        out = [v for _, v in self.pairs(key, values)]
        if len(out) * COMBINE_GROWTH > REDUCE_COMBINE_AT:
            self.next_at[key] = len(out) * COMBINE_GROWTH
        else:
            self.next_at.pop(key, None)
        return out

    def pairs(self, key: Any, values: list[Any]) -> Iterator[tuple[Any, Any]]:
        source = self.combine(key, iter(values))
        try:
            pairs = iter(source)
        except TypeError:  # `return sum(values)` instead of `yield key, sum(values)`
            raise usercode.not_pairs(self.method, source) from None
        for pair in pairs:
            if type(pair) is tuple and len(pair) == 2:
                yield pair
            else:
                yield usercode.as_pair(pair, self.method, source)

    def forget(self) -> None:
        """The groups were flushed or spilled: every key starts afresh."""
        self.next_at.clear()

    def flushed(self, groups: dict[Any, list[Any]]) -> Iterator[tuple[Any, Any]]:
        self.forget()
        for key, values in groups.items():
            if len(values) == 1:
                yield key, values[0]
            else:
                yield from self.pairs(key, values)


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    """data (lines joined by \\n) as pieces of whole lines of about ``size`` bytes, each
    without its last newline: what map_chunk sees of the whole, in bounded bites (a user's
    map_chunk may hold many times its input in objects)."""
    start = 0
    while (nl := data.find(b"\n", start + size)) >= 0:
        yield data[start:nl]
        start = nl + 1
    yield data[start:] if start else data  # no copy when one piece is all of it


@contextlib.contextmanager
def _reported(result: MapResult | ReduceResult, limit_s: float, what: str) -> Iterator[None]:
    """Run a task's body under its time limit; whatever it raises becomes ``result.error``
    (what the user's code did wrong and its frames, or the time limit's message), never an
    exception out of the pool."""
    try:
        with time_limit(limit_s, what):
            yield
    except TimeLimitExceeded as exc:
        result.error = _timed_out(exc)
    except Exception as exc:
        result.error = usercode.describe(exc)
        if isinstance(exc, InputGone) and isinstance(result, MapResult):
            result.permanent = True


def universal_lines(data: bytes) -> bytes:
    """``data`` with "\r\n" and lone "\r" line endings made "\n" (Job.lines "universal")."""
    if b"\r" not in data:
        return data
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _partitioner(
    job: Job, partitions: int, cuts: tuple[Any, ...] | None = None
) -> Callable[[Any, int], int]:
    """The job's partition(); a custom one is checked to return a partition that exists.
    With cut points (a total-order job's plan) the range partitioner: in range, as the plan
    holds fewer cut points than partitions (cmr.plan)."""
    if cuts is not None:
        return RangePartitioner(cuts)
    part = job.partition
    if type(job).partition is Job.partition:
        return part  # stable_partition: in range by construction
    method = f"{type(job).__name__}.partition"

    def checked(key: Any, n: int) -> int:
        p = part(key, n)
        if type(p) is not int:
            try:
                p = operator.index(p)  # numpy's integers and other int-likes
            except TypeError:
                raise usercode.bad_partition(method, p, key, n) from None
        if not 0 <= p < n:
            raise usercode.bad_partition(method, p, key, n)
        return p

    return checked


def _flush(
    combiner: Combiner,
    groups: dict[Any, list[Any]],
    shuffle: _Shuffle,
    part: Callable[[Any, int], int],
    mapper: str,
) -> None:
    """Send the combined groups to the shuffle."""
    n = shuffle.spec.partitions
    pair = None
    try:
        for pair in combiner.flushed(groups):
            shuffle.add(part(pair[0], n), pair[0], pair[1])
    except (TypeError, ValueError, OverflowError) as exc:
        if usercode.culprit(exc) is not None:
            raise
        raise usercode.bad_output(f"{mapper} (or {combiner.method})", pair, exc) from exc


def _mapper_name(job: Job, step: Step, name: str, lines: bool = True) -> str:
    if step.map is None and step.map_chunk is None:
        return f"{name} (no map)"
    cls = type(job)
    if lines and step.map_chunk is not None and cls.map_chunk is not Job.map_chunk:
        return f"{name}.map_chunk"
    return f"{name}.map"


def _slice_bytes(name: str, piece: FileSlice) -> bytes:
    """A slice's bytes; InputGone when the file went or changed since the job was
    submitted."""
    try:
        return piece.read()
    except InputChanged as exc:
        raise InputGone(str(exc)) from None
    except OSError as exc:
        raise InputGone(
            f"input {name} ({piece.path}) cannot be read ({exc.strerror}): it was deleted or "
            "moved after the job was submitted"
        ) from None


def run_map(
    ref: JobRef,
    params: dict[str, str],
    given: list[tuple[str, bytes | FileSlice]],
    spec: MapSpec,
) -> MapResult:
    result = MapResult(records_in=0)
    fd, path = tempfile.mkstemp(prefix="map-", suffix=".spool", dir=spec.spool_dir)
    with (
        taskprogress.running(spec.job),
        counters.collecting() as counted,
        _reported(result, spec.limit_s, f"map task {spec.task}"),
    ):
        chunks = [(n, _slice_bytes(n, d) if isinstance(d, FileSlice) else d) for n, d in given]
        result.bytes_in = sum(len(d) for _, d in chunks)
        _map_into(ref, params, chunks, spec, fd, result)
        result.spool = path
    _take_counters(counted, result)
    if result.error:
        os.unlink(path)
    return result


def _map_into(
    ref: JobRef,
    params: dict[str, str],
    chunks: list[tuple[str, bytes]],
    spec: MapSpec,
    fd: int,
    result: MapResult,
) -> None:
    job = job_instance(spec.job, ref, params, spec.lines, spec.files_dir).for_task()
    job._cmr_map_task(spec.step, chunks[0][0] if chunks else "")
    step, step_name = job_step(job, spec.step)
    universal = (spec.lines or job.lines) == "universal"
    fmt = formats.parse_input(spec.input_format or "lines")
    mapper = _mapper_name(job, step, step_name, fmt.name == "lines")
    with os.fdopen(fd, "wb") as out:
        shuffle = _Shuffle(spec, out)
        part = _partitioner(job, spec.partitions, spec.cuts)
        n = spec.partitions
        combiner = (
            Combiner(step.combine, f"{step_name}.combine")
            if step.combine is not None and spec.combine
            else None
        )
        groups: dict[Any, list[Any]] = {}
        grouped = groups.get  # per pair: one lookup saved (groups is cleared, never replaced)
        # What was being handled when something failed: the culprit is diagnosed from it.
        pair, source = None, usercode.NOTHING
        try:
            _hook(step.map_init)
            if combiner is not None:
                _hook(step.combine_init)
            columns, packed = None, None
            if (
                fmt.name == "fixed"
                and step.map is None
                and combiner is None
                and spec.compress
                # a job's own partition() is called for every record, as the general path does
                and (spec.cuts is not None or type(job).partition is Job.partition)
            ):
                from cmr import fixedsort  # numpy: imported only where records are sorted

                columns = fixedsort.Cuts.of(part, n, fmt.key_len, fmt.record_len, shuffle.floor)
                packed = fixedsort.Packed
            for source in _map_calls(step, fmt, chunks, spec, result, universal, columns):
                if type(source) is packed:
                    for p, rows, count in source.parts():
                        shuffle.add_rows(p, rows, count, source.layout.width)
                    continue
                if type(source) is _Block and combiner is None:
                    try:
                        shuffle.add_block(source, part)
                    except (TypeError, ValueError, OverflowError):
                        pair = _unpackable(source)  # what the diagnosis below names
                        raise
                    continue
                pair = None
                for pair in source:
                    if type(pair) is tuple:
                        key, value = pair
                    else:  # a str of 2 would unpack as a pair
                        key, value = usercode.as_pair(pair, mapper, source)
                    if combiner is None:
                        shuffle.add(part(key, n), key, value)
                        continue
                    try:
                        vals = grouped(key)
                    except TypeError:  # a list key: grouped as the tuple it arrives as
                        key = usercode.key_of(key, mapper)
                        vals = grouped(key)
                    if vals is None:
                        groups[key] = [value]
                        if len(groups) >= COMBINE_KEYS:
                            _flush(combiner, groups, shuffle, part, mapper)
                            groups.clear()
                    else:
                        vals.append(value)
                        if len(vals) >= REDUCE_COMBINE_AT and combiner.due(key, len(vals)):
                            groups[key] = combiner.values(key, vals)
        except (TypeError, ValueError, OverflowError) as exc:
            if usercode.culprit(exc) is not None:
                raise  # the user's code raised it: reported as such
            if usercode.innermost_code(exc) is Job.map_chunk.__code__:
                # Job.map_chunk's `yield from self.map(...)`: map returned no iterable.
                method = f"{type(job).__name__}.map"
                raise usercode.not_pairs(method, usercode.NOTHING, exc) from exc
            raise usercode.bad_output(mapper, pair, exc, source) from exc
        if combiner is not None:
            _flush(combiner, groups, shuffle, part, mapper)
            _emit_final(step.combine_final, f"{step_name}.combine_final", shuffle, part)
        shuffle.close()
    result.batches, result.records = shuffle.batches, shuffle.records


def _emit_final(
    hook: Callable[[], Any] | None,
    method: str,
    shuffle: _Shuffle,
    part: Callable[[Any, int], int],
) -> None:
    """The pairs a final hook yields (combine_final), sent as they are."""
    final = _hook(hook)
    n = shuffle.spec.partitions
    for pair in final if final is not None else ():
        key, value = pair if type(pair) is tuple else usercode.as_pair(pair, method, final)
        shuffle.add(part(key, n), key, value)


def _map_calls(
    step: Step,
    fmt: formats.InputFormat,
    chunks: list[tuple[str, bytes]],
    spec: MapSpec,
    result: MapResult,
    universal: bool,
    columns: fixedsort.Cuts | None = None,
) -> Iterator[Any]:
    """What the step's map returns for each piece of lines (``map_chunk``) or each record
    (``map``) of the chunks, counting the records read; then what ``map_final`` returns.
    A step without map passes its records on as pairs; fixed records, uncompressed, as
    arrays of packed rows (fixedsort.Packed) when ``columns`` holds the cut points."""
    codecs = spec.codecs or ("",) * len(chunks)
    starts = spec.starts or (0,) * len(chunks)
    # The largest record a compressed input or a whole file may decode to (the worker read
    # plain lines to the same bound: cmr.split.read_split).
    max_record = map_max_record(spec.piece_bytes)
    if fmt.name == "lines":
        map_piece = piece_mapper(step)
        for (name, given), codec in zip(chunks, codecs, strict=True):
            if codec:
                c = formats.Chunk(name, given, codec, 0, max_record)
                for piece in formats.line_pieces(c, spec.piece_bytes, universal):
                    result.records_in += piece.count(b"\n") + 1
                    yield map_piece(name, piece)
                continue
            chunk = universal_lines(given) if universal else given
            # The last line's newline ends it; it opens no new (empty) line.
            data = chunk[:-1] if chunk.endswith(b"\n") else chunk
            result.records_in += data.count(b"\n") + 1 if chunk else 0
            if not chunk:
                continue
            for piece in _pieces(data, spec.piece_bytes):
                yield map_piece(name, piece)
    else:
        map_record = step.map
        for (name, data), codec, start in zip(chunks, codecs, starts, strict=True):
            if columns is not None and not codec and len(data) % fmt.record_len == 0:
                per = columns.layout.piece_records(spec.piece_bytes) * fmt.record_len
                view = memoryview(data)
                for at in range(0, len(data), per):
                    span = view[at : at + per]
                    result.records_in += len(span) // fmt.record_len
                    yield columns.partitioned(span)
                continue
            read = formats.Chunk(name, data, codec, start, max_record)
            records = formats.records(fmt, read, spec.piece_bytes)
            if map_record is None:
                # No map: the records are the pairs, handed over in blocks (the shuffle
                # takes a block at once: _Shuffle.add_block).
                while block := _Block(itertools.islice(records, PAIR_BLOCK)):
                    result.records_in += len(block)
                    yield block
                continue
            for key, value in records:
                result.records_in += 1
                yield map_record(key, value)
    final = _hook(step.map_final)
    if final is not None:
        yield final


def piece_mapper(step: Step) -> Callable[[str, bytes], Any]:
    """How a step maps a piece of whole lines: map_chunk at once, else map line by line (or
    each line as a pair (source, line), for a step without map)."""
    if step.map_chunk is not None:
        return step.map_chunk
    map_line = step.map

    def by_line(name: str, piece: bytes) -> Iterator[Any]:
        for line in piece.decode("utf-8", "replace").split("\n"):
            if map_line is None:
                yield name, line
            else:
                yield from map_line(name, line)

    return by_line


sort_key = usercode.sort_key  # the order of keys within a part (see cmr.Job)


def value_sorting(job: Job, step: Step | None = None) -> tuple[bool, Callable[[Any], Any] | None]:
    """(sort_values, value_order) of a step: its own when the job declares steps, the job
    class's for a one-step job (its default step)."""
    if step is not None and type(job).steps is not Job.steps:
        return step.sort_values, step.value_order
    return bool(job.sort_values), job.value_order


def _sorted_keys(groups: dict[Any, list[Any]]) -> list[Any]:
    """The keys in sort_key order; plain sorting when all are str, all int or all bytes
    (the same order, ~4x faster than calling sort_key per key)."""
    if len(set(map(type, groups))) == 1 and type(next(iter(groups))) in PLAIN_KEYS:
        return sorted(groups)
    return sorted(groups, key=sort_key)


class ValueOrder:
    """How a job's values reach reduce when it sorts them (``Job.sort_values``): by
    ``value_order`` (a key function over values, the user's) or in natural order
    (``sort_key``). Spilled runs then hold one entry per value, (key, (value,)), in
    (key, value) order, so the merge of the runs hands each key's values over sorted, one
    at a time: a key with more values than memory holds is sorted on disk like the keys."""

    def __init__(self, job: Job, value_order: Callable[[Any], Any] | None) -> None:
        self.method = f"{type(job).__name__}.value_order"
        self.custom = value_order
        self.key: Callable[[Any], Any] = value_order if value_order is not None else sort_key

    def sorted(self, values: list[Any]) -> list[Any]:
        if self.custom is None and (
            all(type(v) is str for v in values) or all(type(v) is int for v in values)
        ):
            return sorted(values)  # the same order as sort_key's, ~4x faster
        try:
            return sorted(values, key=self.key)
        except TypeError as exc:
            raise self.failed(exc) from exc

    def guarded(self, merged: Iterator[Any]) -> Iterator[Any]:
        """The merge of the runs, its errors said as value_order's: it is pulled from inside
        the user's reduce, which would otherwise take the blame."""
        try:
            yield from merged
        except Exception as exc:
            problem = self.failed(exc)
            if problem is exc:
                raise
            raise problem from exc

    def failed(self, exc: Exception) -> Exception:
        if usercode.culprit(exc) is not None:  # value_order raised: its frames say where
            return usercode.UserCodeError(usercode.describe(exc).rstrip("\n"))
        if isinstance(exc, TypeError):  # what value_order returned does not compare
            return usercode.UserCodeError(
                f"{self.method} returned sort keys that cannot be compared with each other "
                f"({exc}): return one kind of value for every value (numbers, str, or tuples "
                "of them)"
            )
        return exc


def _blocks(spools: list[str], memory_bytes: int) -> Iterator[tuple[list[tuple[Any, Any]], int]]:
    """The spooled pairs in blocks, each with the packed bytes it came from: at most
    PAIR_BLOCK pairs, and about a sixteenth of the memory budget by the bytes per pair of
    the block before (the budget is checked between blocks; a first block is small). Every
    entry is checked to be a (key, value) pair, by C loops over the block."""
    cap = max(4096, memory_bytes // 16)
    count = 16
    for spool in spools:
        with open(spool, "rb") as f:
            unpacker = msgpack.Unpacker(
                f,
                raw=False,
                use_list=False,
                strict_map_key=False,
                max_buffer_size=wire.MAX_DECODED,
            )
            at = 0
            while block := list(itertools.islice(unpacker, count)):
                if set(map(type, block)) != {tuple} or set(map(len, block)) != {2}:
                    raise WireError("a spooled record is not a [key, value] pair")
                now = unpacker.tell()
                yield block, now - at
                per_pair = max(1, (now - at) // len(block))
                count = max(1, min(PAIR_BLOCK, cap // per_pair))
                at = now
            if unpacker.tell() != os.fstat(f.fileno()).st_size:
                # msgpack stops quietly at a record cut short: the pairs in it would be lost
                raise WireError("a spool ends inside a record (was the disk full?)")


def _block_cost(block: list[tuple[Any, Any]], packed: int) -> int:
    """What holding a block of pairs costs, for the memory budget: the larger of its packed
    bytes plus per-pair overheads and its objects' sizes. Those are measured on a sample
    when keys and values are all str, bytes or int (a size that follows the packed one);
    on every pair otherwise (a tuple of empty maps packs to a byte per map)."""
    flat = {str, bytes, int}
    if set(map(type, map(_first, block))) <= flat and set(map(type, map(_second, block))) <= flat:
        step = max(1, len(block) // PAIR_SAMPLE)
        sample = block[::step]
        sizes = sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in sample)
        sizes = sizes * len(block) // len(sample)
    else:
        sizes = sum(map(sys.getsizeof, itertools.chain.from_iterable(block)))
    return len(block) * PAIR_COST + max(packed, sizes)


def _sorted_pairs(
    blocks: Iterator[tuple[list[tuple[Any, Any]], int]],
    memory_bytes: int,
    spill_dir: str,
    runs: list[str],
) -> tuple[list[tuple[Any, Any]], Iterator[tuple[list[tuple[Any, Any]], int]] | None]:
    """Pairs whose keys are all of one plain kind (str, int or bytes), held as a list and
    sorted by key in C (stable: each key's values keep their arrival order), spilling sorted
    runs past the budget: the reduce of a job without combine, ~5x cheaper per pair than
    grouping in a dict. Returns the pairs held, sorted, and None; or, at the first block
    whose keys are of another kind or of a second kind, the pairs held so far (unsorted)
    and the blocks left, for the general path to take over."""
    pairs: list[tuple[Any, Any]] = []
    kinds: set[type] = set()
    held = 0
    for block, packed in blocks:
        kinds.update(map(type, map(_first, block)))
        if len(kinds) > 1 or not kinds.issubset(PLAIN_KEYS):
            if held >= memory_bytes // 4:
                # Regrouped in a dict, these would be held twice for a while: spilled
                # instead, a run in sort_key order (one plain kind: its own order).
                pairs.sort(key=_first)
                runs.append(_write_pairs_run(pairs, spill_dir))
                pairs = []
            return pairs, itertools.chain([(block, packed)], blocks)
        pairs += block
        held += _block_cost(block, packed)
        if held >= memory_bytes:
            pairs.sort(key=_first)
            runs.append(_write_pairs_run(pairs, spill_dir))
            pairs, held = [], 0
    pairs.sort(key=_first)
    return pairs, None


def _write_pairs_run(pairs: list[tuple[Any, Any]], spill_dir: str) -> str:
    """Sorted pairs as a run: an entry (key, (value,)) per pair, as readers expect."""
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    pack = msgpack.Packer(use_bin_type=True).pack
    with os.fdopen(fd, "wb") as f:
        for key, value in pairs:
            f.write(pack((key, (value,))))
    return path


def _write_run(
    groups: dict[Any, list[Any]], spill_dir: str, order: ValueOrder | None = None
) -> str:
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    packer = msgpack.Packer(use_bin_type=True)
    with os.fdopen(fd, "wb") as f:
        for key in _sorted_keys(groups):
            if order is None:
                f.write(packer.pack((key, groups[key])))
            else:
                for value in order.sorted(groups[key]):
                    f.write(packer.pack((key, (value,))))
    return path


def _read_run(path: str, read_size: int) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    with open(path, "rb", buffering=0) as f:
        unpacker = msgpack.Unpacker(
            f,
            raw=False,
            use_list=False,
            strict_map_key=False,
            max_buffer_size=wire.MAX_DECODED,
            read_size=read_size,  # msgpack's default is 1 MiB per open run
        )
        yield from unpacker


def _merged(
    runs: list[str], read_size: int, order: ValueOrder | None = None, plain: bool = False
) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """The runs' entries merged in key order; ``plain``: every key is of one plain kind,
    compared as it is (the same order as sort_key's)."""
    readers = (_read_run(r, read_size) for r in runs)
    if plain:
        return heapq.merge(*readers, key=_first)
    if order is None:
        return heapq.merge(*readers, key=lambda kv: sort_key(kv[0]))
    by = order.key
    return order.guarded(heapq.merge(*readers, key=lambda kv: (sort_key(kv[0]), by(kv[1][0]))))


def _merge_runs(
    runs: list[str],
    spill_dir: str,
    read_size: int,
    order: ValueOrder | None = None,
    plain: bool = False,
) -> str:
    """One sorted run from several, entries kept as they are (a key may repeat: readers
    group adjacent entries), so no key's values are ever gathered in memory here."""
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    packer = msgpack.Packer(use_bin_type=True)
    try:
        with os.fdopen(fd, "wb") as f:
            for kv in _merged(runs, read_size, order, plain):
                f.write(packer.pack(kv))
    except BaseException:
        os.unlink(path)
        raise
    for r in runs:
        os.unlink(r)
    return path


def merge_in_passes(runs: list[str], merge: Callable[[list[str]], str]) -> None:
    """Merge ``runs`` until at most MERGE_FANIN are left (each open run holds a read
    buffer): each MERGE_FANIN consecutive runs become one, where they were. A merge keeps
    equal keys in run order, so each key's values stay in arrival order, and every run is
    rewritten once a pass. ``merge`` writes its runs as one, removes them and returns the
    new one's path; in place, so every live run is always in ``runs``, which the caller
    removes however the task ends."""
    while len(runs) > MERGE_FANIN:
        i = 0
        while i < len(runs):
            group = runs[i : i + MERGE_FANIN]
            if len(group) > 1:
                runs[i : i + MERGE_FANIN] = [merge(group)]
            i += 1


def _identity(key: Any, values: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """A map-only step's reduce: every value as it came."""
    for v in values:
        yield key, v


def _write_output(
    job: Job,
    keyed: Iterator[tuple[Any, Iterator[Any]]],
    out: Any,
    result: ReduceResult,
    output_format: str = "text",
    step: Step | None = None,
    step_name: str = "",
    held: list[tuple[Any, Any]] | None = None,
) -> None:
    """Reduce each key's values and write what reduce yields as ``output_format``
    (cmr.formats): for text, the lines ``format`` makes; between steps, pairs. ``held``:
    the pairs ``keyed`` groups, sorted, when they are all in memory."""
    if step is None:
        step, step_name = job_step(job, 0)
    reducer = f"{step_name}.reduce"
    reduce = step.reduce if step.reduce is not None else _identity
    write = formats.writer(output_format, job, out)
    pair: Any = None
    source: Any = usercode.NOTHING
    try:
        _hook(step.reduce_init)
        if step.reduce is None and held is not None:
            # No reduce, the pairs in memory: written as they are, with no call per key
            # (raw output of bytes by C alone: TeraSort's).
            done = formats.write_raw(output_format, out, held)
            for pair in itertools.islice(held, done, None):
                write(*pair)
            result.records_out += len(held)
            keyed = iter(())
        for key, values in keyed:
            source = reduce(key, values)
            pair = None
            for pair in source:
                if type(pair) is tuple:
                    k, v = pair
                else:  # a str of 2 would unpack as a pair
                    k, v = usercode.as_pair(pair, reducer, source)
                write(k, v)
                result.records_out += 1
        source = _hook(step.reduce_final)
        for pair in source if source is not None else ():
            k, v = pair if type(pair) is tuple else usercode.as_pair(pair, reducer, source)
            write(k, v)
            result.records_out += 1
    except (TypeError, ValueError, OverflowError) as exc:
        if usercode.culprit(exc) is not None:
            raise  # the user's code raised it (their own format() too): reported as such
        # Pairs go on the wire (msgpack) only in the pairs format.
        problem = usercode.bad_output(reducer, pair, exc, source, wire=output_format == "pairs")
        if problem is exc and output_format == "text" and type(job).format is not Job.format:
            # The user's own format() returned something a file cannot take.
            line = job.format(*pair)
            if not isinstance(line, str | bytes):
                problem = usercode.not_a_line(f"{type(job).__name__}.format", line)
        if problem is exc and output_format != "text":
            k, v = pair
            problem = usercode.UserCodeError(
                f"{reducer} yielded ({usercode.quote(k)}, {usercode.quote(v)}), which output "
                f"format {output_format} cannot write ({exc})"
            )
        if problem is exc:  # a pair of the right shape: format (ours) could not write it
            problem = usercode.unrenderable(reducer, pair, exc, source)
        raise problem from exc


class _Hashing(io.RawIOBase):
    """A file that hashes what it writes: the reduce output's sha256, which its commit
    names and the next step checks, costs no second read of the file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = io.FileIO(path, "wb")
        self.hash = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = self.file.write(b) or 0
        self.hash.update(memoryview(b).cast("B")[:n])
        return n

    def close(self) -> None:
        super().close()
        self.file.close()


@contextlib.contextmanager
def _output(out_path: str, result: ReduceResult) -> Iterator[BinaryIO]:
    """The reduce output file, opened for writing; once closed, ``result.sha256`` is the
    digest of what it holds."""
    raw = _Hashing(out_path)
    with io.BufferedWriter(raw, 1 << 16) as out:
        yield out
    result.sha256 = raw.hash.hexdigest()


def run_reduce(
    job_id: str,
    ref: JobRef,
    params: dict[str, str],
    spools: list[str],
    out_path: str,
    memory_bytes: int,
    spill_dir: str,
    use_combiner: bool = True,
    limit_s: float = 0.0,
    what: str = "reduce",
    step_index: int = 0,
    output_format: str = "",
    files_dir: str = "",
    sort_values: bool | None = None,
    value_order: Callable[[Any], Any] | None = None,
) -> ReduceResult:
    """Group the winners' pairs by key (spilling sorted runs past the memory budget), run
    reduce over keys in sorted order, and write the partition's output lines. With
    ``use_combiner`` (and a job that has combine) long value lists are combined as they grow.
    ``sort_values``: each key's values reach reduce sorted, by ``value_order`` (a key
    function; None: natural order); None: as the job class says (``value_sorting``)."""
    result = ReduceResult()
    runs: list[str] = []  # sorted runs spilled to disk: removed however the task ends
    try:
        with (
            taskprogress.running(job_id),
            counters.collecting() as counted,
            _reported(result, limit_s, what),
        ):
            job = job_instance(job_id, ref, params, files_dir=files_dir).for_task()
            step, step_name = job_step(job, step_index)
            if sort_values is None:
                sort_values, value_order = value_sorting(job, step)
            order = ValueOrder(job, value_order) if sort_values else None
            combiner = (
                Combiner(step.combine, f"{step_name}.combine")
                if use_combiner and step.combine is not None
                else None
            )
            fmt = output_format or type(job).output_format  # "": the class's
            if not _sorted_rows(
                step, fmt, combiner, order, spools, out_path, memory_bytes, spill_dir, runs, result
            ):
                _grouped(
                    job,
                    step,
                    step_name,
                    combiner,
                    order,
                    spools,
                    out_path,
                    memory_bytes,
                    spill_dir,
                    runs,
                    result,
                    fmt,
                )
        _take_counters(counted, result)
    finally:
        for r in runs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(r)
    return result


def _sorted_rows(
    step: Step,
    fmt: str,
    combiner: Combiner | None,
    order: ValueOrder | None,
    spools: list[str],
    out_path: str,
    memory_bytes: int,
    spill_dir: str,
    runs: list[str],
    result: ReduceResult,
) -> bool:
    """A step with no reduce writing raw output of fixed records (TeraSort): sorted as
    arrays (cmr.fixedsort). False when it is not such a step, or its spools hold other
    pairs, with nothing written: the general path then does it."""
    if (
        fmt != "raw"
        or combiner is not None
        or order is not None
        or step.reduce is not None
        or step.reduce_init is not None
        or step.reduce_final is not None
    ):
        return False
    from cmr import fixedsort  # numpy: imported only where records are sorted

    with _output(out_path, result) as out:
        try:
            done = fixedsort.sort_spools(spools, memory_bytes, spill_dir, out, runs)
        except fixedsort.NotRows:
            return False  # before it wrote anything, and with the runs it spilled removed
    result.records_out, result.spills = done
    return True


def _grouped(
    job: Job,
    step: Step,
    step_name: str,
    combiner: Combiner | None,
    order: ValueOrder | None,
    spools: list[str],
    out_path: str,
    memory_bytes: int,
    spill_dir: str,
    runs: list[str],
    result: ReduceResult,
    fmt: str,
) -> None:
    """Group the spooled pairs by key, in memory and in runs spilled past the budget, and
    write what reduce makes of each key's values."""
    groups: dict[Any, list[Any]] = {}
    held = 0
    blocks = _blocks(spools, memory_bytes)
    pairs: list[tuple[Any, Any]] = []
    rest: Iterator[tuple[list[tuple[Any, Any]], int]] | None = blocks
    if combiner is None and order is None:
        pairs, rest = _sorted_pairs(blocks, memory_bytes, spill_dir, runs)
        if rest is not None:  # a key of another kind: grouped as below, from here
            rest = itertools.chain([(pairs, 0)], rest)
            pairs = []
    for block, _ in rest if rest is not None else ():
        for key, value in block:
            try:
                vals = groups.get(key)
            except TypeError:  # a dict in the key: the map's to answer for
                raise usercode.unhashable_key(key, _mapper_name(job, step, step_name)) from None
            if vals is None:
                groups[key] = [value]
                held += KEY_COST + sys.getsizeof(key) + sys.getsizeof(value)
            else:
                vals.append(value)
                held += VALUE_COST + sys.getsizeof(value)
                if (
                    combiner is not None
                    and len(vals) >= REDUCE_COMBINE_AT
                    and combiner.due(key, len(vals))
                ):
                    groups[key] = combiner.values(key, vals)
            if held >= memory_bytes:
                runs.append(_write_run(groups, spill_dir, order))
                groups, held = {}, 0
                if combiner is not None:
                    combiner.forget()
    plain = rest is None  # every key of one plain kind, in runs and in pairs
    if runs:
        if pairs:
            runs.append(_write_pairs_run(pairs, spill_dir))
        if groups:
            runs.append(_write_run(groups, spill_dir, order))
        groups, pairs = {}, []
        result.spills = len(runs)
        # Each open run holds a read buffer: merge at most MERGE_FANIN at once, so the
        # buffers stay within the budget however many runs the partition needed.
        read_size = max(16 * 1024, min(1 << 20, memory_bytes // (2 * MERGE_FANIN)))
        merge_in_passes(runs, lambda group: _merge_runs(group, spill_dir, read_size, order, plain))
        merged = _merged(runs, read_size, order, plain)
        keyed: Iterator[tuple[Any, Iterator[Any]]] = (
            (k, itertools.chain.from_iterable(vs for _, vs in grp))
            for k, grp in itertools.groupby(merged, key=_first)
        )
    elif rest is None:
        keyed = ((k, map(_second, grp)) for k, grp in itertools.groupby(pairs, _first))
    elif order is not None:
        keyed = ((k, iter(order.sorted(groups[k]))) for k in _sorted_keys(groups))
    else:
        keyed = ((k, iter(groups[k])) for k in _sorted_keys(groups))
    with _output(out_path, result) as out:
        sorted_pairs = pairs if rest is None and not runs else None
        _write_output(job, keyed, out, result, fmt, step, step_name, sorted_pairs)
