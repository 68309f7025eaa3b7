"""Table conformance: DynamoDB semantics, the same body for every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cmr.backends.base import (
    AllOf,
    AnyOf,
    Backend,
    Check,
    Condition,
    Delete,
    Eq,
    Lt,
    Missing,
    Present,
    Put,
    TxWrite,
    Update,
    item_absent,
)
from cmr.errors import BackendError, ConditionFailed, Rejected


async def test_put_get(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "a", {"v": 1, "s": "x"})
    assert await backend.table.get(pk, "a") == {"pk": pk, "sk": "a", "v": 1, "s": "x"}
    assert await backend.table.get(pk, "b") is None
    assert await backend.table.get(unique(), "a") is None
    await backend.table.put(pk, "a", {"w": 2})  # replaces the whole item
    assert await backend.table.get(pk, "a") == {"pk": pk, "sk": "a", "w": 2}


async def test_put_key_comes_from_arguments(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "a", {"pk": "ignored", "sk": "ignored", "v": 1})
    assert await backend.table.get(pk, "a") == {"pk": pk, "sk": "a", "v": 1}


async def test_put_if_absent_twice(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "claim", {"owner": "w1"}, condition=item_absent())
    with pytest.raises(ConditionFailed):
        await backend.table.put(pk, "claim", {"owner": "w2"}, condition=item_absent())
    assert (await backend.table.get(pk, "claim") or {})["owner"] == "w1"


ITEM: dict[str, Any] = {"n": 5, "s": "m", "flag": True, "f": 2.5, "nothing": None}

# (condition, holds on ITEM, holds on an absent item)
CONDITIONS: list[tuple[Condition, bool, bool]] = [
    (Missing("pk"), False, True),
    (Present("pk"), True, False),
    (Missing("other"), True, True),
    (Present("n"), True, False),
    (Present("nothing"), True, False),  # a None value is present
    (Eq("n", 5), True, False),
    (Eq("n", 6), False, False),
    (Eq("s", "m"), True, False),
    (Eq("s", "M"), False, False),
    (Eq("flag", True), True, False),
    (Eq("flag", False), False, False),
    (Eq("f", 2.5), True, False),
    (Eq("n", "5"), False, False),  # types never compare equal
    (Eq("other", 1), False, False),
    (Lt("n", 6), True, False),
    (Lt("n", 5), False, False),
    (Lt("n", -10), False, False),
    (Lt("f", 3.0), True, False),
    (Lt("f", 2.5), False, False),
    (Lt("s", "n"), True, False),
    (Lt("s", "m"), False, False),
    (Lt("s", "ma"), True, False),  # a prefix sorts first
    (Lt("s", "B"), False, False),  # byte order: upper case before lower
    # types never compare (on moto, a mixed-type comparison answers HTTP 500: the aws table
    # sends none, see _typed in cmr/backends/aws/dynamodb.py)
    (Lt("s", 10), False, False),
    (Lt("n", "z"), False, False),
    (Lt("other", 1), False, False),
    (AllOf((Present("n"), Eq("s", "m"))), True, False),
    (AllOf((Present("n"), Eq("s", "x"))), False, False),
    (AnyOf((Eq("s", "x"), Lt("n", 10))), True, False),
    (AnyOf((Eq("s", "x"), Lt("n", 1))), False, False),
    (AnyOf((Missing("pk"), Eq("n", 5))), True, True),
    (
        AllOf((Present("pk"), AnyOf((Eq("s", "x"), AllOf((Lt("n", 6), Eq("flag", True))))))),
        True,
        False,
    ),
    (AnyOf((AllOf((Missing("pk"), Missing("n"))), AllOf((Eq("n", 5), Lt("s", "a"))))), False, True),
    (AllOf(()), True, True),
    (AnyOf(()), False, False),
]


@pytest.mark.parametrize(("condition", "on_item", "on_absent"), CONDITIONS, ids=repr)
async def test_condition(
    backend: Backend,
    unique: Callable[[], str],
    condition: Condition,
    on_item: bool,
    on_absent: bool,
) -> None:
    pk = unique()
    await backend.table.put(pk, "it", ITEM)
    for sk, expected in [("it", on_item), ("absent", on_absent)]:
        try:
            await backend.table.update(Update(pk, sk, set_={"touched": True}, condition=condition))
            held = True
        except ConditionFailed:
            held = False
        assert held == expected, sk
        after = await backend.table.get(pk, sk)
        assert (after is not None and after.get("touched") is True) == expected


async def test_conditional_put_and_delete_use_conditions(
    backend: Backend, unique: Callable[[], str]
) -> None:
    pk = unique()
    await backend.table.put(pk, "a", {"v": 1})
    with pytest.raises(ConditionFailed):
        await backend.table.put(pk, "a", {"v": 3}, condition=Eq("v", 2))
    await backend.table.put(pk, "a", {"v": 2}, condition=AllOf((Present("pk"), Lt("v", 2))))
    with pytest.raises(ConditionFailed):
        await backend.table.delete(pk, "a", condition=Eq("v", 1))
    assert await backend.table.get(pk, "a") == {"pk": pk, "sk": "a", "v": 2}
    await backend.table.delete(pk, "a", condition=Eq("v", 2))
    assert await backend.table.get(pk, "a") is None
    await backend.table.delete(pk, "a")  # absent is fine without a condition
    with pytest.raises(ConditionFailed):
        await backend.table.delete(pk, "a", condition=Present("pk"))


async def test_eq_does_not_equate_bool_and_number(
    backend: Backend, unique: Callable[[], str]
) -> None:
    """true is not 1 in DynamoDB. moto equates them; the aws table's type guard (``_typed``)
    keeps that gap from changing an answer on the local stack."""
    pk = unique()
    await backend.table.put(pk, "a", {"one": 1, "yes": True})
    with pytest.raises(ConditionFailed):
        await backend.table.update(Update(pk, "a", set_={"x": 1}, condition=Eq("one", True)))
    with pytest.raises(ConditionFailed):
        await backend.table.update(Update(pk, "a", set_={"x": 1}, condition=Eq("yes", 1)))


async def test_numbers_compare_across_int_and_float(
    backend: Backend, unique: Callable[[], str]
) -> None:
    """DynamoDB has one number type: an int attribute compares with a float value, and a
    float attribute with an int value, by their numeric value. After each conditional write
    the item is read back: one whose condition holds wrote, one whose condition fails wrote
    nothing, and the numbers read back as the numbers written (an int as an int, 1.5 as a
    float: no Decimal, no truncation)."""
    pk = unique()
    await backend.table.put(pk, "a", {"at": 100, "t": 1.5, "two": 2.0})
    steps: list[tuple[Condition, bool]] = [
        (Lt("at", 100.5), True),  # int attribute < float value
        (Lt("t", 2), True),  # float attribute < int value
        (Eq("at", 100.0), True),  # int attribute = float value
        (Eq("two", 2), True),  # float attribute = int value
        (Lt("at", 99.5), False),
        (Lt("t", 1), False),
        (Eq("at", 100.5), False),
        (Eq("t", 1), False),
    ]
    written = 0
    for n, (condition, holds) in enumerate(steps, 1):
        update = Update(pk, "a", set_={"x": n}, condition=condition)
        if holds:
            await backend.table.update(update)
            written = n
        else:
            with pytest.raises(ConditionFailed):
                await backend.table.update(update)
        item = await backend.table.get(pk, "a", consistent=True)
        assert item == {"pk": pk, "sk": "a", "at": 100, "t": 1.5, "two": 2, "x": written}, condition
        assert (type(item["at"]), type(item["t"]), type(item["x"])) == (int, float, int)


async def test_update_creates_and_adds(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    first = await backend.table.update(Update(pk, "c", add={"n": 1}))
    assert first == {"pk": pk, "sk": "c", "n": 1}
    second = await backend.table.update(
        Update(pk, "c", set_={"state": "run"}, add={"n": 2, "m": -1})
    )
    assert second == {"pk": pk, "sk": "c", "n": 3, "m": -1, "state": "run"}
    assert await backend.table.get(pk, "c") == second
    third = await backend.table.update(Update(pk, "c", set_={"state": "done", "extra": [1, "x"]}))
    assert third == {"pk": pk, "sk": "c", "n": 3, "m": -1, "state": "done", "extra": [1, "x"]}


@pytest.mark.emulator_gap(
    reason="an UpdateItem with no update expression answers HTTP 500 (AttributeError inside "
    "the server, retried as a server fault); DynamoDB creates the item, or keeps it, as asked",
    raises=BackendError,
)
async def test_update_with_only_a_condition(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    assert await backend.table.update(Update(pk, "c")) == {"pk": pk, "sk": "c"}
    with pytest.raises(ConditionFailed):
        await backend.table.update(Update(pk, "c", condition=item_absent()))


async def test_update_condition_failure_changes_nothing(
    backend: Backend, unique: Callable[[], str]
) -> None:
    pk = unique()
    await backend.table.update(Update(pk, "c", set_={"epoch": 2}, add={"n": 1}))
    with pytest.raises(ConditionFailed):
        await backend.table.update(
            Update(pk, "c", set_={"epoch": 1}, add={"n": 1}, condition=Lt("epoch", 1))
        )
    assert await backend.table.get(pk, "c") == {"pk": pk, "sk": "c", "epoch": 2, "n": 1}


async def test_query_prefix_in_sk_order(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    for sk in ["b", "a2", "a1", "c", "a10", "A", "a"]:
        await backend.table.put(pk, sk, {"v": sk})
    await backend.table.put(unique(), "a0", {"v": "other partition"})
    assert [i["sk"] for i in await backend.table.query(pk)] == [
        "A",
        "a",
        "a1",
        "a10",
        "a2",
        "b",
        "c",
    ]
    assert [i["sk"] for i in await backend.table.query(pk, prefix="a")] == [
        "a",
        "a1",
        "a10",
        "a2",
    ]
    assert [i["v"] for i in await backend.table.query(pk, prefix="a1")] == ["a1", "a10"]
    assert await backend.table.query(pk, prefix="z") == []
    assert await backend.table.query(unique()) == []


async def test_query_from_a_start_key(backend: Backend, unique: Callable[[], str]) -> None:
    """What a reducer asks: the map commits from the first task it does not know on."""
    pk = unique()
    sks = ["map#0000001", "map#0000002", "map#0000010", "map#0000003", "map#\u00e9", "map"]
    for sk in [*sks, "job", "reduce#0000001", "map$"]:
        await backend.table.put(pk, sk, {"v": sk})

    async def sks_from(start: str, prefix: str = "map#") -> list[str]:
        return [str(i["sk"]) for i in await backend.table.query(pk, prefix=prefix, start=start)]

    assert await sks_from("map#0000002") == [
        "map#0000002",
        "map#0000003",
        "map#0000010",
        "map#\u00e9",
    ]
    assert await sks_from("map#0000004") == ["map#0000010", "map#\u00e9"]
    assert await sks_from("map#\u00ea") == []
    assert await sks_from("") == await sks_from("map#")
    assert await sks_from("") == sorted(sk for sk in sks if sk.startswith("map#"))
    assert await sks_from("m", prefix="") == [
        "map",
        "map#0000001",
        "map#0000002",
        "map#0000003",
        "map#0000010",
        "map#\u00e9",
        "map$",
        "reduce#0000001",
    ]
    with pytest.raises(ValueError, match="not under its prefix"):
        await backend.table.query(pk, prefix="map#", start="reduce#")


async def test_query_spans_pages(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    blob = b"x" * 100_000
    for i in range(15):  # 1.5 MB: more than one 1 MB Query page
        await backend.table.put(pk, f"part-{i:03d}", {"blob": blob, "i": i})
    items = await backend.table.query(pk, prefix="part-")
    assert [i["i"] for i in items] == list(range(15))
    assert all(i["blob"] == blob for i in items)


async def test_consistent_and_eventual_reads(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "a", {"v": 1})
    assert await backend.table.get(pk, "a", consistent=True) == {"pk": pk, "sk": "a", "v": 1}
    assert [i["v"] for i in await backend.table.query(pk, consistent=True)] == [1]
    # Eventual reads may lag, but never invent: they see nothing or the written item.
    assert await backend.table.get(pk, "a", consistent=False) in (
        None,
        {"pk": pk, "sk": "a", "v": 1},
    )
    assert len(await backend.table.query(pk, consistent=False)) <= 1


VALUES: dict[str, Any] = {
    "str": "héllo ✓",
    "empty_str": "",
    "int": 42,
    "neg": -7,
    "zero": 0,
    "big": 2**64 + 1,
    "huge": 10**37,
    "float": 3.25,
    "tenth": 0.1,
    "tiny": 1e-30,
    "negfloat": -2.5e-10,
    "integral_float": 2.0,  # DynamoDB has one number type: may come back as int 2
    "true": True,
    "false": False,
    "bytes": bytes(range(256)),
    "empty_bytes": b"",
    "none": None,
    "list": [1, "a", None, True, b"\x00", [2, {"x": b"y"}]],
    "empty_list": [],
    "dict": {"k": {"z": None, "n": 1.5}, "l": ["q"]},
    "empty_dict": {},
}


async def test_values_roundtrip(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "v", VALUES)
    got = await backend.table.get(pk, "v")
    assert got == {"pk": pk, "sk": "v", **VALUES}
    assert got is not None
    for key, value in VALUES.items():
        if key != "integral_float":
            assert type(got[key]) is type(value), key
    [queried] = await backend.table.query(pk)
    assert queried == got
    updated = await backend.table.update(Update(pk, "u", set_=VALUES))
    assert updated == {"pk": pk, "sk": "u", **VALUES}


async def test_returned_items_are_copies(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    item: dict[str, Any] = {"l": [1]}
    await backend.table.put(pk, "a", item)
    item["l"].append(2)
    got = await backend.table.get(pk, "a")
    assert got is not None
    assert got["l"] == [1]
    got["l"].append(3)
    assert (await backend.table.get(pk, "a") or {})["l"] == [1]


async def test_calls_are_counted(backend: Backend, unique: Callable[[], str]) -> None:
    """Every request is counted under its service's own operation name. Azure's table has
    no conditional write on attributes: each write first reads the entity (QueryEntity),
    then writes If-Match what it read (cmr.backends.azure.table)."""
    pk = unique()
    before = backend.calls()
    await backend.table.put(pk, "a", {"v": 1})
    await backend.table.get(pk, "a")
    await backend.table.query(pk)
    await backend.table.update(Update(pk, "a", add={"v": 1}))
    await backend.table.delete(pk, "a")
    calls = backend.calls() - before
    if backend.name == "azure":
        assert {k: calls[k] for k in calls if k.startswith("table.")} == {
            "table.QueryEntity": 4,
            "table.InsertEntity": 1,
            "table.QueryEntities": 1,
            "table.UpdateEntity": 1,
            "table.DeleteEntity": 1,
        }
        return
    assert {k: calls[k] for k in calls if k.startswith("dynamodb.")} == {
        "dynamodb.PutItem": 1,
        "dynamodb.GetItem": 1,
        "dynamodb.Query": 1,
        "dynamodb.UpdateItem": 1,
        "dynamodb.DeleteItem": 1,
    }


async def test_transact_applies_all_writes(backend: Backend, unique: Callable[[], str]) -> None:
    pk = unique()
    await backend.table.put(pk, "gone", {"v": 1})
    await backend.table.put(pk, "kept", {"n": 1})
    await backend.table.put(pk, "other", {"v": 1})
    await backend.table.transact(
        [
            Put(pk, "new", {"v": 2}, item_absent()),
            Update(pk, "kept", set_={"s": "x"}, add={"n": 2}, condition=Eq("n", 1)),
            Delete(pk, "gone"),
            Check(pk, "other", Present("v")),
        ],
        token=unique(),
    )
    assert [i["sk"] for i in await backend.table.query(pk)] == ["kept", "new", "other"]
    assert await backend.table.get(pk, "kept") == {"pk": pk, "sk": "kept", "n": 3, "s": "x"}


async def test_transact_applies_nothing_when_a_condition_fails(
    backend: Backend, unique: Callable[[], str]
) -> None:
    pk = unique()
    await backend.table.put(pk, "a", {"v": 1})
    for failing in (
        Check(pk, "b", Present("pk")),
        Update(pk, "b", set_={"v": 1}, condition=Eq("v", 9)),
    ):
        with pytest.raises(ConditionFailed):
            await backend.table.transact(
                [Update(pk, "a", set_={"v": 2}), Put(pk, "c", {"v": 3}), failing],
                token=unique(),
            )
    assert [i["sk"] for i in await backend.table.query(pk)] == ["a"]
    assert (await backend.table.get(pk, "a") or {})["v"] == 1


@pytest.mark.emulator_gap(
    reason="TransactWriteItems' ClientRequestToken is not modelled: a retry with the same "
    "token is applied again (its condition fails) instead of succeeding with no effect",
    raises=ConditionFailed,
)
async def test_transact_token_makes_a_retry_apply_once(
    backend: Backend, unique: Callable[[], str]
) -> None:
    """A retry after a lost answer (same token) succeeds and applies nothing again, though
    its condition no longer holds: DynamoDB's ClientRequestToken."""
    pk, token = unique(), unique()
    writes: list[TxWrite] = [
        Update(pk, "n", add={"count": 1}, condition=Missing("pk")),
        Put(pk, "m", {"v": 1}),
    ]
    await backend.table.transact(writes, token=token)
    await backend.table.transact(writes, token=token)
    assert (await backend.table.get(pk, "n") or {})["count"] == 1
    with pytest.raises(ConditionFailed):
        await backend.table.transact(writes, token=unique())


async def test_item_over_the_size_limit_is_rejected(
    backend: Backend, unique: Callable[[], str]
) -> None:
    pk = unique()
    with pytest.raises(Rejected):
        await backend.table.put(pk, "big", {"v": "x" * 410_000})
    await backend.table.put(pk, "item", {"v": "x" * 300_000})
    with pytest.raises(Rejected):
        await backend.table.update(Update(pk, "item", set_={"w": "y" * 150_000}))
    assert (await backend.table.get(pk, "item") or {}).get("w") is None
