"""Hostile inputs for the decoders (issue 12), and a harness that measures each one.

Each builder returns the bytes (or table item) an adversary would send, for a given job,
partition or task, so the same bodies serve the decoder's fuzz tests here and an
end-to-end adversary that injects them into a running job's queues. ``CASES`` names every
input with the decoder it targets; ``measure`` decodes some in a fresh process and reports,
per input, the outcome, the seconds and the peak RSS growth (see ``_peak_since``).

    python -m tests.wire_corpus            # a table of every case
    python -m tests.wire_corpus --json a b # the named cases, as JSON (what tests read)
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmr import wire
from cmr.errors import WireError
from cmr.plan import Plan
from cmr.records import MapCommit

ATTEMPT = "a1b2c3d4e5f6"
JOB = "20260101-000000-0123456789abcdef"
OTHER_JOB = "20260101-000000-fedcba9876543210"
ROOT = Path(__file__).resolve().parent.parent
# The largest batch's pairs; read like this so the corpus also measures decoders from
# before the limit existed (issue 12's "fails on the old code").
BATCH_PAIRS = getattr(wire, "MAX_BATCH_PAIRS", 16 * 1024 * 1024)


def _key(name: str) -> bytes:
    return wire.pack(name)


def _batch_fields(job_id: str, p: int, /, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "k": "batch",
        "job": job_id,
        "task": 0,
        "att": ATTEMPT,
        "p": p,
        "seq": 0,
        "n": 1,
        "pairs": wire.pack(["w", 1]),
        "spill": "",
    }
    doc.update(changes)
    return doc


def map_with(field: str, value: bytes, base: dict[str, Any]) -> bytes:
    """The msgpack map ``base`` with ``field`` set to raw msgpack ``value`` (first, as the
    encoder writes ``k``): how a body carries what ``pack`` could not build cheaply."""
    rest = {k: v for k, v in base.items() if k != field}
    header = bytes([0x80 | (len(rest) + 1)])
    return header + _key(field) + value + b"".join(_key(k) + wire.pack(v) for k, v in rest.items())


# ---- queue bodies (decoded by wire.decode) -------------------------------------------------


def deep_nesting_body(job: str, depth: int = 1000, field: str = "k") -> bytes:
    """~1 KB whose ``field`` is a tuple nested ``depth`` deep (issue 12's first repro: its
    repr raised RecursionError out of the reducer)."""
    nested = b"\x91" * depth + b"\xc0"
    return wire.MAGIC + map_with(field, nested, _batch_fields(job, 0))


@functools.cache
def _bomb_frame(count: int) -> bytes:
    doc = b"\x81" + _key("k") + b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count
    return wire.compress(doc)


def zstd_bomb_body(job: str, count: int = 16_000_000) -> bytes:
    """~500 bytes of zstd that decode to a map holding ``count`` empty maps (+1.24 GB of
    Python objects at 16 M before the fix). ``job`` is unused: the bomb needs no job."""
    del job
    return wire.MAGIC + _bomb_frame(count)


def plain_bomb_body(job: str, count: int = 200_000) -> bytes:
    """A plain body (no zstd) the size of a queue message, all empty maps in one field."""
    value = b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count
    return wire.MAGIC + map_with("pairs", value, _batch_fields(job, 0))


def declared_size_body(job: str, size: int = 2**40) -> bytes:
    """A zstd frame whose header declares ``size`` decoded bytes (an empty raw block)."""
    del job
    header = bytes([0xE0]) + size.to_bytes(8, "little")  # single segment, 8-byte size
    return wire.MAGIC + wire.ZSTD_FRAME + header + b"\x01\x00\x00"


def map_count_bomb_body(job: str) -> bytes:
    """A top-level map header claiming 4 billion fields, and a field claiming as many."""
    del job
    return wire.MAGIC + b"\xdf\xff\xff\xff\xff" + b"\xa1k\xdf\xff\xff\xff\xff"


def array_count_bomb_body(job: str) -> bytes:
    return wire.MAGIC + map_with("k", b"\xdd\xff\xff\xff\xff" + b"\xc0" * 1000, {"job": job})


def long_string_body(job: str, field: str = "job", chars: int = 1_000_000) -> bytes:
    """A field of ``chars`` characters (the old rejection echoed a stranger's text whole)."""
    return wire.MAGIC + wire.compress(wire.pack(_batch_fields(job, 0, **{field: "x" * chars})))


def bad_attempt_batch(job: str, p: int, attempt: str = "ab/../../x\x00") -> bytes:
    """A batch whose attempt id would name a file outside the reducer's spool."""
    return wire.MAGIC + wire.compress(wire.pack(_batch_fields(job, p, att=attempt)))


def foreign_batch(other_job: str, p: int, task: int = 0) -> bytes:
    """A well-formed batch of another job: decodes, and its reader must refuse it."""
    return wire.encode(wire.Batch(other_job, task, ATTEMPT, p, 0, 1, wire.pack(["w", 1])))


def forged_map_task(job: str, task: int) -> bytes:
    """A well-formed map task: a pointer into the plan, valid only if ``task`` is in it."""
    return wire.encode(wire.MapTask(job, task))


def ranged_map_task(job: str, url: str, end: int = 2**62) -> bytes:
    """A map task in the old form, naming what to read: the range is refused, not obeyed."""
    doc = {"k": "map", "job": job, "task": 0, "ranges": [[url, 0, end, "x"]]}
    return wire.MAGIC + wire.compress(wire.pack(doc))


def huge_int_body(job: str, field: str = "task") -> bytes:
    return wire.MAGIC + wire.pack(_batch_fields(job, 0, **{field: 2**64 - 1}))


def batch_ratio_bomb(job: str, p: int, size: int = BATCH_PAIRS) -> bytes:
    """A batch whose zeroed pairs compress ~10,000x: refused from the frame's header."""
    pairs = b"\x00" * size
    return wire.MAGIC + wire.compress(wire.pack(_batch_fields(job, p, pairs=pairs)))


@functools.cache
def largest_batch(job: str, p: int) -> bytes:
    """The largest batch accepted: MAX_BATCH_PAIRS of pairs at ~128x (what it costs is the
    budget every other input is held to)."""
    noise = random.Random(0).randbytes(BATCH_PAIRS // 128)
    pairs = noise + b"\x00" * (BATCH_PAIRS - len(noise))
    return wire.MAGIC + wire.compress(wire.pack(_batch_fields(job, p, pairs=pairs)))


# ---- plan blobs (Plan.from_bytes), commit items (MapCommit.from_item), pair streams ---------


@functools.cache
def range_bomb_plan(tasks: int = 2_000, per_task: int = 1_000) -> bytes:
    """A plan blob of ``tasks`` x ``per_task`` tiny ranges (2 M: +414 MB before the fix)."""
    one = b"\x94\xa1u\x00\x00\xa0"  # ["u", 0, 0, ""]
    task = b"\xdd" + per_task.to_bytes(4, "big") + one * per_task
    doc = b"\x82\xa5tasks\xdd" + tasks.to_bytes(4, "big") + task * tasks + b"\xa8replaced\x90"
    return wire.compress(doc)


@functools.cache
def dense_range_plan(ranges: int = 250_000) -> bytes:
    """A plan past MAX_PLAN_RANGES whose random offsets compress too little for the ratio
    bound to refuse it: refused by its count, holding at most what a valid plan holds."""
    rng = random.Random(0)
    starts = [rng.randrange(2**31) for _ in range(ranges)]
    one = [["u", s, s + rng.randrange(2**16), ""] for s in starts]
    tasks = [one[i : i + 1000] for i in range(0, ranges, 1000)]
    return wire.compress(wire.pack({"tasks": tasks, "replaced": []}))


def one_task_plan(ranges: int = 2_000_000) -> bytes:
    return range_bomb_plan(1, ranges)


def nested_plan(depth: int = 1000) -> bytes:
    doc = b"\x82\xa5tasks\x91" + b"\x91" * depth + b"\xc0" + b"\xa8replaced\x90"
    return wire.compress(doc)


def plan_count_bomb() -> bytes:
    return wire.compress(b"\x82\xa5tasks\xdd\xff\xff\xff\xff\xa8replaced\x90")


def whole_object_plan(url: str) -> bytes:
    """A valid plan whose one range is [0, 2^62): refused, it would read a whole object."""
    return wire.compress(wire.pack({"tasks": [[[url, 0, 2**62, "x"]]], "replaced": []}))


def inf_commit_item() -> dict[str, Any]:
    """A commit record with inf where a count should be (OverflowError before the fix)."""
    return {"attempt": ATTEMPT, "counts": wire.pack([[0, 1, 1]]), "records_in": float("inf")}


def nan_counts_item() -> dict[str, Any]:
    return {"attempt": ATTEMPT, "counts": wire.pack([[0, 1, float("nan")]])}


def commit_rows_bomb_item(rows: int = 20_000) -> dict[str, Any]:
    return {"attempt": ATTEMPT, "counts": wire.pack([[p, 1, 1] for p in range(rows)])}


def commit_nesting_item(depth: int = 1000) -> dict[str, Any]:
    return {"attempt": ATTEMPT, "counts": b"\x91" * depth + b"\xc0"}


def commit_bad_attempt_item() -> dict[str, Any]:
    return {"attempt": "../../etc/x", "counts": wire.pack([[0, 1, 1]])}


def overflowing_pair_stream() -> bytes:
    """A pair stream past iter_pairs' buffer (BufferFull escaped before the fix)."""
    return b"\xc0" * (wire.MAX_DECODED + 1)


# ---- the corpus ----------------------------------------------------------------------------


def decode_message(body: bytes) -> object:
    return wire.decode(body)


def decode_plan(blob: bytes) -> object:
    return Plan.from_bytes(blob, Plan.digest(blob))


def decode_commit(item: dict[str, Any]) -> object:
    return MapCommit.from_item(item)


def decode_pairs(stream: bytes) -> object:
    return sum(1 for _ in wire.iter_pairs(stream))


@dataclass(frozen=True)
class Case:
    name: str
    decode: Callable[[Any], object]
    build: Callable[[], Any]
    accepted: bool = False  # True: a valid input, the decoder must return a value


CASES = {
    c.name: c
    for c in [
        Case("deep_k", decode_message, lambda: deep_nesting_body(JOB)),
        Case("deep_k_5000", decode_message, lambda: deep_nesting_body(JOB, 5000)),
        Case("deep_job", decode_message, lambda: deep_nesting_body(JOB, 1000, "job")),
        Case("deep_pairs", decode_message, lambda: deep_nesting_body(JOB, 1000, "pairs")),
        Case("deep_unknown", decode_message, lambda: deep_nesting_body(JOB, 1000, "zz")),
        Case("zstd_bomb", decode_message, lambda: zstd_bomb_body(JOB)),
        Case("plain_bomb", decode_message, lambda: plain_bomb_body(JOB)),
        Case("declared_size", decode_message, lambda: declared_size_body(JOB)),
        Case("map_count_bomb", decode_message, lambda: map_count_bomb_body(JOB)),
        Case("array_count_bomb", decode_message, lambda: array_count_bomb_body(JOB)),
        Case("long_job", decode_message, lambda: long_string_body(JOB)),
        Case("long_kind", decode_message, lambda: long_string_body(JOB, "k")),
        Case("long_spill", decode_message, lambda: long_string_body(JOB, "spill")),
        Case("bad_attempt", decode_message, lambda: bad_attempt_batch(JOB, 0)),
        Case("nul_attempt", decode_message, lambda: bad_attempt_batch(JOB, 0, "ab\x00cd")),
        Case("huge_task", decode_message, lambda: huge_int_body(JOB)),
        Case("huge_seq", decode_message, lambda: huge_int_body(JOB, "seq")),
        Case("ranged_map_task", decode_message, lambda: ranged_map_task(JOB, "file:///etc")),
        Case("batch_ratio_bomb", decode_message, lambda: batch_ratio_bomb(JOB, 0)),
        Case("foreign_batch", decode_message, lambda: foreign_batch(OTHER_JOB, 0), True),
        Case("forged_map_task", decode_message, lambda: forged_map_task(JOB, 99_999), True),
        Case("largest_batch", decode_message, lambda: largest_batch(JOB, 0), True),
        Case("plan_2m_ranges", decode_plan, range_bomb_plan),
        Case("plan_one_task_2m", decode_plan, one_task_plan),
        Case("plan_dense_ranges", decode_plan, dense_range_plan),
        Case("plan_nested", decode_plan, nested_plan),
        Case("plan_count_bomb", decode_plan, plan_count_bomb),
        Case("plan_whole_object", decode_plan, lambda: whole_object_plan("s3://b/k")),
        Case("plan_zstd_bomb", decode_plan, lambda: _bomb_frame(16_000_000)),
        Case("commit_inf", decode_commit, inf_commit_item),
        Case("commit_nan", decode_commit, nan_counts_item),
        Case("commit_rows_bomb", decode_commit, commit_rows_bomb_item),
        Case("commit_nested", decode_commit, commit_nesting_item),
        Case("commit_bad_attempt", decode_commit, commit_bad_attempt_item),
        Case("pairs_buffer_full", decode_pairs, overflowing_pair_stream),
    ]
}


# ---- measuring, in a process of its own ----------------------------------------------------


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _trim() -> None:
    """Give freed heap pages back (glibc keeps them resident): an input that reuses what
    an earlier one freed would otherwise show no growth."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


def _peak_since() -> Callable[[], int]:
    """A function giving the peak RSS growth, in bytes, since this call. Linux lets a
    process reset its own high-water mark (/proc/self/clear_refs, "5"), so each input is
    measured alone; elsewhere the process-wide peak (ru_maxrss) overstates, never hides."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _rss_kib("VmRSS")
        return lambda: max(0, _rss_kib("VmHWM") - base) * 1024
    except OSError:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return lambda: max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024


def run_one(decode: Callable[[Any], object], data: Any, collect: bool = True) -> dict[str, Any]:
    """Decode ``data`` once here: outcome ("value", "WireError" or another type's name),
    seconds, peak RSS growth in bytes, and the rejection's text length. ``collect``: free
    what earlier inputs left first (a few ms; a fuzzer skips it)."""
    if collect:
        gc.collect()
        _trim()
    peak = _peak_since()
    start = time.perf_counter()
    outcome, text = "value", ""
    try:
        decode(data)
    except WireError as exc:
        outcome, text = "WireError", str(exc)
    except BaseException as exc:  # the fuzz target's whole point: report, do not die
        outcome, text = type(exc).__name__, repr(exc)[:200]
    seconds = time.perf_counter() - start
    return {
        "outcome": outcome,
        "seconds": seconds,
        "peak": peak(),
        "text": text[:300],
        "text_len": len(text),
    }


def measure(names: list[str], timeout: float = 600) -> dict[str, dict[str, Any]]:
    """Run the named cases in a fresh interpreter (so one input's memory cannot hide
    another's) and return each case's report."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.wire_corpus", "--json", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main(argv: list[str]) -> None:
    as_json = "--json" in argv
    names = [a for a in argv if a != "--json"] or list(CASES)
    reports = {}
    for name in names:
        case = CASES[name]
        data = case.build()
        reports[name] = run_one(case.decode, data)
        del data
    if as_json:
        print(json.dumps(reports))
        return
    for name, r in reports.items():
        print(
            f"{name:20} {r['outcome']:10} {r['seconds'] * 1000:9.1f} ms "
            f"{r['peak'] / 2**20:8.1f} MiB  {r['text'][:70]}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
