"""The map half of a task: read the chunks (or the file slices) handed over, run the step's
map over pieces of lines or over records, and send what it yields, combined when the job
combines, to the shuffle (:mod:`cmr.cpu.shuffle`). What user code yields is checked as
cheaply as the hot loops allow: one type test per pair, and a diagnosis of the pair only
once handling it failed.

Past ~400 lines for a reason: the map loop's fast paths (sums held in a dict, a dict's
distinct keys, blocks of pairs, fixed-width rows) all act on the one loop's state (its
groups, sums and shuffle); apart, each would take that state as arguments on every call.
"""

from __future__ import annotations

import itertools
import operator
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmr import counters, formats, taskprogress, usercode
from cmr.cpu import summing
from cmr.cpu.instances import hook, job_instance, job_step, mapper_name
from cmr.cpu.results import InputGone, MapResult, reported, take_counters
from cmr.cpu.runs import PAIR_BLOCK
from cmr.cpu.shuffle import (
    COMBINE_KEYS,
    REDUCE_COMBINE_AT,
    Block,
    Combiner,
    Shuffle,
    Values,
    partitioner,
    unpackable,
)
from cmr.cpu.specs import MapSpec, map_max_record
from cmr.job import Job, JobRef, Step
from cmr.localcheck import InputChanged, open_checked
from cmr.plan import Check

_DICT_ITEMS = type({0: 0}.items())  # a dict's items (map_chunk returning a Counter's)
_NONE = object()  # no value held for a key yet

if TYPE_CHECKING:  # imported where used: numpy costs every process ~0.2 s to import
    from cmr.cpu import fixedsort


@dataclass(frozen=True)
class FileSlice:
    """Bytes [start, end) of a local file, read by the pool process that maps them rather
    than sent to it: fixed records on a backend whose blobs are local files (2 GB of
    TeraSort input cost ~7 CPU s pickled through the pool's pipes), or a stored range the
    worker streams through a FIFO (cmr.rangefile)."""

    path: str
    start: int
    end: int
    name: str = ""  # the input's name (in errors)
    check: Check | None = None  # the file's identity at submit (cmr.localcheck); None: none
    # A stored range this worker streams through a FIFO (cmr.rangefile; start 0): read in
    # order, never sought in. Fewer bytes than its length, or failing to read it, is this
    # worker's fault (its stream stopped: the worker reports why), retried elsewhere, never
    # the input gone (which fails the job).
    stream: bool = False

    def __len__(self) -> int:
        return self.end - self.start

    def pieces(self, name: str, size: int) -> Iterator[bytes]:
        """The slice's bytes, ``size`` at a time, of the file submitted (or as its stream
        brings them): a split larger than memory (fixed records streamed from the store,
        cmr.rangefile) is never held whole. InputGone when the file went or changed since
        the job was submitted; for a stream, an OSError (retried elsewhere)."""
        try:
            fd = open_checked(self.path, self.name, self.check)
            with open(fd, "rb") as f:
                if self.stream:
                    # Opened without waiting (its writer is open already, or gone: then it
                    # reads as empty, a short read), read waiting for the bytes as they
                    # come; never sought in (a FIFO cannot seek: ESPIPE), as it starts at 0.
                    os.set_blocking(fd, True)
                else:
                    f.seek(self.start)
                for at in range(self.start, self.end, size):
                    # A buffered read waits until it has them all, or the end came first.
                    piece = f.read(min(size, self.end - at))
                    if len(piece) != min(size, self.end - at):
                        raise InputChanged(f"input {name} ({self.path}) ended early")
                    yield piece
        except InputChanged as exc:
            if self.stream:
                raise OSError(f"this worker's stream of input {name} is cut short: {exc}") from None
            raise InputGone(str(exc)) from None
        except OSError as exc:
            if self.stream:
                raise OSError(
                    f"this worker's stream of input {name} ({self.path}) cannot be read "
                    f"({exc.strerror})"
                ) from None
            raise InputGone(
                f"input {name} ({self.path}) cannot be read ({exc.strerror}): it was "
                "deleted or moved after the job was submitted"
            ) from None


def slice_bytes(name: str, piece: FileSlice) -> bytes:
    """A slice's bytes, whole (FileSlice.pieces: one piece, its errors)."""
    return b"".join(piece.pieces(name, max(1, len(piece))))


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
        reported(result, spec.limit_s, f"map task {spec.task}"),
    ):
        # Slices stay unread here: the fixed-record path reads them piece by piece
        # (map_calls); any other reads each whole when it comes to it.
        chunks = list(given)
        result.bytes_in = sum(len(d) for _, d in chunks)
        _map_into(ref, params, chunks, spec, fd, result)
        result.spool = path
    take_counters(counted, result)
    if result.error:
        os.unlink(path)
    return result


def _map_into(
    ref: JobRef,
    params: dict[str, str],
    chunks: list[tuple[str, bytes | FileSlice]],
    spec: MapSpec,
    fd: int,
    result: MapResult,
) -> None:
    job = job_instance(spec.job, ref, params, spec.lines, spec.files_dir).for_task()
    job._cmr_map_task(spec.step, chunks[0][0] if chunks else "")
    step, step_name = job_step(job, spec.step)
    universal = (spec.lines or job.lines) == "universal"
    fmt = formats.parse_input(spec.input_format or "lines")
    mapper = mapper_name(job, step, step_name, fmt.name == "lines")
    with os.fdopen(fd, "wb") as out:
        shuffle = Shuffle(spec, out)
        part = partitioner(job, spec.partitions, spec.cuts)
        n = spec.partitions
        combiner = (
            Combiner(step.combine, f"{step_name}.combine")
            if step.combine is not None and spec.combine
            else None
        )
        # A key's first value alone, its values once it has more (Combiner.flushed).
        groups: dict[Any, Any] = {}
        grouped = groups.get  # per pair: one lookup saved (groups is cleared, never replaced)
        # A combine that is `yield key, sum(values)`: int values added up here, by C where
        # they come as a dict (cmr.cpu.summing), until a value that is no int comes; then
        # the totals become the groups' first values and the task goes on the general way
        # (groups hold nothing while it sums), as if it had gone so from the start.
        sum_combine = False
        sums: dict[Any, int] = {}
        summed = sums.get
        sum_method = f"{mapper} (or {step_name}.combine)"
        # What was being handled when something failed: the culprit is diagnosed from it.
        pair, source = None, usercode.NOTHING
        try:
            hook(step.map_init)
            if combiner is not None:
                hook(step.combine_init)
                sum_combine = summing.is_sum(step.combine)  # `sum` as the hooks left it
            columns, packed = None, None
            if (
                fmt.name == "fixed"
                and step.map is None
                and combiner is None
                and spec.compress
                # a job's own partition() is called for every record, as the general path does
                and (spec.cuts is not None or type(job).partition is Job.partition)
            ):
                from cmr.cpu import fixedsort  # numpy: imported only where records are sorted

                columns = fixedsort.Cuts.of(part, n, fmt.key_len, fmt.record_len, shuffle.floor)
                packed = fixedsort.Packed
            last = [False]
            calls = map_calls(step, fmt, chunks, spec, result, universal, columns, last)
            for source in calls:
                if sum_combine and type(source) is _DICT_ITEMS:
                    counts = source.mapping
                    if summing.all_ints(counts.values()):
                        if len(sums) + len(counts) < COMBINE_KEYS:
                            summing.merge(sums, counts)
                        else:
                            _sum_into(sums, counts, shuffle, part, sum_method)
                        continue
                    sum_combine = _stop_summing(sums, groups)
                if last[0] and combiner is not None and not groups and type(source) is _DICT_ITEMS:
                    # The task's one source of pairs, a dict's items (map_chunk's Counter):
                    # its keys are distinct, so combining would send each pair as it came,
                    # in this order: sent so, with no grouping.
                    _send(shuffle, source, part, f"{mapper} (or {combiner.method})")
                    continue
                if combiner is not None and not groups and type(source) is _DICT_ITEMS:
                    # A dict's items with more to come (a split that ends a sliver into
                    # the next file, 5 of real text's 8 tasks): its keys are distinct and
                    # hashable, each held alone as its value, so no loop of ours is needed
                    # (~0.2 s of such a task's ~1.6 s).
                    _take_distinct(source, groups, combiner, shuffle, part, mapper)
                    continue
                if type(source) is packed:
                    for p, rows, count in source.parts():
                        shuffle.add_rows(p, rows, count, source.layout.width)
                    continue
                if type(source) is Block and combiner is None:
                    try:
                        shuffle.add_block(source, part)
                    except (TypeError, ValueError, OverflowError):
                        pair = unpackable(source)  # what the diagnosis below names
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
                    if sum_combine:
                        if type(value) is int:
                            try:
                                sums[key] = summed(key, 0) + value
                            except TypeError:  # a list key: summed as the tuple it arrives as
                                key = usercode.key_of(key, mapper)
                                sums[key] = summed(key, 0) + value
                            if len(sums) >= COMBINE_KEYS:
                                _send_sums(shuffle, sums, part, sum_method)
                            continue
                        sum_combine = _stop_summing(sums, groups)
                    try:
                        vals = grouped(key, _NONE)
                    except TypeError:  # a list key: grouped as the tuple it arrives as
                        key = usercode.key_of(key, mapper)
                        vals = grouped(key, _NONE)
                    if vals is _NONE:
                        groups[key] = value  # alone: most keys of a task never get another
                        if len(groups) >= COMBINE_KEYS:
                            _flush(combiner, groups, shuffle, part, mapper)
                            groups.clear()
                    elif type(vals) is Values:
                        vals.append(value)
                        if len(vals) >= REDUCE_COMBINE_AT and combiner.due(key, len(vals)):
                            groups[key] = Values(combiner.values(key, vals))
                    else:
                        groups[key] = Values((vals, value))
        except (TypeError, ValueError, OverflowError) as exc:
            if usercode.culprit(exc) is not None:
                raise  # the user's code raised it: reported as such
            if usercode.innermost_code(exc) is Job.map_chunk.__code__:
                # Job.map_chunk's `yield from self.map(...)`: map returned no iterable.
                method = f"{type(job).__name__}.map"
                raise usercode.not_pairs(method, usercode.NOTHING, exc) from exc
            raise usercode.bad_output(mapper, pair, exc, source) from exc
        if combiner is not None:
            _send_sums(shuffle, sums, part, sum_method)
            _flush(combiner, groups, shuffle, part, mapper)
            _emit_final(step.combine_final, f"{step_name}.combine_final", shuffle, part)
        shuffle.close()
    result.batches, result.records = shuffle.batches, shuffle.records


def _flush(
    combiner: Combiner,
    groups: dict[Any, Any],
    shuffle: Shuffle,
    part: Callable[[Any, int], int],
    mapper: str,
) -> None:
    """Send the combined groups to the shuffle."""
    _send(shuffle, combiner.flushed(groups), part, f"{mapper} (or {combiner.method})")


def _stop_summing(sums: dict[Any, int], groups: dict[Any, Any]) -> bool:
    """A value that is no int came to a summing combine: the task's totals become what the
    groups hold, each key's total its first value and in the order the keys came (the int
    values a key got before it, added up: what the combine would have added first), and the
    task goes on the general way. Returns False: the task no longer sums."""
    # Every source goes to the totals while the task sums: nothing is grouped yet.
    assert not groups, "a summing map task grouped values"
    groups.update(sums)
    sums.clear()
    return False


def _send_sums(
    shuffle: Shuffle,
    sums: dict[Any, int],
    part: Callable[[Any, int], int],
    method: str,
) -> None:
    """Send the task's totals (a summing combine's) to the shuffle, and start afresh; a
    pair that cannot go is the fault of ``method``'s output."""
    try:
        shuffle.add_pairs(sums.items(), part)
    except (TypeError, ValueError, OverflowError) as exc:
        if usercode.culprit(exc) is not None:
            raise
        raise usercode.bad_output(method, shuffle.last_pair, exc) from exc
    sums.clear()


def _sum_into(
    sums: dict[Any, int],
    counts: Mapping[Any, int],
    shuffle: Shuffle,
    part: Callable[[Any, int], int],
    method: str,
) -> None:
    """Add a dict of int counts to the task's totals as the pair-by-pair loop would, the
    totals sent each time they reach COMBINE_KEYS keys (at the key where that loop sends
    them), with no loop of ours per key: a word count's split of real text holds ~340,000
    distinct words, and that loop was a fifth of what counting them took. The keys that
    make the totals full are found by C (which of them the totals lack), the part up to
    there merged, and each full set of COMBINE_KEYS keys after it sent as it is: the keys
    of a dict are distinct, so into empty totals each would go alone and leave unchanged."""
    items = iter(counts.items())
    left = len(counts)
    if sums:
        room = COMBINE_KEYS - len(sums)
        fresh = itertools.compress(itertools.count(), map(_absent, map(sums.__contains__, counts)))
        last = next(itertools.islice(fresh, room - 1, None), None)  # the room-th new key
        if last is None:  # the totals do not fill up: all of it merged
            summing.merge(sums, counts)
            return
        summing.merge(sums, dict(itertools.islice(items, last + 1)))
        left -= last + 1
        _send_sums(shuffle, sums, part, method)
    sums.update(_send_full_sets(items, left, shuffle, part, method))


_absent = operator.not_  # not in the totals: a new key


def _take_distinct(
    items: Any,
    groups: dict[Any, Any],
    combiner: Combiner,
    shuffle: Shuffle,
    part: Callable[[Any, int], int],
    mapper: str,
) -> None:
    """A dict's items, into empty groups, as the pair-by-pair loop takes them: each key
    held alone with its value (its keys are distinct and hashable), and the groups flushed
    each time they reach COMBINE_KEYS keys. Those flushed would go out as they came: they
    are sent so, never held; the rest (fewer) are held by C."""
    if len(items) >= COMBINE_KEYS:
        combiner.forget()  # what a flush of the groups does first (nothing is combined after)
    method = f"{mapper} (or {combiner.method})"
    groups.update(_send_full_sets(iter(items), len(items), shuffle, part, method))


def _send_full_sets(
    pairs: Iterator[tuple[Any, Any]],
    left: int,
    shuffle: Shuffle,
    part: Callable[[Any, int], int],
    method: str,
) -> Iterator[tuple[Any, Any]]:
    """Pairs of distinct keys (``left`` of them) going into empty totals or groups: each
    full COMBINE_KEYS of them is what a flush would send, in the order they came, so it is
    sent as it is; the rest, fewer, is returned to be held."""
    while left >= COMBINE_KEYS:
        _send(shuffle, itertools.islice(pairs, COMBINE_KEYS), part, method)
        left -= COMBINE_KEYS
    return pairs


def _send(
    shuffle: Shuffle,
    pairs: Iterable[tuple[Any, Any]],
    part: Callable[[Any, int], int],
    method: str,
) -> None:
    """Pairs to the shuffle; a pair that cannot go is the fault of ``method``'s output."""
    try:
        shuffle.add_pairs(pairs, part)
    except (TypeError, ValueError, OverflowError) as exc:
        if usercode.culprit(exc) is not None:
            raise
        raise usercode.bad_output(method, shuffle.last_pair, exc) from exc


def _emit_final(
    final_hook: Callable[[], Any] | None,
    method: str,
    shuffle: Shuffle,
    part: Callable[[Any, int], int],
) -> None:
    """The pairs a final hook yields (combine_final), sent as they are."""
    final = hook(final_hook)
    n = shuffle.spec.partitions
    for pair in final if final is not None else ():
        key, value = pair if type(pair) is tuple else usercode.as_pair(pair, method, final)
        shuffle.add(part(key, n), key, value)


def map_calls(
    step: Step,
    fmt: formats.InputFormat,
    chunks: Sequence[tuple[str, bytes | FileSlice]],
    spec: MapSpec,
    result: MapResult,
    universal: bool,
    columns: fixedsort.Cuts | None = None,
    last: list[bool] | None = None,
) -> Iterator[Any]:
    """What the step's map returns for each piece of lines (``map_chunk``) or each record
    (``map``) of the chunks, counting the records read; then what ``map_final`` returns.
    A step without map passes its records on as pairs; fixed records, uncompressed, as
    arrays of packed rows (fixedsort.Packed) when ``columns`` holds the cut points.
    ``last[0]`` is set before the task's last source of lines is yielded, when nothing
    (no map_final) comes after it."""
    codecs = spec.codecs or ("",) * len(chunks)
    starts = spec.starts or (0,) * len(chunks)
    # The largest record a compressed input or a whole file may decode to (the worker read
    # plain lines to the same bound: cmr.split.read_split).
    max_record = map_max_record(spec.piece_bytes)
    if fmt.name == "lines":
        map_piece = piece_mapper(step)
        # One piece read ahead (our own code, never the user's) tells which is the last.
        whole = [(n, slice_bytes(n, d) if isinstance(d, FileSlice) else d) for n, d in chunks]
        pieces = _line_pieces(whole, codecs, spec.piece_bytes, result, universal, max_record)
        upcoming = next(pieces, None)
        while upcoming is not None:
            name, piece = upcoming
            upcoming = next(pieces, None)
            if upcoming is None and last is not None and step.map_final is None:
                last[0] = True
            yield map_piece(name, piece)
    else:
        map_record = step.map
        for (name, given), codec, start in zip(chunks, codecs, starts, strict=True):
            if columns is not None and not codec and len(given) % fmt.record_len == 0:
                per = columns.layout.piece_records(spec.piece_bytes) * fmt.record_len
                if isinstance(given, FileSlice):
                    for piece in given.pieces(name, per):
                        result.records_in += len(piece) // fmt.record_len
                        yield columns.partitioned(piece)
                    continue
                view = memoryview(given)
                for at in range(0, len(given), per):
                    span = view[at : at + per]
                    result.records_in += len(span) // fmt.record_len
                    yield columns.partitioned(span)
                continue
            data = slice_bytes(name, given) if isinstance(given, FileSlice) else given
            read = formats.Chunk(name, data, codec, start, max_record)
            records = formats.records(fmt, read, spec.piece_bytes)
            if map_record is None:
                # No map: the records are the pairs, handed over in blocks (the shuffle
                # takes a block at once: Shuffle.add_block).
                while block := Block(itertools.islice(records, PAIR_BLOCK)):
                    result.records_in += len(block)
                    yield block
                continue
            for key, value in records:
                result.records_in += 1
                yield map_record(key, value)
    final = hook(step.map_final)
    if final is not None:
        yield final


def _line_pieces(
    chunks: list[tuple[str, bytes]],
    codecs: tuple[str, ...],
    size: int,
    result: MapResult,
    universal: bool,
    max_record: int,
) -> Iterator[tuple[str, bytes]]:
    """Each chunk's lines as pieces of about ``size`` bytes (decompressed first), with the
    name of the chunk's input, counting the lines read."""
    for (name, given), codec in zip(chunks, codecs, strict=True):
        if codec:
            c = formats.Chunk(name, given, codec, 0, max_record)
            for piece in formats.line_pieces(c, size, universal):
                result.records_in += piece.count(b"\n") + 1
                yield name, piece
            continue
        chunk = universal_lines(given) if universal else given
        # The last line's newline ends it; it opens no new (empty) line.
        data = chunk[:-1] if chunk.endswith(b"\n") else chunk
        result.records_in += data.count(b"\n") + 1 if chunk else 0
        if not chunk:
            continue
        for piece in _pieces(data, size):
            yield name, piece


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    """data (lines joined by \\n) as pieces of whole lines of about ``size`` bytes, each
    without its last newline: what map_chunk sees of the whole, in bounded bites (a user's
    map_chunk may hold many times its input in objects)."""
    start = 0
    while (nl := data.find(b"\n", start + size)) >= 0:
        yield data[start:nl]
        start = nl + 1
    yield data[start:] if start else data  # no copy when one piece is all of it


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


def universal_lines(data: bytes) -> bytes:
    """``data`` with "\r\n" and lone "\r" line endings made "\n" (Job.lines "universal")."""
    if b"\r" not in data:
        return data
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
