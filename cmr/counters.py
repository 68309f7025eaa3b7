"""Counters (``Job.increment_counter``) and status lines (``Job.set_status``), as mrjob has them.

A task's counters are gathered in the pool process that runs it, reset for every task, and
travel back with its result. The map attempt writes them into its commit record, the reduce
claim into its fenced commit: only a winning attempt's record ever stands, so when finalize
sums the winners' records into the job record each winning attempt counts exactly once, and
a losing or crashed attempt's counters never count.

Those records are strangers' data to whoever reads them: the encoding is a msgpack list of
``[group, name, n]`` rows, with bounded rows, UTF-8 lengths and values, checked on read.
Unlike :mod:`cmr.taskprogress` (live, best effort), counters are exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cmr import wire
from cmr.errors import WireError

MAX_COUNTERS = 1_000  # distinct (group, name) per task, and per job record
MAX_GROUP_BYTES = 128  # Hadoop's limits for counter group and counter names
MAX_NAME_BYTES = 64
MAX_VALUE = 2**63 - 1  # a task's total of one counter stays within +-this (DynamoDB sums)
MAX_STATUS = 500  # characters of a status line kept
# Rows of at most 128 + 64 bytes and a 9-byte int: what MAX_COUNTERS rows may take at most.
MAX_BYTES = MAX_COUNTERS * (MAX_GROUP_BYTES + MAX_NAME_BYTES + 16) + 8

Flat = dict[tuple[str, str], int]


class _Task:
    """One task's counters and last status line."""

    def __init__(self) -> None:
        self.counts: Flat = {}
        self.status = ""
        self.error = ""  # a limit broken: the task fails with it, even if the user caught it


_task: _Task | None = None  # the task this pool process runs (one at a time)


@contextlib.contextmanager
def collecting() -> Iterator[_Task]:
    """Counters incremented inside belong to this task only: a pool process that ran
    another task (of whichever job) before must never carry its counters over."""
    global _task  # noqa: PLW0603 - a pool process runs one task at a time
    _task = task = _Task()
    try:
        yield task
    finally:
        _task = None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Increments inside count for no task (``setup``: it runs once per process, so what it
    counted would depend on how many processes ran the job)."""
    global _task  # noqa: PLW0603 - a pool process runs one task at a time
    task, _task = _task, None
    try:
        yield
    finally:
        _task = task


def _text(what: str, value: Any, most: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"increment_counter: the counter {what} must be a str; got {value!r}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8, so no record could hold it
        size = -1
    if not 1 <= size <= most or "\x00" in value:
        raise ValueError(
            f"increment_counter: the counter {what} must be 1 to {most} UTF-8 bytes with no NUL; "
            f"got {value[:80]!r} ({size} bytes)"
        )
    return value


def increment(group: str, name: str, n: int = 1) -> None:
    """Add ``n`` to the task's counter ``group``/``name``. Outside a task (a sequential run,
    ``setup`` in a test) it does nothing."""
    _text("group", group, MAX_GROUP_BYTES)
    _text("name", name, MAX_NAME_BYTES)
    if type(n) is not int:
        if isinstance(n, bool) or not hasattr(n, "__index__"):
            raise TypeError(f"increment_counter: n must be an int; got {n!r}")
        n = int(n)  # numpy's integers and other int-likes
    task = _task
    if task is None:
        return
    key = (group, name)
    total = task.counts.get(key, 0) + n
    if key not in task.counts and len(task.counts) >= MAX_COUNTERS:
        task.error = (
            f"increment_counter: a task may use at most {MAX_COUNTERS:,} distinct counters; "
            f"{group!r}/{name!r} would be one more (counters count kinds of things: put "
            "per-item values in the output instead)"
        )
        raise ValueError(task.error)
    if not -MAX_VALUE <= total <= MAX_VALUE:
        task.error = (
            f"increment_counter: counter {group!r}/{name!r} went past +-(2**63 - 1) in one task"
        )
        raise OverflowError(task.error)
    task.counts[key] = total


def set_status(msg: str) -> None:
    """The task's status line: logged by the worker when the task ends. Never decides."""
    if _task is not None:
        _task.status = str(msg)[:MAX_STATUS]


def encode(counts: Flat) -> bytes:
    """A task's counters as the records keep them (b"" when there are none)."""
    if not counts:
        return b""
    return wire.pack([[g, n, v] for (g, n), v in sorted(counts.items()) if v])


def decode(data: Any) -> Flat:
    """The counters of a commit record (``None``: none). WireError, with a short text, when
    the field is not what a worker writes: too many rows, long or non-str names, repeated
    counters, values out of range, extra bytes."""
    if data is None or data == b"":
        return {}
    try:
        return _decode(data)
    except WireError:
        raise
    except Exception as exc:  # msgpack's zoo, whatever the bytes provoke
        raise WireError(f"counters are malformed ({type(exc).__name__})") from None


def _decode(data: Any) -> Flat:
    if not isinstance(data, bytes) or len(data) > MAX_BYTES:
        raise WireError(f"counters are not msgpack bytes of at most {MAX_BYTES}")
    # Rows are walked header by header: a row count is refused before a row is read.
    up = wire.unpacker(len(data), max_str=MAX_GROUP_BYTES)
    up.feed(data)
    rows = up.read_array_header()
    if rows > MAX_COUNTERS:
        raise WireError(f"{rows} counters (at most {MAX_COUNTERS})")
    counts: Flat = {}
    for _ in range(rows):
        if up.read_array_header() != 3:
            raise WireError("a counter is not [group, name, n]")
        group, name, n = up.unpack(), up.unpack(), up.unpack()
        for what, text, most in (("group", group, MAX_GROUP_BYTES), ("name", name, MAX_NAME_BYTES)):
            if not isinstance(text, str) or not 1 <= len(text.encode("utf-8")) <= most:
                raise WireError(f"a counter {what} is not a str of 1 to {most} bytes")
        if type(n) is not int or not -MAX_VALUE <= n <= MAX_VALUE:
            raise WireError(f"counter {group[:40]!r}/{name[:40]!r} is not an int within +-2**63")
        if (group, name) in counts:
            raise WireError(f"counter {group[:40]!r}/{name[:40]!r} appears twice")
        counts[(group, name)] = n
    if up.tell() != len(data):
        raise WireError("extra bytes after the counters")
    return counts


class Totals:
    """The job's counters summed from its winners' records, bounded: past MAX_COUNTERS
    distinct counters the rest are counted as omitted, not kept (the job record is one
    item of the table, 400 KB on DynamoDB)."""

    def __init__(self) -> None:
        self.sums: Flat = {}
        self.omitted = 0

    def add(self, counts: Flat) -> None:
        for key, n in counts.items():
            if key in self.sums:
                self.sums[key] += n
            elif len(self.sums) < MAX_COUNTERS:
                self.sums[key] = n
            else:
                self.omitted += 1

    def nested(self) -> dict[str, dict[str, int]]:
        return nested(self.sums)

    def add_nested(self, found: Any) -> None:
        """Counters as a record holds them ({group: {name: n}}), such as an earlier step's;
        anything else in the field is left out rather than trusted."""
        for group, names in of_record({"counters": found}).items():
            self.add({(group, name): n for name, n in names.items()})


def nested(counts: Flat) -> dict[str, dict[str, int]]:
    """{group: {name: n}}, groups and names sorted."""
    out: dict[str, dict[str, int]] = {}
    for (group, name), n in sorted(counts.items()):
        out.setdefault(group, {})[name] = n
    return out


def of_record(record: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The counters a job record holds ({} when none), as plain data; anything else in the
    field (a record edited by hand) is left out rather than trusted."""
    found = record.get("counters")
    if not isinstance(found, dict):
        return {}
    out: dict[str, dict[str, int]] = {}
    # Filtered before sorted: keys of other types (an Azure item keeps int keys) do not sort
    # among strings.
    for group, names in sorted((g, n) for g, n in found.items() if isinstance(g, str)):
        if not isinstance(names, dict):
            continue
        clean = {k: v for k, v in names.items() if isinstance(k, str) and type(v) is int}
        if clean:
            out[group] = dict(sorted(clean.items()))
    return out


def lines(counters: dict[str, dict[str, int]]) -> list[str]:
    """The counters as mrjob prints them: each group, then its counters indented."""
    out = []
    for group, names in counters.items():
        out.append(group)
        out += [f"    {name}={n}" for name, n in names.items()]
    return out
