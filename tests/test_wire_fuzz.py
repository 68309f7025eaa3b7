"""The decoders' fuzz target (issue 12): every input gives a value or one WireError, in
bounded time and memory, with a bounded text. The corpus of the issue's hostile inputs
(tests/wire_corpus.py) is measured in a process of its own (peak RSS per input); random
and mutated inputs run here under hypothesis."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmr import plan as plan_mod
from cmr import records, split, wire
from cmr.cpu.shuffle import Shuffle
from cmr.cpu.specs import MapSpec
from cmr.errors import UsageError, WireError
from cmr.plan import Plan
from cmr.records import MapCommit
from cmr.wire import Range
from tests import wire_corpus
from tests.wire_corpus import JOB

SECONDS_PER_INPUT = 2.0  # generous for a loaded 2-core CI box; the slowest input takes ~0.7 s
RSS_PER_INPUT = 64 * 1024 * 1024  # the largest valid batch costs ~32 MiB
FUZZ = settings(
    max_examples=300,
    deadline=SECONDS_PER_INPUT * 1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow
def test_every_corpus_input_is_total_fast_and_small() -> None:
    """Each of the issue's hostile inputs, decoded alone in a fresh process: a value for
    the valid ones, exactly one WireError with a short text for the rest; under 2 s and
    64 MiB of peak RSS growth each (the old decoder spent 1.24 GB and 5 s on one)."""
    reports = wire_corpus.measure(list(wire_corpus.CASES))
    failures = []
    for name, case in wire_corpus.CASES.items():
        r = reports[name]
        want = "value" if case.accepted else "WireError"
        if r["outcome"] != want:
            failures.append(f"{name}: {r['outcome']} ({r['text'][:120]}), want {want}")
        if r["text_len"] > wire.MAX_ERROR_CHARS:
            failures.append(f"{name}: rejection text of {r['text_len']} characters")
        if r["seconds"] > SECONDS_PER_INPUT:
            failures.append(f"{name}: {r['seconds']:.2f} s")
        if r["peak"] > RSS_PER_INPUT:
            failures.append(f"{name}: peak RSS +{r['peak'] / 2**20:.0f} MiB")
    assert not failures, "\n".join(failures)


def total(decode: Callable[[Any], object], data: Any) -> object | None:
    """Decode; a WireError is a fine answer (with a bounded text), anything else fails."""
    text = ""
    try:
        return decode(data)
    except WireError as exc:
        text = str(exc)
    assert len(text) <= wire.MAX_ERROR_CHARS
    return None


MESSAGE_CASES = [
    name
    for name, c in wire_corpus.CASES.items()
    if c.decode is wire_corpus.decode_message and name != "largest_batch"
]


@functools.cache
def _body(name: str) -> bytes:
    body: bytes = wire_corpus.CASES[name].build()
    return body


@FUZZ
@given(st.sampled_from(MESSAGE_CASES), st.data())
@pytest.mark.slow
def test_mutated_hostile_bodies_are_rejected_or_valid(name: str, data: st.DataObject) -> None:
    buf = bytearray(_body(name))
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "set" and buf:
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and buf:
            del buf[i : i + data.draw(st.integers(1, 16))]
        elif op == "truncate":
            del buf[i:]
    total(wire.decode, bytes(buf))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=50)
    | st.binary(max_size=50)
)
nested = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)
FIELDS = ["k", "job", "task", "att", "p", "seq", "n", "pairs", "spill", "ranges", "zz"]


@st.composite
def hostile_documents(draw: st.DrawFn) -> bytes:
    """A valid message with some fields replaced by anything, maybe nested deep, maybe
    framed plain or in zstd; the frame itself sometimes lies about its size."""
    msg = draw(
        st.sampled_from(
            [
                wire_corpus.foreign_batch(JOB, 3),
                wire_corpus.forged_map_task(JOB, 7),
                wire.encode(wire.ReduceTask(JOB, 2)),
            ]
        )
    )
    doc = wire.unpack(wire.decompress(msg[len(wire.MAGIC) :]))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        value = draw(nested)
        for _ in range(draw(st.integers(0, 3)) * 100):
            value = [value]
        doc[name] = value
    packed = wire.pack(doc)
    if draw(st.booleans()):
        return wire.MAGIC + packed
    frame = bytearray(wire.compress(packed))
    if draw(st.booleans()) and len(frame) > 6:
        frame[5] = draw(st.integers(0, 255))  # the declared size, or the header's flags
    return wire.MAGIC + bytes(frame)


@FUZZ
@given(hostile_documents())
@pytest.mark.slow
def test_documents_with_hostile_fields_are_validated(body: bytes) -> None:
    msg = total(wire.decode, body)
    if msg is not None:
        assert isinstance(msg, wire.MapTask | wire.ReduceTask | wire.Batch)
        assert wire.is_job_id(msg.job)


@FUZZ
@given(st.integers(0, 2**64 - 1), st.binary(max_size=64))
def test_frames_declaring_any_size_are_refused_or_decoded(size: int, tail: bytes) -> None:
    frame = wire.ZSTD_FRAME + bytes([0xE0]) + size.to_bytes(8, "little") + tail
    start = time.perf_counter()
    total(wire.decode, wire.MAGIC + frame)
    assert time.perf_counter() - start < SECONDS_PER_INPUT


ranges = st.builds(
    Range,
    st.text(min_size=1, max_size=30).filter(wire.is_url),
    st.integers(0, 2**32),
    st.integers(0, 2**32),
    st.text(max_size=30).filter(lambda s: "\0" not in s),
).filter(lambda r: r.start <= r.end)
plans = st.builds(
    Plan,
    st.lists(st.lists(ranges, min_size=1, max_size=5).map(tuple), max_size=5).map(tuple),
    st.lists(st.text(max_size=20).filter(lambda s: "\0" not in s), max_size=3).map(tuple),
)


@FUZZ
@given(plans)
@pytest.mark.slow
def test_valid_plans_round_trip(plan: Plan) -> None:
    data = plan.to_bytes()
    assert Plan.from_bytes(data, Plan.digest(data)) == plan


@FUZZ
@given(
    st.dictionaries(st.sampled_from(["tasks", "replaced", "x"]), nested, max_size=3)
    | st.builds(
        lambda t: {"tasks": t, "replaced": []},
        st.lists(st.lists(nested, max_size=4), max_size=4),
    )
)
@pytest.mark.slow
def test_any_document_as_a_plan_is_validated(doc: dict[str, Any]) -> None:
    blob = wire.compress(msgpack.packb(doc, use_bin_type=True))
    plan = total(wire_corpus.decode_plan, blob)
    if plan is not None:
        assert isinstance(plan, Plan)
        for task in plan.tasks:
            assert all(0 <= r.start <= r.end < plan_mod.MAX_OFFSET for r in task)


@FUZZ
@given(st.binary(max_size=2048))
def test_any_bytes_as_a_plan_are_rejected(blob: bytes) -> None:
    total(wire_corpus.decode_plan, blob)
    total(wire_corpus.decode_plan, wire.compress(blob))


counts = st.integers(-(2**63), 2**64 - 1) | st.floats() | st.none() | st.text(max_size=3)
commit_items = st.fixed_dictionaries(
    {"attempt": st.text(max_size=8) | st.sampled_from(["a1", "ff00"]) | nested},
    optional={
        "counts": st.lists(st.lists(counts, max_size=4), max_size=8).map(
            lambda rows: msgpack.packb(rows, use_bin_type=True)
        )
        | st.binary(max_size=64)
        | nested,
        "records_in": counts,
        "bytes_in": counts,
    },
)


@FUZZ
@given(commit_items)
@pytest.mark.slow
def test_any_commit_record_gives_a_commit_or_a_wire_error(item: dict[str, Any]) -> None:
    commit = total(MapCommit.from_item, item)
    if commit is not None:
        assert isinstance(commit, MapCommit) and wire.is_attempt_id(commit.attempt)
        assert all(0 <= p < wire.MAX_PARTITIONS for p in commit.batches)


@FUZZ
@given(
    st.text("0123456789abcdef", min_size=1, max_size=12),
    st.dictionaries(st.integers(0, wire.MAX_PARTITIONS - 1), st.integers(1, 1000), max_size=20),
    st.integers(0, 2**62),
)
def test_valid_commits_round_trip(attempt: str, batches: dict[int, int], n: int) -> None:
    records = {p: b * 3 for p, b in batches.items()}
    commit = MapCommit(attempt, batches, records, n, n)
    assert MapCommit.from_item(commit.to_item()) == commit


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -1, 2**63, 1.5, True, "7"])
def test_a_commit_count_that_is_not_a_count_is_a_wire_error(value: object) -> None:
    """Issue 12: ``MapCommit.from_item`` raised OverflowError on inf (ValueError on NaN
    was caught, OverflowError was not)."""
    good = {"attempt": "a1", "counts": wire.pack([[0, 1, 2]])}
    with pytest.raises(WireError):
        MapCommit.from_item({**good, "records_in": value})
    with pytest.raises(WireError):
        MapCommit.from_item({**good, "counts": wire.pack([[0, 1, value]])})


def test_the_plan_refuses_tasks_and_ranges_past_its_limits() -> None:
    """A valid plan of 2 M ranges cost +414 MB: the submitter is refused first, with what
    to change; a worker refuses the blob before building more than a valid plan holds."""
    one = Range("s3://b/k", 0, 10, "k")
    too_many = Plan(tuple((one,) for _ in range(plan_mod.MAX_PLAN_RANGES + 1)))
    with pytest.raises(UsageError, match="ranges"):
        too_many.to_bytes()
    with pytest.raises(UsageError, match="ranges"):
        Plan(((one,) * (plan_mod.MAX_RANGES_PER_TASK + 1),)).to_bytes()
    with pytest.raises(UsageError, match="out of bounds"):
        Plan(((Range("s3://b/k", 0, 2**62, "k"),),)).to_bytes()
    past = plan_mod.MAX_RANGES_PER_TASK + 1
    blob = wire.compress(wire.pack({"tasks": [[["u", 0, 1, ""]] * past], "replaced": []}))
    with pytest.raises(WireError, match="ranges in map task 0"):
        Plan.from_bytes(blob, Plan.digest(blob))


def test_limits_agree_with_the_submitter() -> None:
    """The job record's maps and partitions are bounded by the numbers the messages are."""
    assert records.MAX_PARTITIONS <= wire.MAX_PARTITIONS
    assert records.MAX_MAPS <= wire.MAX_TASKS
    assert split.MAX_RANGES_PER_TASK <= plan_mod.MAX_RANGES_PER_TASK  # every plan it makes


def test_decode_async_gives_what_decode_gives() -> None:
    small = wire_corpus.foreign_batch(JOB, 1)
    large = wire_corpus.largest_batch(JOB, 0)
    assert wire.decode_cost(small) <= wire.ASYNC_DECODE_BYTES < wire.decode_cost(large)
    assert asyncio.run(wire.decode_async(small)) == wire.decode(small)
    assert asyncio.run(wire.decode_async(large)) == wire.decode(large)
    for hostile in (wire_corpus.zstd_bomb_body(JOB), b"junk", wire_corpus.deep_nesting_body(JOB)):
        with pytest.raises(WireError):
            asyncio.run(wire.decode_async(hostile))


def test_encoded_bodies_are_unchanged() -> None:
    """Compatibility: the encoder's bytes for valid messages are what they were."""
    batch = wire.Batch(JOB, 1, "ab12", 2, 3, 1, wire.pack(["w", 1]))
    assert wire.encode(batch, compress=False) == wire.MAGIC + wire.pack(
        {
            "k": "batch",
            "job": JOB,
            "task": 1,
            "att": "ab12",
            "p": 2,
            "seq": 3,
            "n": 1,
            "pairs": wire.pack(["w", 1]),
            "spill": "",
        }
    )
    assert wire.encode(wire.MapTask(JOB, 5), compress=False) == wire.MAGIC + wire.pack(
        {"k": "map", "job": JOB, "task": 5}
    )


def test_a_batch_of_more_records_than_its_pairs_can_hold_is_refused() -> None:
    body = wire.encode(wire.Batch(JOB, 0, "ab", 0, 0, 2, b"\x92\xc0\xc0"))
    with pytest.raises(WireError, match="'n'"):
        wire.decode(body)
    with contextlib.suppress(WireError):  # a spilled batch carries no pairs of its own
        spilled = wire.encode(wire.Batch(JOB, 0, "ab", 0, 0, 1, b"x", "s3://b/k"))
        wire.decode(spilled)
        pytest.fail("a spilled batch with pairs was accepted")


def test_the_mapper_packs_batches_the_decoder_accepts(tmp_path: Path) -> None:
    """Values that compress ~10,000x: the mapper's target grows with the ratio it saw, so
    its second batch held 23 MB of pairs in a 3.6 KB body, which the decoder refuses."""
    spec = MapSpec(JOB, 0, "ab12", 1, 256 * 1024, str(tmp_path), combine=False)
    out = io.BytesIO()
    shuffle = Shuffle(spec, out)
    for i in range(400):
        shuffle.add(0, f"key{i}", "x" * 60_000)
    shuffle.close()
    out.seek(0)
    records = 0
    for _, _, n, body, spilled in msgpack.Unpacker(out, raw=False):
        assert not spilled
        batch = wire.decode(body)
        assert isinstance(batch, wire.Batch) and batch.records == n
        records += n
    assert records == 400
