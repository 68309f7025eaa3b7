"""What travels on queues: map tasks, reduce tasks and shuffle batches, as msgpack data.

A body is ``MAGIC`` followed by either a zstd frame of one msgpack map (the default) or
that msgpack map itself (``compress=False``, as the 2009 implementation sent plain
messages); the byte after ``MAGIC`` tells them apart (zstd's frame magic or a msgpack map
header), so a reader accepts both and bodies written before the plain form existed decode
as they always did. Decoding never evaluates anything: msgpack yields plain data, every
field is type-checked, sizes are bounded (a zstd frame must declare its size, and a body
compressed or not must stay under ``MAX_DECODED``), and anything else is a
:class:`WireError` that the caller logs and counts. Nothing here unpickles.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard

from cmr.errors import WireError

MAGIC = b"CMR1"
ZSTD_FRAME = b"\x28\xb5\x2f\xfd"  # every zstd frame starts with these bytes
# msgpack's map headers: fixmap (0x80-0x8f), map16 (0xde), map32 (0xdf).
_MAP_HEADERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
MAX_DECODED = 64 * 1024 * 1024  # a decoded body larger than this is refused, not allocated
_HEX = "0123456789abcdef"  # attempt ids are lowercase hex: they name local spool files
_LEVEL = 3  # zstd's default: fast, and ~4x on shuffled text pairs

# zstd contexts are not thread-safe and bodies are decoded in threads: one set per thread.
_contexts = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    pair = getattr(_contexts, "pair", None)
    if pair is None:
        pair = (
            zstandard.ZstdCompressor(level=_LEVEL, write_content_size=True),
            zstandard.ZstdDecompressor(),
        )
        _contexts.pair = pair
    return pair


@dataclass(frozen=True)
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

    @property
    def tag(self) -> tuple[int, str, int]:
        return (self.task, self.attempt, self.seq)


Message = MapTask | ReduceTask | Batch


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises a zoo of types on garbage; all mean "invalid"
        raise WireError(f"not msgpack data: {exc}") from None


def compress(data: bytes) -> bytes:
    return _zstd()[0].compress(data)


def decompress(data: bytes) -> bytes:
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise WireError(f"not a zstd frame: {exc}") from None
    if size < 0 or size > MAX_DECODED:
        raise WireError(f"compressed body declares {size} bytes (limit {MAX_DECODED})")
    try:
        return _zstd()[1].decompress(data, max_output_size=MAX_DECODED)
    except zstandard.ZstdError as exc:
        raise WireError(f"corrupt zstd frame: {exc}") from None


def encode(msg: Message, *, compress: bool = True) -> bytes:
    """The queue body of a message: zstd-compressed msgpack, or plain msgpack."""
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
    packed = pack(doc)
    return MAGIC + (_zstd()[0].compress(packed) if compress else packed)


def _field(doc: dict[Any, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise WireError(f"field {name!r} missing or not {getattr(kind, '__name__', kind)}")
    return value


def _nat(doc: dict[Any, Any], name: str) -> int:
    value: int = _field(doc, name, int)
    if value < 0:
        raise WireError(f"field {name!r} is negative")
    return value


def _job_id(doc: dict[Any, Any]) -> str:
    job: str = _field(doc, "job", str)
    if not 1 <= len(job) <= 64 or not job.replace("-", "").isalnum():
        raise WireError("field 'job' is not a job id")
    return job


def _brief(value: Any) -> str:
    """A stranger's value in an error text: bounded, and never a repr of its nesting (the
    repr of a tuple nested 1,000 deep raises RecursionError)."""
    if isinstance(value, str):
        return repr(value[:32]) + ("..." if len(value) > 32 else "")
    if isinstance(value, int | float | bool) or value is None:
        return repr(value)[:32]
    return f"a {type(value).__name__}"


def decode(body: bytes) -> Message:
    """Parse and validate a queue body. Raises WireError for anything that is not ours, and
    only WireError: the decoder's own failure on hostile bytes is a rejection too."""
    try:
        return _decode(body)
    except WireError:
        raise
    except Exception as exc:  # RecursionError, MemoryError, ...: whatever the bytes provoke
        raise WireError(f"undecodable body ({type(exc).__name__})") from None


def _decode(body: bytes) -> Message:
    if not body.startswith(MAGIC):
        raise WireError("body does not start with the cmr magic bytes")
    rest = body[len(MAGIC) :]
    if rest.startswith(ZSTD_FRAME):
        doc = unpack(decompress(rest))
    elif rest and rest[0] in _MAP_HEADERS:
        if len(rest) > MAX_DECODED:
            raise WireError(f"plain body of {len(rest)} bytes (limit {MAX_DECODED})")
        doc = unpack(rest)  # one whole map: trailing bytes are refused as extra data
    else:
        raise WireError("body is neither a zstd frame nor a msgpack map")
    if not isinstance(doc, dict):
        raise WireError("body is not a msgpack map")
    kind = doc.get("k")
    if kind == "map":
        return MapTask(_job_id(doc), _nat(doc, "task"))
    if kind == "reduce":
        return ReduceTask(_job_id(doc), _nat(doc, "p"))
    if kind == "batch":
        attempt: str = _field(doc, "att", str)
        if not 1 <= len(attempt) <= 64 or attempt.strip(_HEX):
            raise WireError("field 'att' is not an attempt id")
        return Batch(
            _job_id(doc),
            _nat(doc, "task"),
            attempt,
            _nat(doc, "p"),
            _nat(doc, "seq"),
            _nat(doc, "n"),
            _field(doc, "pairs", bytes),
            _field(doc, "spill", str),
        )
    raise WireError(f"unknown message kind {_brief(kind)}")


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
        raise WireError(f"corrupt pair stream: {exc}") from None
