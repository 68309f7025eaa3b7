"""What travels on queues: map tasks, reduce tasks and shuffle batches, as msgpack data.

A body is ``MAGIC`` followed by either a zstd frame of one msgpack map (the default) or
that msgpack map itself (``compress=False``, as the 2009 implementation sent plain
messages); the byte after ``MAGIC`` tells them apart (zstd's frame magic or a msgpack map
header), so a reader accepts both and bodies written before the plain form existed decode
as they always did. Nothing here unpickles or evaluates: msgpack yields plain data.

Anyone who can send to a job's queue can send anything, so the decoder is total and
bounded: every body gives a message or one :class:`WireError` with a short text, and
what a body may cost is fixed before it is spent:

- a zstd frame must declare its decoded size, which may be at most ``MAX_RATIO`` times
  the body (or ``DECODED_FLOOR``, whichever is larger) and at most what its largest kind
  may hold: a bomb is refused from its header, before anything is allocated;
- a body is one flat msgpack map of at most ``MAX_FIELDS`` scalar fields: no field holds
  an array or a map, so nesting (and the objects it would allocate) is refused at its
  first header, whatever its depth;
- every string, bytes value and integer has a bound, and each kind its own decoded size
  (a task message is a few dozen bytes; a batch carries up to ``MAX_BATCH_PAIRS``).

``MAX_TASKS`` and ``MAX_PARTITIONS`` bound the job too: the plan (``cmr.plan``) and the job
record are checked against the same numbers the messages are.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack
import zstandard

from cmr import digest as digests
from cmr.errors import WireError

MAGIC = b"CMR1"
ZSTD_FRAME = b"\x28\xb5\x2f\xfd"  # every zstd frame starts with these bytes
# msgpack's map headers: fixmap (0x80-0x8f), map16 (0xde), map32 (0xdf).
_MAP_HEADERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
# zstd level 1: as small as its default (3) on shuffled word-count pairs (ratio 1.49 against
# 1.50) and TeraGen rows (3.51 against 3.63), 1.3-1.5x faster to compress (2 GB of
# TeraSort shuffle: ~2 CPU-s less); negative levels lose a fifth of the ratio on words.
_LEVEL = 1
# Fixed-width records (cmr.cpu.fixedsort's rows, a sort's whole input): level -1 keeps
# TeraGen rows' ratio (3.48 against 3.52, in 1 MiB batches) and compresses them 1.9x as
# fast (316 MB/s against 164 here), decompressing 1.25x as fast: ~4 CPU s of every GB a
# TeraSort shuffles.
_LEVEL_ROWS = -1

MIB = 1024 * 1024
# Anything decoded from a queue or a blob is at most this large (cmr.cpu also bounds its
# spool readers' buffers with it).
MAX_DECODED = 64 * MIB
# Shuffle pairs compress ~4x; 256x is far past that, while a bomb's ratio is in the
# thousands (522 bytes -> 16 MB of empty maps). Below the floor the ratio is not asked:
# any body may decode to 1 MiB, which costs ~2 MiB for an instant, and covers what a
# mapper packs before it has seen its data's ratio (3 x 256 KiB). Plans have their own
# ratio (cmr.plan): a big file's URL repeats over its ranges.
MAX_RATIO = 256
DECODED_FLOOR = 1 * MIB
# A batch's pairs. What the mapper packs (cmr.cpu.shuffle) must decode within
# ``decoded_limit(len(body), MAX_BATCH_PAIRS)``: shuffle data at ~4x, a 256 KiB body
# holds ~1 MiB of pairs; held while decoded, 16 MiB costs ~32 MiB for an instant.
MAX_BATCH_PAIRS = 16 * MIB
MAX_TASK_DECODED = 4 * 1024  # a map or reduce task is ~60 bytes: a pointer, not a payload
MAX_BATCH_DECODED = MAX_BATCH_PAIRS + 64 * 1024  # pairs, plus the fields and a spill URL
MAX_FIELDS = 16  # ours are 3 (tasks) or 9 (batches); a few more leave room to grow
MAX_ID_LEN = 64  # job ids (32 characters today) and attempt ids (12)
MAX_URL_LEN = 4096  # spill URLs, plan URLs and names: PATH_MAX locally, 1 KiB keys on S3
MAX_TASKS = 100_000  # map tasks a job may have (its plan's length, the job record's maps)
MAX_PARTITIONS = 10_000  # reduce partitions a job may have: one queue each
MAX_SEQ = 2**31 - 1  # batches of one attempt for one partition; records in one batch
MAX_ERROR_CHARS = 200  # a rejection's text: it is logged once per hostile message
_MIN_PAIR_BYTES = 3  # a packed [key, value]: fixarray header, then at least a byte each
_HEX = "0123456789abcdef"  # attempt ids are lowercase hex: they name local spool files
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Bodies whose decoding might take more than a moment go to a thread (decode_async).
ASYNC_DECODE_BYTES = 64 * 1024

# zstd contexts are not thread-safe and bodies are decoded in threads: one set per thread.
_contexts = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    made: dict[int, zstandard.ZstdCompressor] | None = getattr(_contexts, "compressors", None)
    if made is None:
        made = _contexts.compressors = {}
    if level not in made:
        made[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return made[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    made: zstandard.ZstdDecompressor | None = getattr(_contexts, "decompressor", None)
    if made is None:
        made = _contexts.decompressor = zstandard.ZstdDecompressor()
    return made


@dataclass(frozen=True, slots=True)  # slots: a plan may hold many thousands of these
class Range:
    """Bytes [start, end) of an input blob; the split owns records that *start* inside it."""

    url: str
    start: int
    end: int
    name: str  # what map sees as the record's source (a relative path or S3 key)


@dataclass(frozen=True)
class MapTask:
    """A pointer into the job's plan (cmr.plan), which says what the task reads."""

    job: str
    task: int


@dataclass(frozen=True)
class ReduceTask:
    job: str
    partition: int


@dataclass(frozen=True)
class Batch:
    """Part of one map attempt's output for one partition; (task, attempt, seq) is its tag."""

    job: str
    task: int
    attempt: str
    partition: int
    seq: int
    records: int
    pairs: bytes  # a concatenated msgpack stream of [key, value] arrays
    spilled: str = ""  # when set, ``pairs`` is empty and the stream lives in this blob
    # The spilled stream's digest (cmr.digest, hex): the blob lies in the bucket, where a
    # writer who cannot send to the queue could otherwise replace what the reducer reads.
    digest: str = ""

    @property
    def tag(self) -> tuple[int, str, int]:
        return (self.task, self.attempt, self.seq)


Message = MapTask | ReduceTask | Batch


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    """Our own data (written by this process or its pool); a stranger's goes through
    ``decode``, ``unpack_bounded`` or ``cmr.plan``."""
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises a zoo of types on garbage; all mean "invalid"
        raise WireError(bounded(f"not msgpack data: {exc}")) from None


def unpacker(
    size: int,
    *,
    max_len: int = 0,
    max_str: int = MAX_URL_LEN,
    max_bin: int = 0,
    source: BinaryIO | None = None,
) -> msgpack.Unpacker:
    """A reader for ``size`` bytes of a stranger's msgpack (fed, or read from ``source``
    in small pieces) whose every array and map holds at most ``max_len`` items, strings
    ``max_str`` bytes, bytes values ``max_bin``; ext types are refused, and msgpack refuses
    nesting past its stack (1,024 deep) by itself."""
    if source is not None:  # a buffer of a few values, not of the whole input
        size = min(size, 4 * max(max_str, max_bin, 16 * 1024))
    return msgpack.Unpacker(
        source,
        raw=False,
        use_list=False,
        strict_map_key=False,
        max_buffer_size=max(1, size),
        read_size=min(max(1, size), 16 * 1024),
        max_str_len=max_str,
        max_bin_len=max_bin,
        max_array_len=max_len,
        max_map_len=max_len,
        max_ext_len=0,
    )


def unpack_bounded(data: bytes, *, max_len: int, max_str: int = MAX_URL_LEN) -> Any:
    """One msgpack value of a stranger's, within ``unpacker``'s bounds, and nothing after it."""
    up = unpacker(len(data), max_len=max_len, max_str=max_str)
    try:
        up.feed(data)
        value = up.unpack()
    except Exception as exc:
        raise WireError(
            bounded(f"not msgpack data within bounds: {type(exc).__name__}: {exc}")
        ) from None
    if up.tell() != len(data):
        raise WireError("extra bytes after the msgpack value")
    return value


def compress(data: bytes) -> bytes:
    return _compressor(_LEVEL).compress(data)


def decoded_limit(wire_bytes: int, cap: int = MAX_DECODED, ratio: int = MAX_RATIO) -> int:
    """The most a body or blob of ``wire_bytes`` may decode to: ``ratio`` times its size,
    at least ``DECODED_FLOOR``, at most ``cap`` (and ``MAX_DECODED``)."""
    return min(cap, MAX_DECODED, max(DECODED_FLOOR, ratio * wire_bytes))


def declared_size(data: bytes | memoryview) -> int:
    """The decoded size a zstd frame's header declares; WireError when it declares none."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise WireError("not a zstd frame (its header cannot be read)") from None
    if size < 0:
        raise WireError("the zstd frame does not declare its decoded size")
    return int(size)


def decompress(data: bytes | memoryview, limit: int | None = None) -> bytes:
    """A zstd frame's content, refused from its header when it declares more than ``limit``
    (by default ``decoded_limit(len(data))``): nothing is allocated for a bomb."""
    if limit is None:
        limit = decoded_limit(len(data))
    size = declared_size(data)
    if size > limit:
        raise WireError(
            f"a zstd frame of {len(data)} bytes declares {size} bytes decoded (limit {limit})"
        )
    try:
        return _decompressor().decompress(data, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise WireError(bounded(f"corrupt zstd frame: {exc}")) from None


def encode(msg: Message, *, compress: bool = True, rows: bool = False) -> bytes:
    """The queue body of a message: zstd-compressed msgpack, or plain msgpack. ``rows``:
    a batch of fixed-width records, compressed at their own level (``_LEVEL_ROWS``)."""
    match msg:
        case MapTask(job, task):
            doc: dict[str, Any] = {"k": "map", "job": job, "task": task}
        case ReduceTask(job, partition):
            doc = {"k": "reduce", "job": job, "p": partition}
        case Batch():
            doc = {
                "k": "batch",
                "job": msg.job,
                "task": msg.task,
                "att": msg.attempt,
                "p": msg.partition,
                "seq": msg.seq,
                "n": msg.records,
                "pairs": msg.pairs,
                "spill": msg.spilled,
            }
            if msg.spilled:
                doc["sum"] = msg.digest
    packed = pack(doc)
    if not compress:
        return MAGIC + packed
    return MAGIC + _compressor(_LEVEL_ROWS if rows else _LEVEL).compress(packed)


def bounded(text: str) -> str:
    """An error text fit for a log line: at most ``MAX_ERROR_CHARS``, one line."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _brief(value: Any) -> str:
    """A stranger's value in an error text: bounded, and never a repr of its nesting (the
    repr of a tuple nested 1,000 deep raises RecursionError)."""
    if isinstance(value, str):
        return repr(value[:32]) + ("..." if len(value) > 32 else "")
    if isinstance(value, int | float | bool) or value is None:
        return repr(value)[:32]
    return f"a {type(value).__name__}"


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise WireError(f"field {name!r} missing or not {getattr(kind, '__name__', kind)}")
    return value


def _nat(doc: dict[str, Any], name: str, below: int) -> int:
    value: int = _field(doc, name, int)
    if not 0 <= value < below:
        raise WireError(f"field {name!r} is {_brief(value)}, outside [0, {below})")
    return value


def is_job_id(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 1 <= len(value) <= MAX_ID_LEN
        and value.isascii()
        and value.replace("-", "").isalnum()
    )


def is_attempt_id(value: Any) -> bool:
    """Lowercase hex, 1 to 64 characters: it names local spool files, so no ``/`` or NUL."""
    return isinstance(value, str) and 1 <= len(value) <= MAX_ID_LEN and not value.strip(_HEX)


def is_url(value: Any) -> bool:
    """A URL or name of bounded length without control characters (it reaches logs and
    file names)."""
    return isinstance(value, str) and len(value) <= MAX_URL_LEN and not _CONTROL.search(value)


def _job_id(doc: dict[str, Any]) -> str:
    job = doc.get("job")
    if not is_job_id(job):
        raise WireError("field 'job' is not a job id")
    return str(job)


def _fields(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """A body's one flat msgpack map of scalars, and its size. Arrays and maps are refused
    at their first header (``max_len=0``; empty ones cost nothing), so no depth or count
    is ever built. ``data`` is the caller's last reference: it is let go once fed, so a
    large batch is held twice at most (the unpacker's copy, then its pairs)."""
    size = len(data)
    up = unpacker(size, max_bin=MAX_BATCH_PAIRS)
    up.feed(data)
    del data
    try:
        n = up.read_map_header()
    except msgpack.OutOfData:
        raise WireError("the body ends inside its msgpack map header") from None
    except ValueError:
        raise WireError("the body is not a msgpack map") from None
    if n > MAX_FIELDS:
        raise WireError(f"the body claims {n} fields (limit {MAX_FIELDS})")
    doc: dict[str, Any] = {}
    try:
        for _ in range(n):
            key = up.unpack()
            value = up.unpack()
            if not isinstance(key, str):
                raise WireError(f"a field name is {_brief(key)}, not a string")
            if key in doc:
                raise WireError(f"field {_brief(key)} appears twice")
            doc[key] = value
    except WireError:
        raise
    except msgpack.OutOfData:
        raise WireError("the body ends inside its msgpack map (truncated)") from None
    except Exception as exc:  # limits and format errors: msgpack's texts are short
        raise WireError(bounded(f"a field is not a bounded scalar: {exc}")) from None
    if up.tell() != size:
        raise WireError("extra bytes after the body's msgpack map")
    return doc, size


def decode(body: bytes) -> Message:
    """Parse and validate a queue body. Raises WireError for anything that is not ours, and
    only WireError, with a text of at most ``MAX_ERROR_CHARS``: the decoder's own failure
    on hostile bytes is a rejection too."""
    try:
        return _decode(body)
    except WireError as exc:
        text = str(exc)
        if len(text) > MAX_ERROR_CHARS:
            raise WireError(bounded(text)) from None
        raise
    except Exception as exc:  # MemoryError, ...: whatever the bytes provoke is a rejection
        raise WireError(f"undecodable body ({type(exc).__name__})") from None


def decode_cost(body: bytes) -> int:
    """Roughly how many bytes decoding ``body`` touches: its declared size when compressed."""
    rest = body[len(MAGIC) : len(MAGIC) + 32]
    if body.startswith(MAGIC) and rest.startswith(ZSTD_FRAME):
        try:
            return max(len(body), declared_size(body[len(MAGIC) :]))
        except WireError:
            return len(body)
    return len(body)


async def decode_async(body: bytes) -> Message:
    """``decode`` for the event loop: a body that decodes to more than
    ``ASYNC_DECODE_BYTES`` is decoded in a thread, so a large batch (or a bomb's refusal)
    never stalls leases and heartbeats."""
    if decode_cost(body) <= ASYNC_DECODE_BYTES:
        return decode(body)
    return await asyncio.to_thread(decode, body)


def _decode(body: bytes) -> Message:
    if not body.startswith(MAGIC):
        raise WireError("body does not start with the cmr magic bytes")
    cap = min(MAX_DECODED, MAX_BATCH_DECODED)  # the largest kind
    rest = memoryview(body)[len(MAGIC) :]  # a view: the body is not copied
    if body.startswith(ZSTD_FRAME, len(MAGIC)):
        doc, size = _fields(decompress(rest, decoded_limit(len(body), cap)))
    elif len(rest) and rest[0] in _MAP_HEADERS:
        if len(rest) > cap:
            raise WireError(f"plain body of {len(rest)} bytes (limit {cap})")
        doc, size = _fields(rest)
    else:
        raise WireError("body is neither a zstd frame nor a msgpack map")
    kind = doc.get("k")
    if kind in ("map", "reduce") and size > MAX_TASK_DECODED:
        raise WireError(f"a {kind} task of {size} bytes (limit {MAX_TASK_DECODED})")
    if kind == "map":
        return MapTask(_job_id(doc), _nat(doc, "task", MAX_TASKS))
    if kind == "reduce":
        return ReduceTask(_job_id(doc), _nat(doc, "p", MAX_PARTITIONS))
    if kind == "batch":
        return _batch(doc)
    raise WireError(f"unknown message kind {_brief(kind)}")


def _batch(doc: dict[str, Any]) -> Batch:
    job = _job_id(doc)
    if not is_attempt_id(doc.get("att")):
        raise WireError("field 'att' is not an attempt id (1 to 64 lowercase hex digits)")
    pairs: bytes = _field(doc, "pairs", bytes)
    spill: str = _field(doc, "spill", str)
    records = _nat(doc, "n", MAX_SEQ + 1)
    digest = ""
    if spill:
        if pairs:
            raise WireError("a spilled batch carries pairs of its own")
        if not is_url(spill):
            raise WireError("field 'spill' is not a URL")
        digest = _field(doc, "sum", str)
        if not digests.is_hex(digest):
            raise WireError("field 'sum' of a spilled batch is not a digest (64 hex digits)")
    elif records > len(pairs) // _MIN_PAIR_BYTES:
        raise WireError(f"field 'n' counts {records} records in {len(pairs)} bytes of pairs")
    return Batch(
        job,
        _nat(doc, "task", MAX_TASKS),
        doc["att"],
        _nat(doc, "p", MAX_PARTITIONS),
        _nat(doc, "seq", MAX_SEQ + 1),
        records,
        pairs,
        spill,
        digest,
    )


def iter_pairs(stream: bytes) -> Any:
    """Yield (key, value) from a batch's pair stream; WireError on anything malformed."""
    unpacker = msgpack.Unpacker(
        raw=False,
        use_list=False,
        strict_map_key=False,
        max_buffer_size=MAX_DECODED,
    )
    try:
        unpacker.feed(stream)  # BufferFull past MAX_DECODED: a rejection like any other
        for item in unpacker:
            if not isinstance(item, tuple) or len(item) != 2:
                raise WireError("a batch record is not a [key, value] pair")
            yield item
    except WireError:
        raise
    except Exception as exc:
        raise WireError(bounded(f"corrupt pair stream: {exc}")) from None
