"""The reduce half of a task: group the winners' spooled pairs by key (in memory, or in
sorted runs spilled past the budget: :mod:`cmr.cpu.runs`), run reduce over the keys in
order, and write what it yields in the output format to a file hashed as it is written.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import operator
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from cmr import counters, formats, taskprogress, timelimit, usercode
from cmr import digest as digests
from cmr.cpu import summing
from cmr.cpu.instances import hook, job_instance, job_step, mapper_name
from cmr.cpu.order import ValueOrder, sorted_keys, value_sorting
from cmr.cpu.results import ReduceResult, reported, take_counters
from cmr.cpu.runs import (
    MERGE_FANIN,
    merge_in_passes,
    merge_runs,
    merged_entries,
    sort_pairs,
    sorted_pairs,
    spool_blocks,
    write_pairs_run,
    write_run,
)
from cmr.cpu.shuffle import REDUCE_COMBINE_AT, Combiner
from cmr.cpu.specs import ReduceSpec
from cmr.job import Job, JobRef, Step

# What holding a pair costs the reducer beyond the sizes of its key and value objects
# (measured on CPython 3.11: ~195 B for a new 9-character key, ~31 B per added int):
KEY_COST = 136  # a new key: its dict slot and a one-element list
VALUE_COST = 8  # one more value of a key: a list slot
LINES_JOINED = 4096  # output lines written at once
_first = operator.itemgetter(0)  # a pair's key, by C
_second = operator.itemgetter(1)  # a pair's value


def run_reduce(
    ref: JobRef, params: dict[str, str], spools: list[str], spec: ReduceSpec
) -> ReduceResult:
    """Group the winners' pairs by key (spilling sorted runs past the memory budget), run
    reduce over keys in sorted order, and write the partition's output lines. With
    ``spec.combine`` (and a job that has combine) long value lists are combined as they
    grow."""
    result = ReduceResult()
    runs: list[str] = []  # sorted runs spilled to disk: removed however the task ends
    try:
        with (
            taskprogress.running(spec.job),
            counters.collecting() as counted,
            reported(result, spec.limit_s, spec.what),
        ):
            job = job_instance(spec.job, ref, params, files_dir=spec.files_dir).for_task()
            step, step_name = job_step(job, spec.step)
            sort_values, value_order = spec.sort_values, spec.value_order
            if sort_values is None:
                sort_values, value_order = value_sorting(job, step)
            order = ValueOrder(job, value_order) if sort_values else None
            combiner = (
                Combiner(step.combine, f"{step_name}.combine")
                if spec.combine and step.combine is not None
                else None
            )
            fmt = spec.output_format or type(job).output_format  # "": the class's
            if not _sorted_rows(step, fmt, combiner, order, spools, spec, runs, result):
                _grouped(job, step, step_name, combiner, order, spools, spec, runs, result, fmt)
        take_counters(counted, result)
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
    spec: ReduceSpec,
    runs: list[str],
    result: ReduceResult,
) -> bool:
    """A step with no reduce writing raw output of fixed records (TeraSort): sorted as
    arrays (cmr.cpu.fixedsort). False when it is not such a step, or its spools hold other
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
    from cmr.cpu import fixedsort  # numpy: imported only where records are sorted

    with _output(spec.out_path, result) as out:
        try:
            done = fixedsort.sort_spools(spools, spec.memory_bytes, spec.spill_dir, out, runs)
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
    spec: ReduceSpec,
    runs: list[str],
    result: ReduceResult,
    fmt: str,
) -> None:
    """Group the spooled pairs by key, in memory and in runs spilled past the budget, and
    write what reduce makes of each key's values."""
    memory_bytes, spill_dir = spec.memory_bytes, spec.spill_dir
    groups: dict[Any, list[Any]] = {}
    held = 0
    blocks = spool_blocks(spools, memory_bytes)
    pairs: list[tuple[Any, Any]] = []
    arrival: list[tuple[Any, Any]] = []  # the same pairs in the order they came
    rest: Iterator[tuple[list[tuple[Any, Any]], int]] | None = blocks
    if order is None:
        pairs, rest = sorted_pairs(blocks, memory_bytes, spill_dir, runs, combiner)
        if rest is not None:  # a key of another kind: grouped as below, from here
            rest = itertools.chain([(pairs, 0)], rest)
            pairs = []
        else:
            arrival, pairs = pairs, sort_pairs(pairs)
    for block, _ in rest if rest is not None else ():
        for key, value in block:
            try:
                vals = groups.get(key)
            except TypeError:  # a dict in the key: the map's to answer for
                raise usercode.unhashable_key(key, mapper_name(job, step, step_name)) from None
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
                runs.append(write_run(groups, spill_dir, order))
                groups, held = {}, 0
                if combiner is not None:
                    combiner.forget()
    plain = rest is None  # every key of one plain kind, in runs and in pairs
    if runs:
        if pairs:
            runs.append(write_pairs_run(pairs, spill_dir))
        if groups:
            runs.append(write_run(groups, spill_dir, order))
        # Let go of what is written now (arrival too, the same pairs): the merge's read
        # buffers below are sized on the budget being free again.
        groups, pairs, arrival = {}, [], []
        result.spills = len(runs)
        # Each open run holds a read buffer: merge at most MERGE_FANIN at once, so the
        # buffers stay within the budget however many runs the partition needed.
        read_size = max(16 * 1024, min(1 << 20, memory_bytes // (2 * MERGE_FANIN)))
        merge_in_passes(runs, lambda group: merge_runs(group, spill_dir, read_size, order, plain))
        merged = merged_entries(runs, read_size, order, plain)
        keyed: Iterator[tuple[Any, Iterator[Any]]] = (
            (k, itertools.chain.from_iterable(vs for _, vs in grp))
            for k, grp in itertools.groupby(merged, key=_first)
        )
    elif rest is None:
        keyed = ((k, map(_second, grp)) for k, grp in itertools.groupby(pairs, _first))
    elif order is not None:
        keyed = ((k, iter(order.sorted(groups[k]))) for k in sorted_keys(groups))
    else:
        keyed = ((k, iter(groups[k])) for k in sorted_keys(groups))
    with _output(spec.out_path, result) as out:
        in_order = pairs if rest is None and not runs else None
        write_output(job, keyed, out, result, fmt, step, step_name, in_order)
    # The sorted pairs let go first, then those in arrival order: their objects are freed
    # in the order they were made, along memory, rather than at random (measured on a word
    # count reducer's 600,000 pairs: 0.09 s rather than 0.23 s).
    del keyed, in_order, pairs
    arrival.clear()


def _identity(key: Any, values: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """A map-only step's reduce: every value as it came."""
    for v in values:
        yield key, v


def write_output(
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
        hook(step.reduce_init)
        if step.reduce is None and held is not None:
            # No reduce, the pairs in memory: written as they are, with no call per key
            # (raw output of bytes by C alone: TeraSort's).
            done = formats.write_raw(output_format, out, held)
            for pair in itertools.islice(held, done, None):
                write(*pair)
            result.records_out += len(held)
            keyed, held = iter(()), None
        if output_format == "text" and _default_format(job):
            # Job.format's lines of a str key and an int or str value made here, as
            # f"{key}\t{value}" (what format() makes of them), and written in blocks: a
            # word count writes a line per key, and the calls were half its writing.
            # The pairs held are grouped here, as keyed would group them, with no
            # generator of ours resumed per key (~18% of this loop on 400,000 keys).
            lines: list[bytes] = []
            add_line = lines.append
            grouped = held is not None
            if held is not None and _sums_of_ints(step.reduce, held):
                # A reduce that is `yield key, sum(values)` (cmr.cpu.summing) over int
                # values and str keys: its one line per key made here, with no generator
                # made and resumed per key (a word count reducer's 400,000 keys: ~15% of
                # this loop's time).
                for key, values in itertools.groupby(held, _first):
                    add_line(f"{key}\t{sum(map(_second, values))}\n".encode())
                    if len(lines) >= LINES_JOINED:
                        _write_lines(out, lines, result)
                held = []  # taken: the loop below groups nothing
            for key, values in itertools.groupby(held, _first) if held is not None else keyed:
                source = reduce(key, map(_second, values) if grouped else values)
                pair = None
                for pair in source:
                    if type(pair) is tuple and len(pair) == 2:
                        k, v = pair
                        if type(k) is str and (type(v) is int or type(v) is str):
                            add_line(f"{k}\t{v}\n".encode())
                            continue
                    _write_lines(out, lines, result)  # what came before, then this pair
                    k, v = pair if type(pair) is tuple else usercode.as_pair(pair, reducer, source)
                    write(k, v)
                    result.records_out += 1
                if len(lines) >= LINES_JOINED:
                    _write_lines(out, lines, result)
            _write_lines(out, lines, result)
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
        source = hook(step.reduce_final)
        for pair in source if source is not None else ():
            k, v = pair if type(pair) is tuple else usercode.as_pair(pair, reducer, source)
            write(k, v)
            result.records_out += 1
    except (TypeError, ValueError, OverflowError) as exc:
        if usercode.culprit(exc) is not None:
            raise  # the user's code raised it (their own format() too): reported as such
        # Pairs go on the wire (msgpack) only in the pairs format.
        problem = usercode.bad_output(reducer, pair, exc, source, wire=output_format == "pairs")
        if problem is exc and output_format == "text" and not _default_format(job):
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


def _sums_of_ints(reduce: Any, held: list[tuple[Any, Any]]) -> bool:
    """Whether reduce yields exactly each key and the sum of its values, as one text line
    of Job.format's (``summing.is_sum``), for these pairs: str keys (sorted_pairs held
    them, all of one kind) and values that are all ints (not bools: checked by C)."""
    return (
        bool(held)
        and type(held[0][0]) is str
        and summing.is_sum(reduce)
        and set(map(type, map(_second, held))) == {int}
    )


def _default_format(job: Job) -> bool:
    """Whether the job's lines are Job.format's: not its class's own, nor one set on the
    instance (in ``setup``)."""
    return type(job).format is Job.format and "format" not in getattr(job, "__dict__", {})


def _write_lines(out: BinaryIO, lines: list[bytes], result: ReduceResult) -> None:
    out.write(b"".join(lines))
    result.records_out += len(lines)
    lines.clear()


class _Hashing(io.RawIOBase):
    """A file that hashes what it writes: the reduce output's digest (cmr.digest), which
    its commit names and the next step checks, costs no second read of the file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = io.FileIO(path, "wb")
        self.hash = digests.new()
        # A pipe the worker uploads from (cmr.poolpipe): a write waits while the store is
        # slow, and that wait is not the job's code's time (cmr.timelimit.paused).
        self.waits = (
            timelimit.paused if stat.S_ISFIFO(os.fstat(self.file.fileno()).st_mode) else None
        )

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.waits is None:
            n = self.file.write(b) or 0
        else:
            with self.waits():
                n = self.file.write(b) or 0
        self.hash.update(memoryview(b).cast("B")[:n])
        return n

    def close(self) -> None:
        super().close()
        self.file.close()


@contextlib.contextmanager
def _output(out_path: str, result: ReduceResult) -> Iterator[BinaryIO]:
    """The reduce output file, opened for writing; once closed, ``result.digest`` is the
    digest of what it holds."""
    raw = _Hashing(out_path)
    with io.BufferedWriter(raw, 1 << 16) as out:
        yield out
    result.digest = raw.hash.hexdigest()
