"""Queue conformance: SQS semantics, the same body for every backend."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from cmr.backends.base import Backend, Queues, Received
from cmr.errors import QueueGone, UsageError
from tests.backends.conftest import WITH_AZURE, stack_of


@pytest.fixture(params=WITH_AZURE)
def backend_name(request: pytest.FixtureRequest) -> str:
    """This suite runs on Azure (Azurite) too."""
    return stack_of(request)


async def receive_n(
    queues: Queues, name: str, n: int, *, within_s: float = 10.0, visibility_s: int = 30
) -> list[Received]:
    """Receive until n messages arrived (SQS may spread them over several receives)."""
    got: list[Received] = []
    deadline = time.monotonic() + within_s
    while len(got) < n and time.monotonic() < deadline:
        got += await queues.receive(name, max_messages=10, wait_s=1, visibility_s=visibility_s)
    return got


async def test_create_is_idempotent(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    await backend.queues.send(q, [b"kept"])
    await backend.queues.create(q, visibility_s=30)
    await backend.queues.create(q, visibility_s=45)  # other attributes: keeps the queue
    assert [m.body for m in await receive_n(backend.queues, q, 1)] == [b"kept"]


async def test_delete_missing_is_fine(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.delete(q)
    await backend.queues.create(q, visibility_s=30)
    await backend.queues.delete(q)
    await backend.queues.delete(q)


async def test_binary_bodies_roundtrip(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    limit = backend.queues.max_message_bytes
    bodies = [
        bytes(range(256)),
        bytes(range(255, -1, -1)) * 3,
        b"",
        b"\x00",
        b"=",  # not base64 on its own: must still come back as sent
        "héllo ✓".encode(),
        os.urandom(limit),
        os.urandom(limit),
        *(f"small-{i}".encode() for i in range(23)),
    ]
    await backend.queues.send(q, bodies)
    got = await receive_n(backend.queues, q, len(bodies))
    assert sorted(m.body for m in got) == sorted(bodies)
    assert all(m.receive_count == 1 for m in got)
    assert len({m.message_id for m in got}) == len(bodies)


async def test_too_large_body_rejected(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    with pytest.raises(UsageError):
        await backend.queues.send(q, [b"ok", b"x" * (backend.queues.max_message_bytes + 1)])
    assert await backend.queues.counts(q) == (0, 0)  # nothing of the batch was sent


async def test_received_message_is_invisible_then_reappears(
    backend: Backend, unique: Callable[[], str]
) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=1)
    await backend.queues.send(q, [b"lease"])
    [first] = await backend.queues.receive(q, wait_s=1)
    assert first.receive_count == 1
    assert await backend.queues.receive(q) == []
    await asyncio.sleep(1.5)
    [again] = await backend.queues.receive(q, wait_s=2)
    assert again.body == b"lease"
    assert again.message_id == first.message_id
    assert again.receive_count == 2
    assert again.receipt != first.receipt


async def test_receive_overrides_visibility(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=60)
    await backend.queues.send(q, [b"short", b"long"])
    got = await receive_n(backend.queues, q, 2, visibility_s=1)
    assert sorted(m.body for m in got) == [b"long", b"short"]
    await asyncio.sleep(1.5)
    again = await receive_n(backend.queues, q, 2, visibility_s=60)
    assert sorted(m.body for m in again) == [b"long", b"short"]
    assert await backend.queues.receive(q) == []


async def test_change_visibility_zero_releases(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=60)
    await backend.queues.send(q, [b"release me"])
    [m] = await backend.queues.receive(q, wait_s=1)
    await backend.queues.change_visibility(q, [m.receipt], 0)
    [again] = await backend.queues.receive(q, wait_s=1)
    assert again.message_id == m.message_id
    assert again.receive_count == 2


async def test_change_visibility_extends(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=1)
    await backend.queues.send(q, [b"renewed"])
    [m] = await backend.queues.receive(q, wait_s=1)
    await backend.queues.change_visibility(q, [m.receipt], 30)
    await asyncio.sleep(1.5)
    assert await backend.queues.receive(q) == []


async def test_stale_receipt(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=1)
    await backend.queues.send(q, [b"twice"])
    [old] = await backend.queues.receive(q, wait_s=1)
    await asyncio.sleep(1.5)
    [new] = await backend.queues.receive(q, wait_s=2, visibility_s=30)
    assert new.receive_count == 2
    await backend.queues.delete_messages(q, [old.receipt])  # never an error
    await backend.queues.change_visibility(q, [old.receipt], 0)
    if backend.name == "embedded":
        # SQS may or may not honour an old receipt; the embedded backend never does.
        assert await backend.queues.counts(q) == (0, 1)


async def test_garbage_receipts_ignored(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    await backend.queues.send(q, [b"survivor"])
    [m] = await backend.queues.receive(q, wait_s=1)
    await backend.queues.delete_messages(q, [m.receipt])
    await backend.queues.delete_messages(q, [m.receipt])  # already deleted
    await backend.queues.change_visibility(q, [m.receipt], 0)
    await backend.queues.delete_messages(q, [])
    assert await backend.queues.counts(q) == (0, 0)


async def test_delete_messages_removes(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=1)
    bodies = [f"m{i}".encode() for i in range(25)]
    await backend.queues.send(q, bodies)
    got = await receive_n(backend.queues, q, 25)
    assert len(got) == 25
    await backend.queues.delete_messages(q, [m.receipt for m in got])
    await asyncio.sleep(1.5)
    assert await backend.queues.receive(q, wait_s=1) == []
    assert await backend.queues.counts(q) == (0, 0)


async def test_long_poll_returns_when_a_message_arrives(
    backend: Backend, unique: Callable[[], str]
) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    started = time.monotonic()
    waiting = asyncio.create_task(backend.queues.receive(q, wait_s=10))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await backend.queues.send(q, [b"wake up"])
    got = await waiting
    assert [m.body for m in got] == [b"wake up"]
    assert time.monotonic() - started < 5


async def test_long_poll_times_out_empty(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    started = time.monotonic()
    assert await backend.queues.receive(q, wait_s=1) == []
    assert 0.8 <= time.monotonic() - started < 5


async def test_counts(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    assert await backend.queues.counts(q) == (0, 0)
    await backend.queues.send(q, [b"a", b"b", b"c"])
    assert await backend.queues.counts(q) == (3, 0)
    [_] = await backend.queues.receive(q, max_messages=1, wait_s=1)
    assert await backend.queues.counts(q) == (2, 1)


async def test_list_by_prefix(backend: Backend, unique: Callable[[], str]) -> None:
    prefix = unique()
    mine = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    other = f"{unique()}-x"
    for q in [*mine, other]:
        await backend.queues.create(q, visibility_s=30)
    assert await backend.queues.list(prefix) == mine
    assert await backend.queues.list(f"{prefix}-b") == [f"{prefix}-b"]
    await backend.queues.delete(mine[0])
    assert await backend.queues.list(prefix) == mine[1:]
    assert await backend.queues.list(f"{prefix}-nothing") == []


async def test_deleted_queue_is_gone(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    await backend.queues.send(q, [b"before"])
    await backend.queues.delete(q)
    with pytest.raises(QueueGone):
        await backend.queues.send(q, [b"after"])
    with pytest.raises(QueueGone):
        await backend.queues.receive(q)
    with pytest.raises(QueueGone):
        await backend.queues.counts(q)


async def test_never_created_queue_is_gone(backend: Backend, unique: Callable[[], str]) -> None:
    with pytest.raises(QueueGone):
        await backend.queues.receive(unique())


async def test_calls_are_counted(backend: Backend, unique: Callable[[], str]) -> None:
    q = unique()
    await backend.queues.create(q, visibility_s=30)
    before = backend.calls()
    await backend.queues.send(q, [f"{i}".encode() for i in range(25)])
    got = await receive_n(backend.queues, q, 25)
    await backend.queues.delete_messages(q, [m.receipt for m in got])
    calls = backend.calls() - before
    if backend.name == "azure":  # no batches: a request a message; up to 10 a receive here
        assert calls["queue.PutMessage"] == 25
        assert calls["queue.GetMessages"] >= 3
        assert calls["queue.DeleteMessage"] == 25
        return
    assert calls["sqs.SendMessageBatch"] == 3
    assert calls["sqs.ReceiveMessage"] >= 3
    assert calls["sqs.DeleteMessageBatch"] == 3


async def test_a_renewed_receipt_still_deletes(backend: Backend, unique: Callable[[], str]) -> None:
    """A worker renews its lease (perhaps more than once) and deletes with the receipt it
    received: SQS keeps a receipt across ChangeMessageVisibility; Azure gives a new pop
    receipt on every update, which its backend must follow, or the finished task's
    message comes back once its lease runs out."""
    q = unique()
    await backend.queues.create(q, visibility_s=1)
    await backend.queues.send(q, [b"renewed twice"])
    [m] = await backend.queues.receive(q, wait_s=1)
    await backend.queues.change_visibility(q, [m.receipt], 2)
    await asyncio.gather(
        backend.queues.change_visibility(q, [m.receipt], 1),
        backend.queues.delete_messages(q, [m.receipt]),
    )
    await asyncio.sleep(1.5)
    assert await backend.queues.receive(q, wait_s=1) == []
    assert await backend.queues.counts(q) == (0, 0)
