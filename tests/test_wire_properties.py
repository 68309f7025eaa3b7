"""Property tests: whatever bytes arrive on a queue, decoding yields a valid message or a
WireError — never another exception, never code execution (nothing is unpickled)."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmr import wire
from cmr.errors import WireError
from cmr.records import MapCommit

ids = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=64).filter(
    lambda s: s.replace("-", "").isalnum()
)
tasks = st.integers(min_value=0, max_value=wire.MAX_TASKS - 1)
parts = st.integers(min_value=0, max_value=wire.MAX_PARTITIONS - 1)
seqs = st.integers(min_value=0, max_value=wire.MAX_SEQ)


@st.composite
def batches(draw: st.DrawFn) -> wire.Batch:
    """Valid batches: inline pairs hold at least 3 bytes a record; a spilled one has none."""
    spilled = draw(st.booleans())
    pairs = b"" if spilled else draw(st.binary())
    records = draw(st.integers(0, wire.MAX_SEQ if spilled else len(pairs) // 3))
    url = draw(
        st.text(
            # Text msgpack can hold: no lone surrogate (hypothesis drew "\ud800" once).
            alphabet=st.characters(
                min_codepoint=0x20, exclude_characters="\x7f", exclude_categories=["Cs"]
            ),
            min_size=1,
            max_size=200,
        )
    )
    return wire.Batch(
        draw(ids),
        draw(tasks),
        draw(st.text(alphabet="0123456789abcdef", min_size=1, max_size=64)),
        draw(parts),
        draw(seqs),
        records,
        pairs,
        url if spilled else "",
        draw(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)) if spilled else "",
    )


messages = st.one_of(
    batches(),
    st.builds(wire.ReduceTask, ids, parts),
    st.builds(wire.MapTask, ids, tasks),
)
msgpack_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


def decodes_cleanly(body: bytes) -> None:
    try:
        msg = wire.decode(body)
    except WireError:
        return
    assert isinstance(msg, wire.MapTask | wire.ReduceTask | wire.Batch)


@settings(max_examples=400)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_decode_or_are_rejected(body: bytes) -> None:
    decodes_cleanly(body)
    decodes_cleanly(wire.MAGIC + body)


@settings(max_examples=300)
@given(msgpack_data)
@pytest.mark.slow
def test_any_msgpack_document_in_a_valid_frame_is_validated(doc: object) -> None:
    decodes_cleanly(wire.MAGIC + wire.compress(msgpack.packb(doc, use_bin_type=True)))


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from(["k", "job", "task", "att", "p", "seq", "n", "pairs", "spill", "ranges"]),
        msgpack_data,
    )
)
@pytest.mark.slow
def test_documents_shaped_like_ours_are_validated(doc: dict[str, object]) -> None:
    for kind in ("map", "reduce", "batch"):
        decodes_cleanly(wire.MAGIC + wire.compress(wire.pack({**doc, "k": kind})))


@settings(max_examples=200)
@given(messages)
def test_every_message_round_trips(msg: wire.Message) -> None:
    assert wire.decode(wire.encode(msg)) == msg
    # Fixed-width rows' batches are compressed at their own level; any reader decodes them.
    assert wire.decode(wire.encode(msg, rows=True)) == msg


@settings(max_examples=200)
@given(messages, st.data())
def test_corrupted_messages_are_rejected_or_still_valid(
    msg: wire.Message, data: st.DataObject
) -> None:
    body = bytearray(wire.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    decodes_cleanly(bytes(body))


def test_a_decompression_bomb_is_refused_before_allocating() -> None:
    bomb = wire.MAGIC + wire.compress(b"\0" * (wire.MAX_DECODED + 1))
    with pytest.raises(WireError, match="limit"):
        wire.decode(bomb)


@settings(max_examples=300)
@given(st.binary(max_size=512))
def test_pair_streams_yield_pairs_or_reject(stream: bytes) -> None:
    with contextlib.suppress(WireError):
        for pair in wire.iter_pairs(stream):
            assert isinstance(pair, tuple) and len(pair) == 2


@settings(max_examples=200)
@given(msgpack_data, st.text(max_size=10))
def test_malformed_commit_records_are_rejected(counts: object, attempt: str) -> None:
    with contextlib.suppress(WireError):
        MapCommit.from_item({"attempt": attempt, "counts": wire.pack(counts)})


def test_a_kind_nested_a_thousand_deep_is_rejected_not_a_crash() -> None:
    """Issue 12's first repro: ~1 KB whose `k` is a tuple nested ~1,000 deep made the
    decoder's own error text (`{kind!r}`) raise RecursionError, which escaped the reducer."""
    for depth in (1000, 5000):
        body = wire.MAGIC + b"\x81\xa1k" + b"\x91" * depth + b"\xc0"
        with pytest.raises(WireError) as info:
            wire.decode(body)
        assert len(str(info.value)) < 200
    long_kind = wire.MAGIC + wire.pack({"k": "x" * 100_000})
    with pytest.raises(WireError) as info:
        wire.decode(long_kind)
    assert len(str(info.value)) < 200  # a stranger's text is not echoed whole into the logs


def test_a_pair_stream_past_the_buffer_limit_is_rejected() -> None:
    """iter_pairs raised msgpack's BufferFull (not a WireError) for a stream past its limit."""
    with pytest.raises(WireError):
        list(wire.iter_pairs(b"\xc0" * (wire.MAX_DECODED + 1)))
