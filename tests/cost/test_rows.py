"""Usage rows read back are strangers' data: validated, bounded, refused with a short
reason, never priced; good rows beside them still are."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmr import usage
from cmr.backends.base import Backend
from cmr.backends.embedded import temporary_backend
from cmr.cost import MAX_REFUSED, job_cost
from cmr.errors import WireError
from cmr.prices import load
from cmr.records import job_pk

GOOD = usage.encode("c7i.large", 3600.0, {"sqs.ReceiveMessage": [10, 12.0]})


def _pack(*parts: object) -> bytes:
    data: bytes = msgpack.packb(list(parts))
    return data


JUNK = {
    "not bytes": "a string",
    "not msgpack": b"\xc1\xc1\xc1",
    "extra bytes": GOOD + b"\x00",
    "wrong version": _pack(2, "", 0.0, []),
    "negative requests": _pack(1, "", 0.0, [["sqs.ReceiveMessage", -5, 1.0]]),
    "float requests": _pack(1, "", 0.0, [["sqs.ReceiveMessage", 1.5, 1.0]]),
    "huge units": _pack(1, "", 0.0, [["sqs.ReceiveMessage", 1, 1e300]]),
    "nan seconds": _pack(1, "", float("nan"), []),
    "bad op name": _pack(1, "", 0.0, [["<script>", 1, 1.0]]),
    "repeated op": _pack(1, "", 0.0, [["s3.GetObject", 1, 1.0], ["s3.GetObject", 1, 1.0]]),
    "bad instance": _pack(1, "m5.large; rm -rf /", 0.0, []),
    "too many ops": _pack(1, "", 0.0, [[f"s3.Op{i}", 1, 1.0] for i in range(usage.MAX_OPS + 1)]),
    "too long": b"\x94" + b"\x00" * (usage.MAX_ROW_BYTES + 1),
}


@pytest.mark.parametrize("name", sorted(JUNK))
def test_junk_is_refused_with_a_bounded_reason(name: str) -> None:
    with pytest.raises(WireError) as err:
        usage.decode("p", JUNK[name])
    assert 0 < len(str(err.value)) <= 120


def test_a_good_row_round_trips() -> None:
    row = usage.decode("p", GOOD)
    assert (row.instance, row.worker_s) == ("c7i.large", 3600.0)
    assert row.ops == {"sqs.ReceiveMessage": [10, 12.0]}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_a_row_or_a_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):  # and nothing else
        usage.decode("p", data)


async def _put(be: Backend, job: str, sk: str, value: object) -> None:
    await be.table.put(job_pk(job), usage.PREFIX + sk, {"usage": value})


async def test_job_cost_prices_good_rows_and_names_the_refused() -> None:
    async with temporary_backend() as be:
        await _put(be, "j1", "good", GOOD)
        for name, value in JUNK.items():
            if name != "too long":  # past the embedded table's item limit: never stored
                await _put(be, "j1", name.replace(" ", "-"), value)
        cost = await job_cost(be, "j1", load())
    assert cost.processes == 1
    assert cost.ops["sqs.ReceiveMessage"].requests == 10
    assert cost.worker_seconds == 3600.0
    assert cost.workers_usd == pytest.approx(0.08925)  # an hour of the shipped c7i.large
    assert cost.ops["sqs.ReceiveMessage"].usd == pytest.approx(12 * 0.40 / 1e6)
    assert len(cost.refused) == min(MAX_REFUSED, len(JUNK) - 1)
    assert all(len(r) <= 300 for r in cost.refused)
    assert any("not-msgpack" in r for r in cost.refused)
