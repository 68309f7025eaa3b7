"""Input and output formats: how a map task's bytes become records, and how a reduce task's
pairs become bytes. Small and pluggable: a reader or writer is a function in a registry
keyed by the format's name.

A format is named by a string, parsed and checked once (``parse_input``, ``check_output``);
the job record carries the string, so a worker re-parses what the table says and refuses
nonsense like any other field of a stranger's.

Input (``Job.input_format``, ``cmr run --input-format``):

- ``lines``: today's; map(source, line). Line-split: a split owns the lines that start in
  it (:mod:`cmr.split`). Its hot path is :func:`cmr.cpu.mapping.run_map`'s ``map_chunk`` loop.
- ``jsonlines``: line-split like ``lines``; map(source, json.loads(line)); blank lines are
  skipped; a line that is not JSON fails the task naming the file and the line.
- ``csv``: the first row is the header; map(source, {column: str}). Whole-file tasks: a
  quoted field may hold a newline, so no byte offset is known to start a record.
- ``fixed:<record_len>:<key_len>``: binary records (TeraGen's are ``fixed:100:10``);
  map(record[:key_len], record[key_len:]). Splits fall on record multiples.
- ``whole``: each file is one record; map(source, its bytes).
- ``pairs``: a msgpack stream of [key, value] (what output format ``pairs`` writes);
  map(key, value), lists arriving as tuples; read within :mod:`cmr.wire`'s bounds.

Compression is orthogonal and recognised by a file's first bytes (``sniff``): gzip, bz2 and
zstd files are one whole-file task each, decompressed as a stream in the pool process
(never whole in memory: a record is at most ``max_record`` bytes, which bounds a bomb), then
read with the format. The magic decides, not the name: a ``.gz`` file whose bytes are not
gzip is read as it is (with a warning at submit), and a gzip file named ``x.log`` is
decompressed.

Output (``Job.output_format``, ``cmr run --output-format``): ``text`` (today: one
``format(key, value)`` line per pair; format may return bytes, written as is), ``raw``
(key and value bytes concatenated, each bytes or None), ``jsonlines`` ([key, value] as JSON
per line), ``pairs`` (msgpack (key, value) stream, readable by input format ``pairs``).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import itertools
import json
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack
import zstandard

from cmr import usercode, wire
from cmr.errors import CmrError

INPUT_FORMATS = ("lines", "jsonlines", "csv", "fixed:<record_len>:<key_len>", "whole", "pairs")
OUTPUT_FORMATS = ("text", "raw", "jsonlines", "pairs")
MAX_FORMAT_LEN = 40  # the longest valid name is "fixed:16777216:16777216"
MAX_RECORD_LEN = 16 * 1024 * 1024  # a fixed record: far past TeraGen's 100 bytes
SNIFF_BYTES = 512  # read from each input at submit (and the start of a whole-file range)
COMPRESSED_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}
BLOCK = 1024 * 1024  # decompressed bytes read at a time
MAX_PAIR_ITEMS = 1 << 20  # items of one array or map in a pairs input
# What a decoded JSON element or CSV field may cost in Python objects beyond its bytes (an
# empty list is 56 bytes and its slot 8; a short str 50 and 8): "[]," decodes to ~24 times
# its bytes, so a record is bounded by its bytes plus this much per separator or bracket.
OBJECT_COST = 64


class FormatError(ValueError):
    """A format string that names no format; the text lists the valid ones. Callers say
    where it came from (UsageError, JobCodeError, WireError)."""


class InputError(CmrError):
    """Input that cannot be read as its format: the message names the file and the place.
    ``too_big``: the input is not malformed, only a record is past what this reader holds
    (its bytes, or what decoding it would build); a sample's bound is smaller than a map
    task's, so a sampler passes over it."""

    too_big = False


def _too_big(message: str) -> InputError:
    # One class for users to see ("InputError: ..."), told apart by the flag.
    exc = InputError(message)
    exc.too_big = True
    return exc


@dataclass(frozen=True)
class InputFormat:
    name: str
    record_len: int = 0  # fixed only
    key_len: int = 0

    @property
    def line_split(self) -> bool:
        """Split at any byte, each split owning the lines that start in it."""
        return self.name in ("lines", "jsonlines")

    @property
    def splittable(self) -> bool:
        """A plain file may be cut into several tasks (the others are whole-file tasks)."""
        return self.line_split or self.name == "fixed"

    def __str__(self) -> str:
        if self.name == "fixed":
            return f"fixed:{self.record_len}:{self.key_len}"
        return self.name


LINES = InputFormat("lines")


def _valid_inputs() -> str:
    return ", ".join(INPUT_FORMATS) + " (e.g. fixed:100:10)"


def parse_input(text: str) -> InputFormat:
    """The input format ``text`` names; FormatError naming it and the valid ones."""
    if not isinstance(text, str) or len(text) > MAX_FORMAT_LEN:
        raise FormatError(f"input format {str(text)[:60]!r} is not one: use {_valid_inputs()}")
    if text in _READERS and text != "fixed":
        return InputFormat(text)
    name, _, rest = text.partition(":")
    if name == "fixed":
        rl, sep, kl = rest.partition(":")
        if sep and rl.isdigit() and kl.isdigit() and rl.isascii() and kl.isascii():
            record_len, key_len = int(rl), int(kl)
            if 1 <= record_len <= MAX_RECORD_LEN and 0 <= key_len <= record_len:
                return InputFormat("fixed", record_len, key_len)
        raise FormatError(
            f"input format {text!r}: fixed needs fixed:<record_len>:<key_len> with "
            f"1 <= record_len <= {MAX_RECORD_LEN:,} and 0 <= key_len <= record_len "
            "(e.g. fixed:100:10)"
        )
    raise FormatError(f"unknown input format {text[:60]!r}: use one of {_valid_inputs()}")


def check_output(text: str) -> str:
    """``text`` if it names an output format; FormatError otherwise."""
    if not (isinstance(text, str) and text in _WRITERS):
        raise FormatError(
            f"unknown output format {str(text)[:60]!r}: use one of {', '.join(OUTPUT_FORMATS)}"
        )
    return text


# --- compression ---------------------------------------------------------------------


def sniff(head: bytes) -> str:
    """The compression of a file that starts with ``head`` ("" for none): its magic bytes,
    and for gzip a trial decode of the header too (binary records may start 1f 8b)."""
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    # bz2: "BZh", the block size, then a stream's first block or an empty one's end marker.
    if (
        head[:3] == b"BZh"
        and head[3:4] in b"123456789"
        and head[4:10] in (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")
    ):
        return "bz2"
    if head[:3] == b"\x1f\x8b\x08" and len(head) >= 10 and not head[3] & 0xE0:
        try:
            zlib.decompressobj(31).decompress(head, 64)
        except zlib.error:
            return ""
        return "gzip"
    return ""


def named_codec(name: str) -> str:
    """The compression a file's name suggests ("" for none); only for warnings."""
    lower = name.lower()
    return next((c for s, c in COMPRESSED_SUFFIXES.items() if lower.endswith(s)), "")


# What a compressed input may decode to: at most MAX_INPUT_RATIO times its size (at least
# INPUT_DECODED_FLOOR), and at most MAX_INPUT_DECODED in all. Text and pairs compress 3-20x,
# logs up to ~100x and gzip can never pass ~1,030x; a zstd or bz2 bomb of a few hundred
# bytes decodes to GBs (a 668-byte frame to 4.7 GiB), each of which a task would read,
# decode and map. The floor keeps small, very repetitive files (test data) readable.
MAX_INPUT_RATIO = 2048
INPUT_DECODED_FLOOR = 64 * 1024 * 1024
MAX_INPUT_DECODED = 64 * 1024**3  # what one map task may read at all (cmr.plan)


def decoded_limit(compressed: int) -> int:
    """The most a compressed input of ``compressed`` bytes may decode to."""
    return min(MAX_INPUT_DECODED, max(INPUT_DECODED_FLOOR, MAX_INPUT_RATIO * compressed))


_ZSTD_MAGIC = 0xFD2FB528


def _zstd_complete(data: bytes) -> bool:
    """Whether ``data`` is whole zstd frames (or skippable ones), the last ending exactly at
    its end: zstd's streaming reader takes a frame cut short as a shorter input."""
    pos, n = 0, len(data)
    view = memoryview(data)
    while pos < n:
        if n - pos < 8:
            return False
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size follows
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            return False
        try:
            head = zstandard.frame_header_size(view[pos : pos + 18].tobytes())
            checksum = zstandard.get_frame_parameters(view[pos : pos + 18].tobytes()).has_checksum
        except zstandard.ZstdError:
            return False
        pos += head
        while True:
            if n - pos < 3:
                return False
            h = int.from_bytes(view[pos : pos + 3], "little")
            last, kind, size = h & 1, (h >> 1) & 3, h >> 3
            if kind == 3:
                return False  # reserved
            pos += 3 + (1 if kind == 1 else size)
            if last:
                break
        pos += 4 if checksum else 0
    return pos == n


class _Decoded(io.RawIOBase):
    """A decompressing reader whose every failure is an InputError naming the file; it
    stops, with one, past ``decoded_limit`` of the file's compressed size."""

    def __init__(self, name: str, codec: str, data: bytes) -> None:
        super().__init__()
        self.name_, self.codec = name, codec
        self.size, self.limit, self.decoded = len(data), decoded_limit(len(data)), 0
        self.data = data  # zstd: checked whole at its end (_zstd_complete)
        src = io.BytesIO(data)
        self.inner: Any
        if codec == "gzip":
            self.inner = gzip.GzipFile(fileobj=src, mode="rb")
        elif codec == "bz2":
            self.inner = bz2.BZ2File(src)
        else:
            self.inner = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            # One byte past the limit at most: enough to tell that it is passed.
            data = self.inner.read(min(len(b), self.limit + 1 - self.decoded))
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            raise InputError(
                f"input {self.name_}: its {self.codec} data is corrupt or truncated "
                f"({str(exc)[:200]})"
            ) from None
        n = len(data)
        if n == 0 and len(b) and self.codec == "zstd" and not _zstd_complete(self.data):
            raise InputError(
                f"input {self.name_}: its zstd data is truncated (its last frame is cut "
                "short): it was not fully written, or was replaced since the job was submitted"
            )
        self.decoded += n
        if self.decoded > self.limit:
            raise InputError(
                f"input {self.name_}: its {self.size:,} bytes of {self.codec} decode to more "
                f"than {self.limit:,} (at most {MAX_INPUT_RATIO:,} times their size, or "
                f"{INPUT_DECODED_FLOOR // 1024**2} MiB, and {MAX_INPUT_DECODED // 1024**3} GiB "
                "in all): a decompression bomb, or data far more repetitive than real input "
                "(store such data uncompressed)"
            )
        b[:n] = data
        return n


def _stream(name: str, codec: str, data: bytes) -> BinaryIO:
    if not codec:
        return io.BytesIO(data)
    return io.BufferedReader(_Decoded(name, codec, data), BLOCK)


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if 0 < len(data) < n:
        parts = [data]
        got = len(data)
        while got < n and (more := f.read(n - got)):
            parts.append(more)
            got += len(more)
        data = b"".join(parts)
    return data


# --- readers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """What a map task read of one range: its source name, bytes, compression ("" none),
    the byte of the file it starts at, and the largest record it may hold."""

    name: str
    data: bytes
    codec: str = ""
    start: int = 0
    max_record: int = 64 * 1024 * 1024


def line_pieces(c: Chunk, piece: int, universal: bool = False) -> Iterator[bytes]:
    """A compressed line-split chunk as pieces of whole lines of about ``piece`` bytes, each
    without its last newline (what ``map_chunk`` sees), decompressed as a stream; a line
    longer than ``max_record`` is an InputError."""
    f = _stream(c.name, c.codec, c.data)
    buf = b""
    held_cr = False
    while block := f.read(BLOCK):
        if universal:
            if held_cr:
                block = b"\r" + block
            held_cr = block.endswith(b"\r")
            if held_cr:
                block = block[:-1]
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf += block
        if len(buf) >= piece:
            nl = buf.rfind(b"\n")
            if nl >= 0:
                yield buf[:nl]
                buf = buf[nl + 1 :]
            if len(buf) > c.max_record:
                raise _too_big(
                    f"input {c.name}: a line is longer than {c.max_record:,} bytes, the "
                    "longest a worker of this memory holds (raise --memory-mb)"
                )
    if held_cr:
        buf += b"\n"
    if buf:
        yield buf[:-1] if buf.endswith(b"\n") else buf


def _lines_of(c: Chunk, piece: int) -> Iterator[bytes]:
    """Every line of a line-split chunk, plain or compressed, without its newline."""
    if c.codec:
        pieces: Iterator[bytes] = line_pieces(c, piece)
    else:
        data = c.data[:-1] if c.data.endswith(b"\n") else c.data
        pieces = iter((data,)) if c.data else iter(())
    for p in pieces:
        start = 0
        while (nl := p.find(b"\n", start)) >= 0:
            yield p[start:nl]
            start = nl + 1
        yield p[start:]


Record = tuple[Any, Any]
Reader = Callable[[InputFormat, Chunk, int], Iterator[Record]]


def _json_cost(line: bytes) -> int:
    """An upper bound of what decoding a JSON line costs: its bytes plus OBJECT_COST per
    value it may hold (each follows a comma or opens an array or object), counted by C."""
    return len(line) + OBJECT_COST * (line.count(b",") + line.count(b"[") + line.count(b"{"))


def read_jsonlines(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    n = 0
    offset = c.start
    # A line shorter than this cannot decode past max_record: only longer ones are counted.
    counted = c.max_record // (OBJECT_COST + 1)
    for line in _lines_of(c, piece):
        n += 1
        at = offset
        offset += len(line) + 1
        if not line.strip():
            continue  # blank lines (a trailing one, say) hold no record
        where = (
            f"line {n}"
            if c.start == 0 or c.codec
            else f"line {n} of its split from byte {c.start} (byte {at})"
        )
        if len(line) > counted and _json_cost(line) > c.max_record:
            raise _too_big(
                f"input {c.name}: {where} holds too many JSON values to decode within "
                f"{c.max_record:,} bytes, the most a worker of this memory holds (raise "
                "--memory-mb, or split the line)"
            )
        try:
            value = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise InputError(f"input {c.name}: {where} is not JSON ({exc})") from None
        except RecursionError:
            raise InputError(
                f"input {c.name}: {where} nests JSON arrays or objects deeper than Python's "
                f"JSON reader allows (about {sys.getrecursionlimit():,} levels)"
            ) from None
        yield c.name, value


def read_csv(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    text = io.TextIOWrapper(_stream(c.name, c.codec, c.data), encoding="utf-8-sig", newline="")
    csv.field_size_limit(c.max_record)
    row_cost = 0  # of the row being read: its lines' cost so far (reset as each row ends)
    n = 0

    def lines() -> Iterator[str]:
        # The csv module builds a row whole, a str per field: a row (even the header) is
        # refused as it is read once it could cost more than max_record, and no line is
        # read past that either (a line without a newline would be read whole).
        nonlocal row_cost
        while line := text.readline(c.max_record - row_cost + 1):
            row_cost += len(line) + OBJECT_COST * line.count(",")
            if row_cost > c.max_record:
                raise _too_big(
                    f"input {c.name}: row {n + 1} (at line {rows.line_num + 1}) is past "
                    f"{c.max_record:,} bytes of text and fields ({OBJECT_COST} per field), "
                    "the most a worker of this memory holds (raise --memory-mb)"
                )
            yield line

    rows = csv.reader(lines(), strict=True)
    header: list[str] | None = None
    while True:
        row_cost = 0
        try:
            row = next(rows)
        except StopIteration:
            return
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(
                f"input {c.name}: row {n + 1} (line {rows.line_num}) is not CSV of UTF-8 "
                f"text ({exc})"
            ) from None
        if not row:
            continue  # a blank line
        n += 1
        if header is None:
            header = row
            continue
        if len(row) != len(header):
            raise InputError(
                f"input {c.name}: row {n} (line {rows.line_num}) has {len(row)} fields; its "
                f"header has {len(header)}"
            )
        yield c.name, dict(zip(header, row, strict=True))


def read_fixed(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    rl, kl = fmt.record_len, fmt.key_len
    if not c.codec:
        if len(c.data) % rl:
            raise InputError(
                f"input {c.name}: bytes {c.start} to {c.start + len(c.data)} are not whole "
                f"{rl}-byte records (did the file change after the job was submitted?)"
            )
        # Each record split into (key, value) by C: a fixed record needs no Python per byte.
        yield from struct.iter_unpack(f"{kl}s{rl - kl}s", c.data)
        return
    f = _stream(c.name, c.codec, c.data)
    per = max(1, BLOCK // rl) * rl
    read = 0
    while block := _read_exact(f, per):
        if len(block) % rl:
            raise InputError(
                f"input {c.name}: its {len(block) + read:,} decompressed bytes are not whole "
                f"{rl}-byte records"
            )
        read += len(block)
        yield from struct.iter_unpack(f"{kl}s{rl - kl}s", block)


def read_whole(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    if not c.codec:
        yield c.name, c.data
        return
    data = _read_exact(_stream(c.name, c.codec, c.data), c.max_record + 1)
    if len(data) > c.max_record:
        raise InputError(
            f"input {c.name}: decompressed, it is past {c.max_record:,} bytes, the largest "
            "whole-file record a worker of this memory holds (raise --memory-mb)"
        )
    yield c.name, data


def read_pairs(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    limit = min(c.max_record, wire.MAX_DECODED)
    up = wire.unpacker(
        limit,
        max_len=MAX_PAIR_ITEMS,
        max_str=limit,
        max_bin=limit,
        source=_stream(c.name, c.codec, c.data),
    )
    n = ended = 0
    while True:
        try:
            item = up.unpack()
        except msgpack.OutOfData:
            if up.tell() != ended:  # the stream stopped inside an item
                raise InputError(
                    f"input {c.name}: it ends inside item {n + 1} (a truncated pairs stream)"
                ) from None
            return
        except InputError:
            raise
        except Exception as exc:  # msgpack's zoo: malformed, past a limit, ext types
            raise InputError(
                f"input {c.name}: item {n + 1} is not msgpack within the bounds of pairs "
                f"input ({type(exc).__name__}: {exc})"
            ) from None
        n += 1
        ended = up.tell()
        if type(item) is not tuple or len(item) != 2:
            raise InputError(
                f"input {c.name}: item {n} is {usercode.quote(item)}, not a [key, value] pair"
            )
        yield item


_READERS: dict[str, Reader | None] = {
    "lines": None,  # cmr.cpu.mapping's map_chunk loop: the hot path
    "jsonlines": read_jsonlines,
    "csv": read_csv,
    "fixed": read_fixed,
    "whole": read_whole,
    "pairs": read_pairs,
}


def records(fmt: InputFormat, c: Chunk, piece: int) -> Iterator[Record]:
    """The (key, value) records of a chunk read as ``fmt`` (not ``lines``)."""
    reader = _READERS[fmt.name]
    assert reader is not None, "lines are read by cmr.cpu.mapping's map_chunk loop"
    return reader(fmt, c, piece)


# --- writers -----------------------------------------------------------------------

Write = Callable[[Any, Any], None]


def _text_writer(job: Any, out: BinaryIO) -> Write:
    fmt, w = job.format, out.write

    def write(k: Any, v: Any) -> None:
        line = fmt(k, v)
        w(line.encode("utf-8") if type(line) is str else line)
        w(b"\n")

    return write


def _raw_writer(job: Any, out: BinaryIO) -> Write:
    w = out.write
    reducer = f"{type(job).__name__}.reduce"

    def write(k: Any, v: Any) -> None:
        for x in (k, v):
            if x is None:
                continue
            if type(x) is not bytes:
                raise usercode.UserCodeError(
                    f"{reducer} yielded ({usercode.quote(k)}, {usercode.quote(v)}); "
                    "output format raw writes key and value as they are: each must be "
                    "bytes or None"
                )
            w(x)

    return write


def json_default(x: Any) -> Any:
    """JSON's ``default`` for what reduce yields (``jsonlines``, and ``Job.format``'s text
    of a value that is no str): what JSON has no form for is an error, never its repr, as
    output must say what reduce yielded. Bytes inside a list or dict read as text (UTF-8),
    as top-level bytes do."""
    if isinstance(x, bytes | bytearray):
        return bytes(x).decode("utf-8")
    raise TypeError(f"{usercode.a_type(x)} has no JSON form")


def _json_writer(job: Any, out: BinaryIO) -> Write:
    w = out.write
    dumps = json.JSONEncoder(ensure_ascii=False, default=json_default).encode

    def write(k: Any, v: Any) -> None:
        k = k.decode("utf-8") if type(k) is bytes else k
        v = v.decode("utf-8") if type(v) is bytes else v
        w(dumps([k, v]).encode("utf-8"))
        w(b"\n")

    return write


def _pairs_writer(job: Any, out: BinaryIO) -> Write:
    pack, w = msgpack.Packer(use_bin_type=True).pack, out.write

    def write(k: Any, v: Any) -> None:
        w(pack((k, v)))

    return write


_WRITERS: dict[str, Callable[[Any, BinaryIO], Write]] = {
    "text": _text_writer,
    "raw": _raw_writer,
    "jsonlines": _json_writer,
    "pairs": _pairs_writer,
}


RAW_JOIN = 65536  # pairs joined into one write at most (fewer calls), and
RAW_JOIN_BYTES = 8 << 20  # about this many bytes: a bounded extra copy


def write_raw(output_format: str, out: BinaryIO, pairs: list[tuple[Any, Any]]) -> int:
    """Write the leading ``pairs`` that are raw output of bytes alone, joined by C with no
    call per pair; how many were written: the caller writes the rest one by one (None is
    written as nothing, what raw refuses is said pair by pair). join itself checks the
    types: a scan ahead of it would touch every object twice (the pairs are sorted, their
    objects scattered in memory)."""
    if output_format != "raw":
        return 0
    done, count = 0, 256
    at = iter(pairs)
    while some := list(itertools.islice(at, count)):
        try:
            data = b"".join(itertools.chain.from_iterable(some))
        except TypeError:
            return done
        out.write(data)
        done += len(some)
        # The next join about RAW_JOIN_BYTES, by this one's bytes per pair.
        count = max(1, min(RAW_JOIN, RAW_JOIN_BYTES * len(some) // max(1, len(data))))
    return done


def writer(output_format: str, job: Any, out: BinaryIO) -> Write:
    """A function writing one (key, value) pair to ``out`` as ``output_format``."""
    return _WRITERS[check_output(output_format)](job, out)
