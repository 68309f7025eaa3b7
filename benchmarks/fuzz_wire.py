"""Fuzz the decoders for a while: random, mutated and structured hostile inputs through
``wire.decode``, ``Plan.from_bytes`` and ``MapCommit.from_item``; report how many gave a
value, a WireError or anything else, and the slowest input and largest peak RSS growth
of any one input (issue 12's fuzzer ran 57,000 inputs in 5 minutes).

    python benchmarks/fuzz_wire.py --seconds 60 [--seed 1] [--json out.json]

Exits 1 if any input raised something other than WireError, or broke a bound (--max-s,
--max-mib); the first offenders are printed so they can join tests/wire_corpus.py.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cmr import wire
from cmr.plan import Plan
from tests import wire_corpus
from tests.wire_corpus import JOB, run_one

Target = Callable[[Any], object]


def _scalar(rng: random.Random) -> Any:
    kind = rng.randrange(10)
    if kind == 0:
        return None
    if kind == 1:
        return True
    if kind == 2:
        return rng.randrange(-(2**63), 2**64)
    if kind == 3:
        return rng.choice([0, 1, -1, 2**31, 2**62, 2**63 - 1, 2**64 - 1])
    if kind == 4:
        return rng.random() * 10 ** rng.randrange(-5, 300)
    if kind == 5:
        return rng.choice([float("inf"), float("nan")])
    if kind == 6:
        return "".join(chr(rng.randrange(0, 0x250)) for _ in range(rng.randrange(0, 40)))
    if kind == 7:
        return rng.randbytes(rng.randrange(0, 40))
    return rng.choice(["map", "reduce", "batch", JOB, "a1b2", "../x", "ab\x00", ""])


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.6:
        return _scalar(rng)
    if roll < 0.8:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {str(_scalar(rng))[:8]: _value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def _nest(rng: random.Random, value: Any) -> Any:
    for _ in range(rng.choice([0, 0, 10, 200, 500])):  # msgpack packs up to 511 deep
        value = [value]
    return value


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 9)):
        op = rng.randrange(5)
        i = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(i, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            buf[i:i] = rng.randbytes(rng.randrange(1, 32))
        elif op == 2:
            del buf[i : i + rng.randrange(1, 32)]
        elif op == 3:
            del buf[i:]
        else:  # a header byte msgpack or zstd cares about
            buf[i:i] = bytes([rng.choice([0xDD, 0xDF, 0xDC, 0xDE, 0xC6, 0xDB, 0xFF, 0x91])])
    return bytes(buf)


def _frame(rng: random.Random, packed: bytes) -> bytes:
    if rng.random() < 0.4:
        return wire.MAGIC + packed
    frame = bytearray(wire.compress(packed))
    if rng.random() < 0.2 and len(frame) > 6:
        frame[rng.randrange(4, min(14, len(frame)))] = rng.randrange(256)
    return wire.MAGIC + bytes(frame)


VALID = [
    wire_corpus.foreign_batch(JOB, 3),
    wire_corpus.forged_map_task(JOB, 7),
    wire.encode(wire.ReduceTask(JOB, 2)),
    wire.encode(wire.ReduceTask(JOB, 2), compress=False),
]


def message(rng: random.Random, corpus: list[bytes]) -> bytes:
    kind = rng.randrange(6)
    if kind == 5:  # deeper than any packer writes: raw array headers in some field
        deep = b"\x91" * rng.randrange(500, 20_000) + wire.pack(_scalar(rng))
        field = rng.choice(["k", "job", "task", "att", "pairs", "spill", "zz"])
        base = wire.unpack(wire.decompress(wire_corpus.foreign_batch(JOB, 1)[4:]))
        return _frame(rng, wire_corpus.map_with(field, deep, base))
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 512))
    if kind == 1:
        return wire.MAGIC + rng.randbytes(rng.randrange(0, 512))
    if kind == 2:
        return _mutate(rng, rng.choice(corpus))
    doc = wire.unpack(wire.decompress(wire_corpus.foreign_batch(JOB, 1)[4:]))
    for _ in range(rng.randrange(1, 4)):
        name = rng.choice([*doc, "ranges", "zz", ""])
        doc[name] = _nest(rng, _value(rng))
    return _frame(rng, wire.pack(doc))


def plan_blob(rng: random.Random, corpus: list[bytes]) -> bytes:
    if rng.random() < 0.3:
        return _mutate(rng, rng.choice(corpus))
    tasks = [
        [
            [
                rng.choice([_scalar(rng), "s3://b/k"]),
                rng.choice([_scalar(rng), rng.randrange(2**40)]),
                rng.choice([_scalar(rng), rng.randrange(2**40)]),
                _scalar(rng),
            ][: rng.choice([4, 4, 4, 3, 5])]
            for _ in range(rng.randrange(0, 5))
        ]
        for _ in range(rng.randrange(0, 5))
    ]
    doc: dict[Any, Any] = {"tasks": _nest(rng, tasks), "replaced": []}
    if rng.random() < 0.3:
        doc[str(_scalar(rng))[:5]] = _value(rng)
    packed = wire.pack(doc)
    return wire.compress(packed) if rng.random() < 0.9 else packed


def commit_item(rng: random.Random) -> dict[str, Any]:
    rows = [[_scalar(rng) if rng.random() < 0.2 else rng.randrange(100) for _ in range(3)]]
    item: dict[str, Any] = {
        "attempt": rng.choice(["a1b2", _scalar(rng)]),
        "counts": rng.choice([wire.pack(rows * rng.randrange(5)), rng.randbytes(20), _value(rng)]),
    }
    if rng.random() < 0.5:
        item["records_in"] = _scalar(rng)
    return item


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-s", type=float, default=2.0, help="bound per input")
    parser.add_argument("--max-mib", type=float, default=64, help="peak RSS growth per input")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cases = wire_corpus.CASES
    messages = [
        c.build()
        for n, c in cases.items()
        if c.decode is wire_corpus.decode_message and n != "largest_batch"
    ]
    plans = [c.build() for c in cases.values() if c.decode is wire_corpus.decode_plan]
    plans.append(Plan(((wire.Range("s3://b/k", 0, 10, "k"),),)).to_bytes())
    targets: list[tuple[str, Target, Callable[[], Any]]] = [
        ("message", wire_corpus.decode_message, lambda: message(rng, messages)),
        ("plan", wire_corpus.decode_plan, lambda: plan_blob(rng, plans)),
        ("commit", wire_corpus.decode_commit, lambda: commit_item(rng)),
    ]
    weights = [0.7, 0.2, 0.1]
    outcomes: Counter[str] = Counter()
    worst_s: tuple[float, str] = (0.0, "")
    worst_rss: tuple[int, str] = (0, "")
    offenders: list[str] = []
    # The corpus first: every known hostile input is part of every run.
    queue = [(n, c.decode, c.build) for n, c in cases.items()]
    start = time.monotonic()
    while queue or time.monotonic() - start < args.seconds:
        if queue:
            name, decode, build = queue.pop(0)
            label = "corpus"
        else:
            name, decode, build = rng.choices(targets, weights)[0]
            label = name
        data = build()
        r = run_one(decode, data, collect=bool(queue))
        outcomes[f"{label}:{r['outcome']}"] += 1
        if r["seconds"] > worst_s[0]:
            worst_s = (r["seconds"], name)
        if r["peak"] > worst_rss[0]:
            worst_rss = (r["peak"], name)
        bad = r["outcome"] not in ("value", "WireError")
        broke = r["seconds"] > args.max_s or r["peak"] > args.max_mib * 2**20
        if (bad or broke) and len(offenders) < 20:
            offenders.append(f"{name}: {r} input={repr(data)[:300]}")
    elapsed = time.monotonic() - start
    total = sum(outcomes.values())
    report = {
        "seconds": round(elapsed, 1),
        "inputs": total,
        "per_second": round(total / elapsed),
        "outcomes": dict(sorted(outcomes.items())),
        "other_exceptions": sum(
            v for k, v in outcomes.items() if k.split(":")[1] not in ("value", "WireError")
        ),
        "max_seconds": [round(worst_s[0], 4), worst_s[1]],
        "max_peak_rss_mib": [round(worst_rss[0] / 2**20, 1), worst_rss[1]],
        "process_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "offenders": offenders,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
