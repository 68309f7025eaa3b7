"""The plan a job's submitter commits: every map task's input ranges, and the parts its
publication replaces.

It is written once, before the job record that names its digest, and never changes. Map task
messages carry only a task number, a pointer into the plan: a worker reads the ranges from
here (checking the digest), so a message cannot tell it what to read, and a task message
lost from its queue can be sent again from the plan by any worker (``cmr.janitor``).

The digest only says the plan is the one the record names; whoever writes the table can
name any plan, so a plan is read as a stranger's bytes: its decoded size is bounded from
the zstd header (``wire.decoded_limit``), and tasks, ranges per task, ranges in all,
offsets and string lengths each have a limit checked before the next task is built. The
largest plan a worker will hold is the largest valid one (``MAX_PLAN_RANGES``).

A total-order job's plan also holds its cut points (``cuts``, :mod:`cmr.sampling`): keys,
each packed on its own (at most ``partition.MAX_CUT_BYTES``), at most one fewer than the
job's partitions, strictly increasing by ``cmr.usercode.sort_key``; a plan whose cut points
break any of this is refused like any other malformed plan.

A plan may also hold, per input URL, what that object must be when a map task reads it
(``checks``, :class:`Check`): its size and digest (a pipeline step's committed output,
whose digest its commit record names), or its file identity (a local input: device and
inode at submit). The reader compares before it decodes anything, so a bucket writer who
replaces a step's output, or whoever swaps a link into an input directory after submit,
makes the task fail with a clear reason instead of feeding it other bytes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from cmr import digest as digests
from cmr import wire
from cmr.backends.base import Blobs
from cmr.errors import UsageError, WireError
from cmr.partition import MAX_CUT_BYTES, is_key
from cmr.usercode import sort_key
from cmr.wire import Range

MAX_PLAN_DECODED = 32 * wire.MIB  # a plan of 100,000 ranges with 100-byte URLs is ~23 MiB
# A big file's ranges repeat its URL and name: with 1,000-character S3 keys a plan
# compresses ~850x (measured), with 100-character ones ~100x; a bomb's ratio is larger, and
# the cap above holds whatever the ratio.
MAX_PLAN_RATIO = 2048
MAX_RANGES_PER_TASK = 4_000  # cmr.split puts at most 2,000 in a task (small files packed)
MAX_PLAN_RANGES = 200_000  # input files or splits in one job: ~85 MB held, 50-byte URLs
MAX_OFFSET = 2**62  # ranges lie in [0, 2^62): S3's objects stop at 5 TiB (2^42)
MAX_TASK_BYTES = 64 * 1024**3  # what one task may read; cmr.split's tasks are ~2x a split
MAX_REPLACED = 2 * wire.MAX_PARTITIONS  # parts a publication replaces (one per partition)
_PLAN_FIELDS = 8
_CHECK_FIELDS = 4  # [size, digest, device, inode]
_ASYNC_PLAN_BYTES = 256 * 1024  # a plan blob larger than this is parsed in a thread


def plan_url(job_scratch: str) -> str:
    return job_scratch + "plan"


@dataclass(frozen=True, slots=True)
class Check:
    """What an input object must be when read whole: ``size`` bytes, and either its digest
    (:mod:`cmr.digest`, hex; a step's committed output) or, for a local file, its (device,
    inode) at submit (-1: not recorded)."""

    size: int
    digest: str = ""
    device: int = -1
    inode: int = -1

    def problem(self) -> str:
        """What makes this check malformed ("" if nothing)."""
        if not 0 <= self.size < MAX_OFFSET:
            return "its size is out of bounds"
        if self.digest and not digests.is_hex(self.digest):
            return "its digest is not 64 lowercase hex digits"
        if not (-1 <= self.device < 2**64 and -1 <= self.inode < 2**64):
            return "its device or inode is out of bounds"
        if not self.digest and self.inode < 0:
            return "it names neither a digest nor a file identity"
        return ""


@dataclass(frozen=True)
class Plan:
    tasks: tuple[tuple[Range, ...], ...]
    replaced: tuple[str, ...] = ()  # parts in the output place at submit (with --overwrite)
    # Total order: the range partitioner's cut points (() sends every key to part 0);
    # None: the job partitions by hash (or its own partition()).
    cuts: tuple[Any, ...] | None = None
    # Input URL -> what its object must be when read (see the module's text); most inputs
    # have none (an S3 input is the user's own data, read as it is when the task runs).
    checks: Mapping[str, Check] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The plan's blob; a plan no worker would accept is refused here, at submit."""
        self.check()
        doc = {
            "tasks": [[[r.url, r.start, r.end, r.name] for r in t] for t in self.tasks],
            "replaced": list(self.replaced),
        }
        if self.cuts is not None:
            doc["cuts"] = [wire.pack(c) for c in self.cuts]
        if self.checks:
            doc["checks"] = [
                [u, [c.size, c.digest, c.device, c.inode]] for u, c in sorted(self.checks.items())
            ]
        raw = wire.pack(doc)
        data = wire.compress(raw)
        if len(raw) > _plan_limit(len(data)):
            raise UsageError(
                f"the job's plan takes {len(raw):,} bytes ({len(data):,} compressed), "
                f"past what workers accept ({_plan_limit(len(data)):,}): use fewer input "
                "files or bigger splits"
            )
        return data

    def check(self) -> None:
        """UsageError when the plan is past a limit workers enforce on reading it."""
        ranges = sum(len(t) for t in self.tasks)
        if len(self.tasks) > wire.MAX_TASKS or ranges > MAX_PLAN_RANGES:
            raise UsageError(
                f"the job has {len(self.tasks):,} map tasks over {ranges:,} input ranges; "
                f"workers accept at most {wire.MAX_TASKS:,} tasks and {MAX_PLAN_RANGES:,} "
                "ranges: use bigger splits, or fewer and larger input files"
            )
        if len(self.replaced) > MAX_REPLACED:
            raise UsageError(
                f"the output place holds {len(self.replaced):,} parts to replace (workers "
                f"accept {MAX_REPLACED:,}): choose an empty output place"
            )
        for t in self.tasks:
            _check_task(t)
        if not all(_is_name(n) for n in self.replaced):
            raise UsageError("a part to replace has a name too long or holding NUL")
        if self.cuts is not None and (problem := cuts_problem(self.cuts)):
            raise UsageError(f"the job's cut points (total order): {problem}")
        if len(self.checks) > MAX_PLAN_RANGES:
            raise UsageError(
                f"the plan checks {len(self.checks):,} inputs (at most {MAX_PLAN_RANGES:,})"
            )
        for url, c in self.checks.items():
            if not (wire.is_url(url) and url) or (problem := c.problem()):
                raise UsageError(
                    f"input {url[:100]!r}: its check is malformed ({problem or 'URL'})"
                )

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    @staticmethod
    def from_bytes(
        data: bytes, digest: str, partitions: int = wire.MAX_PARTITIONS, *, tasks: bool = True
    ) -> Plan:
        """The plan in ``data``, if its digest is ``digest`` and it is within every limit
        (a job of ``partitions`` has fewer cut points); otherwise WireError (and only
        WireError), with a short text. ``tasks=False``: its map tasks are skipped, not
        built (the plan has none then): what a cleanup needs is the parts it replaced."""
        if Plan.digest(data) != digest:
            raise WireError("the job's plan does not match the digest its record names")
        try:
            return _parse(wire.decompress(data, _plan_limit(len(data))), partitions, tasks)
        except WireError as exc:
            raise WireError(wire.bounded(f"the job's plan is refused: {exc}")) from None
        except Exception as exc:  # msgpack's zoo, MemoryError: all mean "not a plan of ours"
            raise WireError(
                wire.bounded(f"the job's plan is malformed: {type(exc).__name__}: {exc}")
            ) from None


def _is_name(value: object) -> bool:
    """What map sees as a record's source, or a part's name: any text of bounded length
    (a local file may be named with a tab), but no NUL, which no path or key holds."""
    return isinstance(value, str) and len(value) <= wire.MAX_URL_LEN and "\0" not in value


def _plan_limit(blob_bytes: int) -> int:
    return wire.decoded_limit(blob_bytes, MAX_PLAN_DECODED, MAX_PLAN_RATIO)


def _check_task(ranges: tuple[Range, ...]) -> None:
    if not 1 <= len(ranges) <= MAX_RANGES_PER_TASK:
        raise UsageError(f"a map task has {len(ranges)} ranges (1 to {MAX_RANGES_PER_TASK})")
    total = 0
    for r in ranges:
        if not (wire.is_url(r.url) and r.url and _is_name(r.name)):
            raise UsageError(
                f"input {r.url[:100]!r}: its URL is too long or holds control characters, "
                "or its name is too long"
            )
        if not 0 <= r.start <= r.end < MAX_OFFSET:
            raise UsageError(f"input {r.url[:100]!r}: range [{r.start}, {r.end}) out of bounds")
        total += r.end - r.start
    if total > MAX_TASK_BYTES:
        raise UsageError(f"a map task reads {total:,} bytes (at most {MAX_TASK_BYTES:,})")


def _reader(raw: bytes) -> msgpack.Unpacker:
    # Read in small pieces from a view of the plan: no copy of the whole is made. Bytes
    # values are the cut points' packed keys only.
    return wire.unpacker(len(raw), max_bin=MAX_CUT_BYTES, source=io.BytesIO(raw))


def _precount(raw: bytes) -> None:
    """Refuse a plan with too many tasks or ranges before building any: its headers are
    walked and each range skipped (~0.2 us, against ~3 us to check and build one)."""
    up = _reader(raw)
    for _ in range(min(up.read_map_header(), _PLAN_FIELDS)):
        if up.unpack() != "tasks":
            up.skip()
            continue
        for _, n in _task_sizes(up):
            for _ in range(n):
                up.skip()
        return


def _parse(raw: bytes, partitions: int = wire.MAX_PARTITIONS, want_tasks: bool = True) -> Plan:
    # Every array is walked header first, and msgpack builds no array or map by itself
    # (max_len=0): a count is refused before anything is built for it, and no nesting is.
    _precount(raw)
    up = _reader(raw)
    fields = up.read_map_header()
    if fields > _PLAN_FIELDS:
        raise WireError(f"it claims {fields} fields (limit {_PLAN_FIELDS})")
    tasks: list[tuple[Range, ...]] | None = None
    replaced: list[str] | None = None
    cuts: tuple[Any, ...] | None = None
    checks: dict[str, Check] | None = None
    for _ in range(fields):
        key = up.unpack()
        if key == "tasks" and tasks is None:
            if want_tasks:
                tasks = _tasks(up)
            else:
                up.skip()  # bounded by _precount above
                tasks = []
        elif key == "replaced" and replaced is None:
            replaced = _replaced(up)
        elif key == "cuts" and cuts is None:
            cuts = _cuts(up, partitions)
        elif key == "checks" and checks is None:
            checks = _checks(up)
        else:
            up.skip()  # a field a later version may add: skipping builds nothing
    if up.tell() != len(raw):
        raise WireError("extra bytes after its msgpack map")
    if tasks is None or replaced is None:
        raise WireError("'tasks' or 'replaced' is missing")
    return Plan(tuple(tasks), tuple(replaced), cuts, checks or {})


def _count(up: msgpack.Unpacker, what: str, low: int, high: int) -> int:
    n: int = up.read_array_header()
    if not low <= n <= high:
        raise WireError(f"it has {n} {what} (from {low} to {high})")
    return n


def _task_sizes(up: msgpack.Unpacker) -> Iterator[tuple[int, int]]:
    """(task, its range count) for each map task, the counts bounded as they are read; the
    caller reads (or skips) that many ranges before asking for the next."""
    ranges = 0
    for i in range(_count(up, "map tasks", 0, wire.MAX_TASKS)):
        n = _count(up, f"ranges in map task {i}", 1, MAX_RANGES_PER_TASK)
        ranges += n
        if ranges > MAX_PLAN_RANGES:
            raise WireError(f"it has more than {MAX_PLAN_RANGES} ranges")
        yield i, n


def _tasks(up: msgpack.Unpacker) -> list[tuple[Range, ...]]:
    tasks: list[tuple[Range, ...]] = []
    # One str per distinct URL or name, checked once: a big file has many ranges.
    urls: dict[str, str] = {}
    names: dict[str, str] = {}
    header, unpack = up.read_array_header, up.unpack  # the loop runs once per range
    for i, n in _task_sizes(up):
        task = []
        total = 0
        for _ in range(n):
            if header() != 4:
                raise WireError(f"map task {i} has a range that is not [url, start, end, name]")
            url, start, end, name = unpack(), unpack(), unpack(), unpack()
            if type(url) is not str or type(name) is not str:
                raise WireError(f"map task {i} has a URL or name that is not a string")
            if not (type(start) is int and type(end) is int and 0 <= start <= end < MAX_OFFSET):
                raise WireError(f"map task {i} has a range outside 0 <= start <= end < 2^62")
            total += end - start
            u, m = urls.get(url), names.get(name)
            if u is None:
                if not (wire.is_url(url) and url):
                    raise WireError(f"map task {i} has an empty URL or one with controls")
                u = urls[url] = url
            if m is None:
                if not _is_name(name):
                    raise WireError(f"map task {i} has a name holding NUL")
                m = names[name] = name
            task.append(Range(u, start, end, m))
        if total > MAX_TASK_BYTES:
            raise WireError(f"map task {i} reads {total} bytes (limit {MAX_TASK_BYTES})")
        tasks.append(tuple(task))
    return tasks


def _checks(up: msgpack.Unpacker) -> dict[str, Check]:
    checks: dict[str, Check] = {}
    header, unpack = up.read_array_header, up.unpack
    for i in range(_count(up, "input checks", 0, MAX_PLAN_RANGES)):
        if header() != 2:
            raise WireError(f"input check {i} is not [url, check]")
        url = unpack()
        if header() != _CHECK_FIELDS:
            raise WireError(f"input check {i} is not [size, digest, device, inode]")
        size, digest, device, inode = unpack(), unpack(), unpack(), unpack()
        if not (type(url) is str and url and wire.is_url(url)) or url in checks:
            raise WireError(f"input check {i} has an empty, repeated or malformed URL")
        if not (type(size) is int and type(digest) is str and type(device) is int
                and type(inode) is int):  # fmt: skip
            raise WireError(f"input check {i} has a field of the wrong type")
        c = Check(size, digest, device, inode)
        if problem := c.problem():
            raise WireError(f"input check {i}: {problem}")
        checks[url] = c
    return checks


def _replaced(up: msgpack.Unpacker) -> list[str]:
    names = [up.unpack() for _ in range(_count(up, "replaced parts", 0, MAX_REPLACED))]
    if not all(_is_name(n) for n in names):
        raise WireError("a replaced part's name is not a bounded string")
    return names


def cuts_problem(cuts: tuple[Any, ...]) -> str:
    """What is wrong with a plan's cut points ("" if nothing): each a key (no dict, no
    list) of at most MAX_CUT_BYTES packed, fewer than MAX_PARTITIONS, strictly increasing."""
    if len(cuts) >= wire.MAX_PARTITIONS:
        return f"there are {len(cuts)} cut points (at most {wire.MAX_PARTITIONS - 1})"
    before = None
    for i, c in enumerate(cuts):
        if not is_key(c):
            return f"cut point {i} is not a key (str, bytes, number, bool, None or a tuple)"
        if len(wire.pack(c)) > MAX_CUT_BYTES:
            return f"cut point {i} takes more than {MAX_CUT_BYTES} bytes"
        now = sort_key(c)
        if before is not None and not before < now:
            return f"cut point {i} does not sort after cut point {i - 1}"
        before = now
    return ""


def _cuts(up: msgpack.Unpacker, partitions: int) -> tuple[Any, ...]:
    # Fewer than the job's partitions: the range partitioner's answer is then a partition.
    packed = [up.unpack() for _ in range(_count(up, "cut points", 0, partitions - 1))]
    cuts = []
    for i, p in enumerate(packed):
        if type(p) is not bytes:
            raise WireError(f"cut point {i} is not a packed key")
        cuts.append(_key(p))
    if problem := cuts_problem(tuple(cuts)):
        raise WireError(problem)
    return tuple(cuts)


def _key(packed: bytes) -> Any:
    bound = len(packed)
    up = wire.unpacker(bound, max_len=bound, max_str=bound, max_bin=bound)
    up.feed(packed)
    key = up.unpack()  # a packed cut point is at most MAX_CUT_BYTES: so is all it builds
    if up.tell() != bound:
        raise WireError("a cut point has extra bytes after its key")
    return key


async def load_plan(
    blobs: Blobs,
    job_scratch: str,
    digest: str,
    partitions: int = wire.MAX_PARTITIONS,
    *,
    tasks: bool = True,
) -> Plan:
    """The job's plan from its scratch (``tasks=False``: without its map tasks)."""
    data = await blobs.get(plan_url(job_scratch))
    read = functools.partial(Plan.from_bytes, data, digest, partitions, tasks=tasks)
    if len(data) <= _ASYNC_PLAN_BYTES:
        return read()
    return await asyncio.to_thread(read)  # off the loop
