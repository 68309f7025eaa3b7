"""Attacks on the Azure table (cmr.backends.azure.table) from an adversarial review, on
Azurite; each failed on the table as first written.

Each test states a property the table protocol promises (cmr.backends.base.Table, with
DynamoDB's semantics) and attacks it where the client-side transaction protocol, or the
encoding of keys and values, could break it. A process that dies (or stalls) between two
requests is played by calling the module's step methods (``_begin``, ``_lock``, ``_move``,
``_read``, ``_seen``, ``_roll``) in the order two processes would interleave them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from cmr.backends.base import TxWrite, Update
from cmr.errors import BackendError, Rejected
from tests.backends.azure_tables import locks
from tests.backends.conftest import AzureNames

pytestmark = pytest.mark.usefixtures("azure_stack")


# -- keys and values ----------------------------------------------------------------------


async def test_a_key_the_table_admits_is_stored(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """The module admits keys up to MAX_KEY_BYTES = 512 UTF-8 bytes ("its hex fills Azure's
    1 KiB"). Azure's 1 KiB is of UTF-16: 512 characters, so 256 bytes of hex. A 300-byte
    key passes _key, then fails at the service with a 400 that is translated as a plain
    BackendError (transient: the engine retries it for ever), not Rejected."""
    t = tables()
    pk, sk = unique(), "s" * 300
    try:
        await t.put(pk, sk, {"v": 1})
    except Rejected:
        return  # refused as invalid, up front: fine
    except BackendError as exc:
        pytest.fail(f"a 300-byte key failed as a transient {type(exc).__name__}: {exc}")
    assert await t.get(pk, sk) == {"pk": pk, "sk": sk, "v": 1}


async def test_a_written_item_can_be_read_overwritten_and_deleted(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """msgpack packs a map with a non-string key, and the read (strict_map_key=True) then
    refuses it: the write succeeds, and from then on the item can be neither read, nor
    overwritten, nor deleted (every write reads first). The table should refuse it at the
    write (as boto3's parameter validation does on aws), or read back what it stored."""
    t = tables()
    pk = unique()
    with pytest.raises(Rejected, match="map key must be a string"):
        await t.put(pk, "m", {"m": {1: "one"}})  # refused at the write, as on aws
    assert await t.get(pk, "m") is None
    assert await t.query(pk) == []
    await t.put(pk, "m", {"v": 1})
    await t.delete(pk, "m")
    assert await t.get(pk, "m") is None


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # aiohttp: a body over 1 MiB
async def test_an_item_the_table_accepts_can_be_written_by_a_transaction(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    """DynamoDB's sizing counts a number of two significant digits as ~2 bytes, but a float
    is 9 bytes of msgpack: an item of ~180 KB by that sizing is 540 KB stored, and a lock
    stores an item twice (its value and its image) within Azure's 1 MiB entity. Such an item
    is refused at its first write, saying why; one just under the bound is stored, and a
    transaction on it goes through."""
    t = tables()
    a = unique()
    z = a + "~z"  # locked after a
    with pytest.raises(Rejected, match="stored"):
        await t.put(z, "big", {"f": [0.5] * 60_000})  # ~540 KB stored
    await t.put(z, "big", {"f": [0.5] * 40_000})  # ~360 KB stored
    writes: list[TxWrite] = [Update(a, "n", add={"v": 1}), Update(z, "big", set_={"g": 1})]
    await t.transact(writes, token=unique())
    assert (await t.get(z, "big") or {}).get("g") == 1
    assert locks(azure_names.table, a, z) == []


# -- deterministic failures inside a transaction ------------------------------------------


async def test_a_rejected_transaction_leaves_no_lock_behind(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    """transact checks Puts' sizes up front, but an Update's image is only sized inside
    _lock, after the items before it in key order are locked. Its Rejected (a failure that
    a retry repeats exactly) leaves the record pending and those locks held: every other
    writer of them stalls for its stale_s (15 s by default), and the caller's retries with
    the same token fail the same way."""
    t, other = tables(), tables(stale_s=2.0)
    a = unique()
    z = a + "~z"  # locked after a
    await t.put(a, "n", {"v": 1})
    await t.put(z, "big", {"s": "x" * 250_000})
    writes: list[TxWrite] = [
        Update(a, "n", add={"v": 1}),
        Update(z, "big", set_={"t": "y" * 200_000}),  # 450 KB after: over the limit
    ]
    with pytest.raises(Rejected):
        await t.transact(writes, token=unique())
    left = locks(azure_names.table, a, z)
    started = time.monotonic()
    await other.update(Update(a, "n", add={"v": 10}))
    waited = time.monotonic() - started
    assert await other.get(a, "n") == {"pk": a, "sk": "n", "v": 11}
    assert left == [] and waited < 1.0, (
        f"a Rejected transaction left locks {left}; a writer of the item waited {waited:.1f} s"
    )


# -- the sweep ----------------------------------------------------------------------------


async def test_a_read_racing_the_sweep_never_undoes_a_committed_transaction(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """A holder committed and died before writing its images in. Long after (the record is
    older than keep_s), a reader reads the item, locked; the sweep then writes the image in
    and deletes the record; the reader then looks the lock's record up, finds none, takes
    the transaction for aborted and answers the value from before it: a strongly
    consistent read returning what a transaction committed long ago overwrote. (In a query
    the same race answers one item of a transaction new and the other old.)"""
    holder, reader, sweeper = tables(), tables(), tables()
    a, b = unique(), unique()
    await holder.put(a, "n", {"v": 1})
    await holder.put(b, "n", {"v": 1})
    writes: list[TxWrite] = [Update(a, "n", add={"v": 1}), Update(b, "n", add={"v": 1})]
    tx = await holder._begin(unique(), sorted((w.pk, w.sk) for w in writes))
    for w in writes:
        await holder._lock(tx, w)
    assert await holder._move(tx, "committed")  # ... and the holder dies here
    await asyncio.sleep(1.1)
    row = await reader._read(a, "n")  # the reader's GET: the item, locked
    assert row.lock == tx.token
    assert await sweeper.sweep(keep_s=1) >= 1  # finishes it, forgets the record
    seen = await reader._seen(row)  # the reader looks the lock's record up
    assert await reader.get(a, "n") == {"pk": a, "sk": "n", "v": 2}
    assert seen == {"pk": a, "sk": "n", "v": 2}, (
        f"a read answered {seen} after the transaction that made it v=2 had committed"
    )


async def test_the_sweep_never_rolls_back_a_restarted_transaction(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """A transaction aborted (a waiter found it stale) is restarted by its caller under the
    same token. A sweep that read the old record (aborted, older than keep_s) before the
    restart rolls back, after it, every item the token locks: the restarted try's locks
    too. The restarted try then commits, and its rolled-back item never gets its image:
    half a transaction. (The sweep is played step by step: its query, then its _roll.)"""
    holder, waiter, sweeper = tables(), tables(), tables()
    a, b = unique(), unique()
    await holder.put(a, "n", {"v": 1})
    await holder.put(b, "n", {"v": 1})
    token = unique()
    writes: list[TxWrite] = [Update(a, "n", add={"v": 1}), Update(b, "n", add={"v": 1})]
    keys = sorted((w.pk, w.sk) for w in writes)
    first = await holder._begin(token, keys)
    await holder._lock(first, writes[0])  # the first try locks a, then stalls
    stale = await waiter._tx(token)
    assert stale is not None
    assert await waiter._move(stale, "aborted")  # a waiter aborts it (its rollback pending)
    await asyncio.sleep(1.1)  # the record is now older than the sweep's keep_s = 1
    old = await sweeper._tx(token)  # the sweep's query finds it: aborted
    assert old is not None and old.state == "aborted"
    second = await holder._begin(token, keys)  # the caller's retry restarts it
    assert second.state == "pending"
    await holder._lock(second, writes[0])
    await sweeper._roll(old)  # the sweep finishes the record it read
    await holder._lock(second, writes[1])
    assert await holder._move(second, "committed")  # the retry commits
    va = (await holder.get(a, "n") or {})["v"]
    vb = (await holder.get(b, "n") or {})["v"]
    assert va == vb == 2, f"a committed transaction was split: a={va}, b={vb}"


# -- the same token -----------------------------------------------------------------------


async def test_a_retry_racing_its_first_try_applies_the_transaction_once(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """DynamoDB applies a token's transaction once. A retry (the same token) whose first
    try is still under way, or has requests still on their way, must not adopt that try:
    it aborts it and restarts the transaction as a try of its own. The first try's locks,
    taken after, are of a try the record no longer names: it cannot commit, and they are
    rolled back by whoever meets them. The Update is applied once."""
    first_c, retry_c, reader = tables(), tables(), tables()
    a, b = unique(), unique()
    token = unique()
    writes: list[TxWrite] = [Update(a, "n", add={"v": 1}), Update(b, "n", add={"v": 1})]
    keys = sorted((w.pk, w.sk) for w in writes)
    first = await first_c._begin(token, keys)
    retry = await retry_c._begin(token, keys)  # the retry: the first try is aborted
    assert retry.state == "pending"
    assert retry.nonce != first.nonce
    locked = [await first_c._lock(first, w) for w in writes]  # the first try goes on
    assert not await first_c._move(first, "committed"), "a superseded try committed"
    assert await reader.get(a, "n") is None  # its locks are not the record's try's
    for w in writes:
        await retry_c._lock(retry, w)
    assert await retry_c._move(retry, "committed")
    for row, etag in locked:  # the first try, as transact would, tries to write its images
        assert not await first_c._finish(dataclasses.replace(row, etag=etag), "committed")
    va = (await reader.get(a, "n") or {})["v"]
    vb = (await reader.get(b, "n") or {})["v"]
    assert va == vb == 1, f"one transaction (add 1) was not applied exactly once: a={va}, b={vb}"
