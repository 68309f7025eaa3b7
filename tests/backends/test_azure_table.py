"""The Azure table's transactions across partitions (cmr.backends.azure.table), on Azurite.

The conformance suite (test_table.py) runs on Azure too; these attack what only this table
has: a transaction that is a protocol of many requests, which a process can die in the
middle of, or another writer can meet half-done."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from cmr.backends.base import Check, Delete, Eq, Missing, Put, TxWrite, Update, item_absent
from cmr.errors import ConditionFailed
from tests.backends.azure_tables import locks, raw_entities
from tests.backends.conftest import AzureNames

pytestmark = pytest.mark.usefixtures("azure_stack")


async def test_a_transaction_spans_partitions_all_or_nothing(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    t = tables()
    a, b, c = unique(), unique(), unique()
    await t.put(a, "x", {"v": 1})
    await t.put(c, "gone", {"v": 1})
    writes: list[TxWrite] = [
        Update(a, "x", add={"v": 1}, condition=Eq("v", 1)),
        Put(b, "new/with#odd?keys", {"v": 2}, item_absent()),
        Delete(c, "gone"),
        Check(c, "absent", Missing("pk")),
    ]
    failing = [*writes[:3], Check(c, "absent", Eq("v", 1))]
    with pytest.raises(ConditionFailed):
        await t.transact(failing, token=unique())
    assert await t.get(a, "x") == {"pk": a, "sk": "x", "v": 1}
    assert await t.query(b) == []
    assert await t.get(c, "gone") == {"pk": c, "sk": "gone", "v": 1}
    assert locks(azure_names.table, a, b, c) == [], "an aborted transaction left its locks"
    assert raw_entities(azure_names.table, b) == [], "an aborted insert left its placeholder"

    await t.transact(writes, token=unique())
    assert await t.get(a, "x") == {"pk": a, "sk": "x", "v": 2}
    assert await t.query(b) == [{"pk": b, "sk": "new/with#odd?keys", "v": 2}]
    assert await t.get(c, "gone") is None
    assert locks(azure_names.table, a, b, c) == []


async def test_keys_keep_their_bytes_and_order(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """Keys are hex on Azure: any character is storable, and a query keeps DynamoDB's
    byte order and prefix semantics."""
    t = tables()
    pk = unique() + "/jobs#active?"
    sks = ["a", "a/b", "a#", "a\x01", "é", "z", "ab", "a\u20ac", "a\U0001f600"]
    for sk in sks:
        await t.put(pk, sk, {"sk_is": sk})
    want = sorted(sks, key=lambda s: s.encode())
    assert [i["sk"] for i in await t.query(pk)] == want
    assert [i["sk"] for i in await t.query(pk, prefix="a")] == [s for s in want if s[0] == "a"]
    assert [i["sk"] for i in await t.query(pk, prefix="a", start="a/")] == [
        s for s in want if s[0] == "a" and s.encode() >= b"a/"
    ]


async def test_a_holder_that_dies_pending_is_aborted_by_the_next_writer(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    """A process that locked its items and died before its commit: readers see the items
    as they were; a writer waits for it, then aborts it (after its own stale_s), rolls its
    locks back and writes; the holder, were it to wake, could no longer commit."""
    holder, other = tables(), tables(stale_s=1.0)
    a, b = unique(), unique()
    await holder.put(a, "n", {"v": 1})
    token = unique()
    writes: list[TxWrite] = [Update(a, "n", add={"v": 10}), Put(b, "m", {"v": 1}, item_absent())]
    tx = await holder._begin(token, sorted((w.pk, w.sk) for w in writes))
    for w in sorted(writes, key=lambda w: (w.pk, w.sk)):
        await holder._lock(tx, w)  # ... and the process dies here
    assert len(locks(azure_names.table, a, b)) == 2
    assert await other.get(a, "n") == {"pk": a, "sk": "n", "v": 1}
    assert await other.query(b) == []
    started = time.monotonic()
    await other.update(Update(a, "n", add={"v": 1}))
    assert time.monotonic() - started >= 1.0, "the writer did not wait for the pending holder"
    assert await other.get(a, "n") == {"pk": a, "sk": "n", "v": 2}
    assert not await holder._move(tx, "committed"), "an aborted transaction committed"
    assert await other.query(b) == []
    # The placeholder of b (locked while absent) is rolled back by whoever meets it next.
    await other.put(b, "m", {"v": 5}, condition=item_absent())
    assert locks(azure_names.table, a, b) == []


async def test_a_transaction_restarted_under_its_token_gets_a_new_watch(
    tables: Callable[..., Any], unique: Callable[[], str]
) -> None:
    """A transaction aborted as stale and restarted by its caller under the same token is a
    new record: a writer that aborted the first waits its stale_s for the second too, rather
    than aborting it at sight (which would abort every retry of a slow holder)."""
    holder, other = tables(), tables(stale_s=1.0)
    a = unique()
    await holder.put(a, "n", {"v": 1})
    token = unique()
    write = Update(a, "n", add={"v": 10})
    tx = await holder._begin(token, [(a, "n")])
    await holder._lock(tx, write)
    await other.update(Update(a, "n", add={"v": 1}))  # waits 1 s, aborts the first
    again = await holder._begin(token, [(a, "n")])  # the caller's retry: the same token
    assert again.state == "pending"
    assert again.etag != tx.etag
    await holder._lock(again, write)
    started = time.monotonic()
    await other.update(Update(a, "n", add={"v": 1}))
    assert time.monotonic() - started >= 1.0, "the restarted transaction was aborted at sight"
    assert await other.get(a, "n") == {"pk": a, "sk": "n", "v": 3}


async def test_a_holder_that_dies_after_its_commit_is_finished_by_a_reader(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    holder, reader = tables(), tables()
    a, b = unique(), unique()
    await holder.put(a, "n", {"v": 1})
    token = unique()
    writes: list[TxWrite] = [Update(a, "n", add={"v": 10}), Put(b, "m", {"v": 1})]
    tx = await holder._begin(token, sorted((w.pk, w.sk) for w in writes))
    for w in sorted(writes, key=lambda w: (w.pk, w.sk)):
        await holder._lock(tx, w)
    assert await holder._move(tx, "committed")  # ... and the process dies here
    assert await reader.get(a, "n") == {"pk": a, "sk": "n", "v": 11}
    assert await reader.query(b) == [{"pk": b, "sk": "m", "v": 1}]
    assert locks(azure_names.table, a, b) == []
    # A retry with the same token (the holder's answer was lost) changes nothing again.
    await reader.transact(writes, token=token)
    assert await reader.get(a, "n") == {"pk": a, "sk": "n", "v": 11}


async def test_racing_transactions_one_condition_one_winner(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    """Twelve contenders, each in its own client, claim one item across two partitions:
    exactly one wins, and every unconditional counter counts every winner once."""
    clients = [tables() for _ in range(12)]
    claim, tally = unique(), unique()

    async def contend(i: int, t: Any) -> bool:
        try:
            await t.transact(
                [
                    Put(claim, "p", {"owner": i}, item_absent()),
                    Update(tally, "wins", add={"n": 1}),
                ],
                token=unique(),
            )
        except ConditionFailed:
            return False
        return True

    won = await asyncio.gather(*(contend(i, t) for i, t in enumerate(clients)))
    assert sum(won) == 1
    owner = (await clients[0].get(claim, "p") or {})["owner"]
    assert won[owner]
    assert (await clients[0].get(tally, "wins") or {})["n"] == 1

    async def count(t: Any) -> None:
        for _ in range(3):
            await t.transact(
                [Update(claim, "p", add={"c": 1}), Update(tally, "wins", add={"c": 1})],
                token=unique(),
            )

    await asyncio.gather(*(count(t) for t in clients))
    assert (await clients[0].get(claim, "p") or {})["c"] == 36
    assert (await clients[0].get(tally, "wins") or {})["c"] == 36
    assert locks(azure_names.table, claim, tally) == []


async def test_sweep_finishes_and_forgets_old_records(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    t = tables()
    a, b = unique(), unique()
    await t.transact([Put(a, "x", {"v": 1}), Put(b, "y", {"v": 1})], token=unique())
    left = tables()  # a holder that committed and died before writing its images in
    writes = [Update(a, "x", add={"v": 1}), Update(b, "y", add={"v": 1})]
    tx = await left._begin(unique(), sorted((w.pk, w.sk) for w in writes))
    for w in writes:
        await left._lock(tx, w)
    assert await left._move(tx, "committed")
    await asyncio.sleep(1.1)  # the service's Timestamp has whole-second-safe resolution
    assert await t.sweep(keep_s=1) >= 2
    assert locks(azure_names.table, a, b) == []
    assert await t.get(a, "x") == {"pk": a, "sk": "x", "v": 2}
    assert await t.get(b, "y") == {"pk": b, "sk": "y", "v": 2}
    assert await t._tx(tx.token) is None


CHILD = textwrap.dedent(
    """
    import asyncio, secrets, sys
    from cmr.backends.azure import AzureTable
    from cmr.backends.base import Update

    async def main(table, a, b):
        async with AzureTable(table) as t:
            n = 0
            while True:
                await t.transact(
                    [Update(a, "n", add={"v": 1}), Update(b, "n", add={"v": 1})],
                    token=secrets.token_hex(8),
                )
                n += 1
                print(n, flush=True)

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def test_sigkill_mid_transaction_never_splits_one(
    tables: Callable[..., Any], unique: Callable[[], str], azure_names: AzureNames
) -> None:
    """A real process runs transactions that add one to two items in two partitions, and
    is SIGKILLed at a random point, five times. After each kill the two items read equal
    (never one transaction's half), and the next writer gets through its leftovers."""
    survivor = tables(stale_s=1.0)
    a, b = unique(), unique()
    done = midway = 0
    for kill in range(5):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, azure_names.table, a, b, stdout=subprocess.PIPE
        )
        assert child.stdout is not None
        for _ in range(3 + kill):  # let it commit a few, then kill it anywhere
            assert await child.stdout.readline(), "the child ended on its own"
        await asyncio.sleep(0.013 * (kill + 1))
        child.send_signal(signal.SIGKILL)
        await child.wait()
        midway += bool(locks(azure_names.table, a, b))
        va = (await survivor.get(a, "n") or {}).get("v", 0)
        vb = (await survivor.get(b, "n") or {}).get("v", 0)
        assert va == vb, f"kill {kill}: a transaction was split ({va} against {vb})"
        assert va >= done + 3 + kill
        await survivor.transact(
            [Update(a, "n", add={"v": 1}), Update(b, "n", add={"v": 1})], token=unique()
        )
        done = va + 1
        assert (await survivor.get(a, "n") or {})["v"] == done
        assert (await survivor.get(b, "n") or {})["v"] == done
    assert locks(azure_names.table, a, b) == []
    # The child does nothing but transactions: most kills land inside one, with its locks
    # held. None would mean the test no longer attacks what it says.
    assert midway >= 2, f"only {midway} of 5 kills landed inside a transaction"
