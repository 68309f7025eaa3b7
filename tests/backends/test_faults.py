"""The fault injector over the embedded backend: each fault fires at its rate, does what it
says, is counted, and is reproducible from its seed."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cmr.backends import faults
from cmr.backends.base import Backend, Present, Put, Queues, Received, Table, TxWrite, Update
from cmr.backends.embedded import embedded_backend
from cmr.backends.faults import FaultPlan, FaultyBackend, inject
from cmr.backends.middleware import LayerBlobs, LayerQueues, LayerTable
from cmr.errors import BackendError, ConditionFailed, Throttled, UsageError
from cmr.fileurls import file_url

Make = Callable[[FaultPlan], FaultyBackend]


def embedded(root: Path) -> Backend:
    return embedded_backend(root / "scratch")


def inner_queues(b: Backend) -> Queues:
    """The queues beneath the fault injector (the embedded ones, counted)."""
    assert isinstance(b.queues, LayerQueues)
    return b.queues.inner


def inner_table(b: Backend) -> Table:
    assert isinstance(b.table, LayerTable)
    return b.table.inner


def fault_rng(b: Backend) -> random.Random:
    assert isinstance(b, FaultyBackend)
    return b.faults.rng


def near(count: int, n: int, p: float) -> bool:
    """count is within 4 standard deviations of n * p (the seeds are fixed, so never flaky)."""
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    made: list[FaultyBackend] = []

    def build(plan: FaultPlan) -> FaultyBackend:
        b = inject(embedded(tmp_path / f"b{len(made)}"), plan)
        made.append(b)
        return b

    yield build
    for b in made:
        await b.close()


def test_plan_describe_rebuilds_the_plan() -> None:
    plan = FaultPlan.random(17)
    assert plan == FaultPlan.random(17)
    assert plan != FaultPlan.random(18)
    assert str(plan) == plan.describe()
    assert eval(plan.describe(), {"FaultPlan": FaultPlan}) == plan
    assert FaultPlan(seed=3).describe() == "FaultPlan(seed=3)"
    assert FaultPlan(seed=3, reorder=0.5).describe() == "FaultPlan(seed=3, reorder=0.5)"


def test_random_plans_stay_moderate() -> None:
    for seed in range(50):
        p = FaultPlan.random(seed)
        assert p.seed == seed
        for rate in (
            p.duplicate_delivery,
            p.lease_loss,
            p.empty_receive,
            p.reorder,
            p.stale_read,
            p.duplicate_send,
        ):
            assert 0 <= rate <= 0.2
        assert 0 <= p.delay_max_s <= 0.02
        assert 0 <= p.throttle <= 0.05
        assert 0 <= p.server_error <= 0.05


@pytest.mark.parametrize(
    "bad", [{"throttle": 1.5}, {"reorder": -0.1}, {"delay_max_s": -1.0}, {"stale_read": math.nan}]
)
def test_plan_rejects_impossible_knobs(bad: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        FaultPlan(seed=1, **bad)


async def test_wrappers_share_counters_and_limits(tmp_path: Path) -> None:
    raw = embedded(tmp_path)
    b = inject(raw, FaultPlan(seed=1))
    assert isinstance(b, Backend)
    assert (b.name, b.scratch) == (raw.name, raw.scratch)
    inner = inner_queues(b)
    assert b.queues.calls is inner.calls
    assert isinstance(b.blobs, LayerBlobs)
    assert b.blobs.calls is b.blobs.inner.calls
    assert b.table.calls is inner_table(b).calls
    assert b.queues.max_message_bytes == inner.max_message_bytes
    b.queues.max_message_bytes = 1000
    assert inner.max_message_bytes == 1000
    assert isinstance(b, FaultyBackend)
    # One injector for the three services: one counter.
    assert faults.injected(b) is b.injected is b.faults.injected
    assert faults.injected(raw) == Counter()
    await b.close()


async def script(
    b: Backend, root: Path, errors: tuple[type[Exception], ...] = (BackendError,)
) -> list[Any]:
    """Touch every method of every service once or more; the trace records every answer."""
    trace: list[Any] = []

    async def step(name: str, call: Awaitable[Any]) -> None:
        try:
            trace.append((name, await call))
        except errors as exc:
            trace.append((name, type(exc).__name__))

    q = "jobs-q"
    await step("create", b.queues.create(q, visibility_s=30))
    await step("list", b.queues.list("jobs"))
    for i in range(6):
        await step("send", b.queues.send(q, [f"m{i}.{j}".encode() for j in range(5)]))
    for _ in range(6):
        await step("receive", b.queues.receive(q, max_messages=4))
        await step("counts", b.queues.counts(q))
    got: list[Received] = []
    try:
        got = await b.queues.receive(q, max_messages=10)
    except BackendError as exc:
        trace.append(("receive", type(exc).__name__))
    trace.append(("receive", got))
    await step("change_visibility", b.queues.change_visibility(q, [m.receipt for m in got], 60))
    await step("delete_messages", b.queues.delete_messages(q, [m.receipt for m in got]))
    await step("counts", b.queues.counts(q))
    url = file_url(root / "blobs" / "x")
    await step("put", b.blobs.put(url, b"hello"))
    await step("get", b.blobs.get(url))
    await step("get_range", b.blobs.get_range(url, 1, 3))
    await step("size", b.blobs.size(url))

    async def sizes() -> list[int]:  # URLs differ between runs, sizes do not
        return [i.size for i in await b.blobs.list(file_url(root / "blobs") + "/")]

    await step("blob list", sizes())
    await step("upload", b.blobs.upload_file(str(root / "blobs" / "x"), url + "2"))
    await step("download", b.blobs.download_file(url + "2", str(root / "dl")))
    await step("delete_prefix", b.blobs.delete_prefix(file_url(root / "blobs") + "/"))
    for i in range(8):
        await step("tput", b.table.put("p", f"s{i % 3}", {"v": i}))
        await step("tupdate", b.table.update(Update("p", "s0", add={"n": 1})))
        await step("tget", b.table.get("p", f"s{i % 3}", consistent=i % 2 == 0))
        await step("tquery", b.table.query("p", consistent=i % 2 == 1))
    await step("tcond", b.table.put("p", "s0", {"v": 0}, condition=Present("nope")))
    await step("tdelete", b.table.delete("p", "s1"))
    await step("delete", b.queues.delete(q))
    return trace


async def test_zero_plan_behaves_like_the_backend(tmp_path: Path, make: Make) -> None:
    plain = embedded(tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    wrapped = make(FaultPlan(seed=99))
    (tmp_path / "wrapped").mkdir()
    expected = await script(plain, tmp_path / "plain")
    assert await script(wrapped, tmp_path / "wrapped") == expected
    assert wrapped.calls() == plain.calls()
    assert faults.injected(wrapped) == Counter()


async def test_same_seed_same_faults(tmp_path: Path, make: Make) -> None:
    # Lease cuts land at wall-clock times, so only they are left out of an exact replay.
    plan = FaultPlan(
        seed=7,
        duplicate_delivery=0.2,
        empty_receive=0.2,
        reorder=0.3,
        delay_max_s=0.001,
        throttle=0.1,
        server_error=0.1,
        stale_read=0.5,
        duplicate_send=0.2,
    )
    runs = []
    for i in range(2):
        b = make(plan)
        (tmp_path / f"r{i}").mkdir()
        runs.append((await script(b, tmp_path / f"r{i}"), faults.injected(b), b.calls()))
    assert runs[0] == runs[1]
    assert set(runs[0][1]) == {
        "delay",
        "throttle",
        "server_error_before",
        "server_error_after",
        "empty_receive",
        "reorder",
        "duplicate_delivery",
        "stale_read",
        "duplicate_send",
    }
    other = make(dataclasses.replace(plan, seed=8))
    (tmp_path / "r2").mkdir()
    assert await script(other, tmp_path / "r2") != runs[0][0]


async def draw_script(b: Backend, root: Path) -> list[Any]:
    """``script``, then the methods it leaves out; any failure is an answer (a blob whose put
    failed cannot be uploaded from)."""
    trace = await script(b, root, errors=(BackendError, OSError))

    async def step(name: str, call: Awaitable[Any]) -> None:
        try:
            trace.append((name, await call))
        except (BackendError, OSError) as exc:
            trace.append((name, type(exc).__name__))

    url = file_url(root / "more" / "y")
    await step("put_if", b.blobs.put_if(url, b"one", etag=None))
    await step("get_with_etag", b.blobs.get_with_etag(url))
    await step("put_if again", b.blobs.put_if(url, b"two", etag="f" * 32))
    await step("copy", b.blobs.copy(url, url + ".copy"))
    await step("copy missing", b.blobs.copy(url + ".nope", url + ".copy2"))
    await step("blob delete", b.blobs.delete([url, url + ".copy"]))
    for i in range(4):
        writes: list[TxWrite] = [Put("t", f"a{i}", {"v": i}), Update("t", "n", add={"n": 1})]
        await step("transact", b.table.transact(writes, token=f"tok{i}"))
        await step("tquery", b.table.query("t", consistent=False))
        await step("tget", b.table.get("t", "n", consistent=False))
    return trace


# The seeded draw order, recorded by running draw_script (twice, identical) on the fault
# injector as it was before the middleware seam (commit 4477b33, hand-written
# FaultyQueues/Blobs/Table; the next number from its shared ``b.queues._chaos.rng``): per
# seed, the faults injected by kind, the requests made, a digest of every answer, and the
# injector's next random number (so every draw is accounted for). Lease cuts land at
# wall-clock times, so that fault is off (its draws are still made).
DRAWS: dict[int, tuple[dict[str, int], dict[str, int], str, float]] = {
    1: (
        {
            "delay": 85,
            "duplicate_delivery": 4,
            "duplicate_send": 2,
            "server_error_after": 1,
            "stale_read": 1,
            "throttle": 2,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 19,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 12,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 7,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 4,
            "sqs.ChangeMessageVisibilityBatch": 5,
            "sqs.CreateQueue": 1,
            "sqs.DeleteMessageBatch": 1,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 7,
            "sqs.ListQueues": 1,
            "sqs.ReceiveMessage": 7,
            "sqs.SendMessageBatch": 6,
        },
        "58868b4d031f5da5",
        0.5714150405846471,
    ),
    2: (
        {
            "delay": 85,
            "duplicate_delivery": 4,
            "duplicate_send": 2,
            "empty_receive": 1,
            "server_error_after": 3,
            "server_error_before": 4,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 19,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 12,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 7,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 4,
            "sqs.ChangeMessageVisibilityBatch": 2,
            "sqs.CreateQueue": 1,
            "sqs.DeleteMessageBatch": 1,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 5,
            "sqs.ListQueues": 1,
            "sqs.ReceiveMessage": 7,
            "sqs.SendMessageBatch": 6,
        },
        "c2e634dcab94acc7",
        0.0950454098784631,
    ),
    3: (
        {
            "delay": 85,
            "duplicate_delivery": 4,
            "duplicate_send": 0,
            "reorder": 1,
            "server_error_before": 3,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 20,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 12,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 8,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 3,
            "sqs.ChangeMessageVisibilityBatch": 5,
            "sqs.CreateQueue": 1,
            "sqs.DeleteMessageBatch": 1,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 6,
            "sqs.ReceiveMessage": 7,
            "sqs.SendMessageBatch": 6,
        },
        "343c143dd58f5119",
        0.7272893273241281,
    ),
    7: (
        {
            "delay": 85,
            "duplicate_delivery": 0,
            "duplicate_send": 6,
            "empty_receive": 1,
            "throttle": 5,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 20,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 11,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 7,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 4,
            "sqs.ChangeMessageVisibilityBatch": 1,
            "sqs.CreateQueue": 1,
            "sqs.DeleteMessageBatch": 1,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 4,
            "sqs.ListQueues": 1,
            "sqs.ReceiveMessage": 7,
            "sqs.SendMessageBatch": 6,
        },
        "b9826489b7affd6c",
        0.07747181951780069,
    ),
    42: (
        {
            "delay": 85,
            "duplicate_send": 1,
            "server_error_before": 1,
            "stale_read": 1,
            "throttle": 6,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 19,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 10,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 8,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 3,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 7,
            "sqs.ListQueues": 1,
            "sqs.ReceiveMessage": 7,
        },
        "3ffb4f50c1145f6f",
        0.47318618590932626,
    ),
    1234: (
        {
            "delay": 85,
            "duplicate_send": 10,
            "empty_receive": 1,
            "server_error_before": 2,
            "stale_read": 3,
            "throttle": 1,
        },
        {
            "dynamodb.DeleteItem": 1,
            "dynamodb.GetItem": 18,
            "dynamodb.PutItem": 9,
            "dynamodb.Query": 12,
            "dynamodb.TransactWriteItems": 4,
            "dynamodb.UpdateItem": 8,
            "s3.CopyObject": 2,
            "s3.DeleteObjects": 2,
            "s3.GetObject": 4,
            "s3.HeadObject": 1,
            "s3.ListObjectsV2": 1,
            "s3.PutObject": 4,
            "sqs.DeleteQueue": 1,
            "sqs.GetQueueAttributes": 7,
            "sqs.ListQueues": 1,
            "sqs.ReceiveMessage": 7,
        },
        "0047677f165cb5fb",
        0.315144257602774,
    ),
}


@pytest.mark.parametrize("seed", sorted(DRAWS))
async def test_seeded_draw_order_is_stable(tmp_path: Path, make: Make, seed: int) -> None:
    b = make(dataclasses.replace(FaultPlan.random(seed), lease_loss=0.0))
    (tmp_path / "run").mkdir()
    trace = await draw_script(b, tmp_path / "run")
    digest = hashlib.sha256(repr(trace).encode()).hexdigest()[:16]
    got = (dict(faults.injected(b)), dict(b.calls()), digest, fault_rng(b).random())
    assert got == DRAWS[seed]


def every_call(b: Backend, root: Path) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    url = file_url(root / "b")
    return [
        ("queues.create", lambda: b.queues.create("q", visibility_s=1)),
        ("queues.delete", lambda: b.queues.delete("q")),
        ("queues.list", lambda: b.queues.list("")),
        ("queues.send", lambda: b.queues.send("q", [b"x"])),
        ("queues.receive", lambda: b.queues.receive("q")),
        ("queues.delete_messages", lambda: b.queues.delete_messages("q", ["r"])),
        ("queues.change_visibility", lambda: b.queues.change_visibility("q", ["r"], 0)),
        ("queues.counts", lambda: b.queues.counts("q")),
        ("blobs.put", lambda: b.blobs.put(url, b"x")),
        ("blobs.get", lambda: b.blobs.get(url)),
        ("blobs.get_range", lambda: b.blobs.get_range(url, 0, 1)),
        ("blobs.size", lambda: b.blobs.size(url)),
        ("blobs.list", lambda: b.blobs.list(url)),
        ("blobs.delete_prefix", lambda: b.blobs.delete_prefix(url)),
        ("blobs.upload_file", lambda: b.blobs.upload_file(str(root / "f"), url)),
        ("blobs.download_file", lambda: b.blobs.download_file(url, str(root / "g"))),
        ("table.put", lambda: b.table.put("p", "s", {"v": 1})),
        ("table.get", lambda: b.table.get("p", "s")),
        ("table.query", lambda: b.table.query("p")),
        ("table.update", lambda: b.table.update(Update("p", "s", add={"n": 1}))),
        ("table.delete", lambda: b.table.delete("p", "s")),
    ]


async def test_throttling_hits_every_method_before_it_runs(tmp_path: Path, make: Make) -> None:
    b = make(FaultPlan(seed=1, throttle=1.0))
    calls = every_call(b, tmp_path)
    for name, call in calls:
        with pytest.raises(Throttled, match="throttled \\(injected\\)"):
            await call()
        assert b.calls() == Counter(), name
    assert not (tmp_path / "b").exists()
    assert faults.injected(b) == Counter(throttle=len(calls))


async def test_server_errors_hit_every_method(tmp_path: Path, make: Make) -> None:
    b = make(FaultPlan(seed=1, server_error=1.0))
    for _, call in every_call(b, tmp_path):
        with pytest.raises(BackendError, match="500 InternalError \\(injected") as info:
            await call()
        assert type(info.value) is BackendError
    n = faults.injected(b)
    assert n["server_error_before"] > 0
    assert n["server_error_after"] > 0


async def test_throttle_rate_and_nothing_done(make: Make) -> None:
    b = make(FaultPlan(seed=2, throttle=0.3))
    refused = []
    for i in range(400):
        try:
            await b.table.put("p", f"k{i}", {"v": i})
        except Throttled:
            refused.append(f"k{i}")
    assert near(len(refused), 400, 0.3)
    assert faults.injected(b)["throttle"] == len(refused)
    stored = {it["sk"] for it in await inner_table(b).query("p")}
    assert stored.isdisjoint(refused)
    assert len(stored) == 400 - len(refused)
    assert b.calls()["dynamodb.PutItem"] == 400 - len(refused)


async def test_server_error_after_a_write_applied_it(make: Make) -> None:
    b = make(FaultPlan(seed=3, server_error=0.4))
    failed = []
    for i in range(400):
        try:
            await b.table.put("p", f"k{i}", {"v": i})
        except BackendError:
            failed.append(f"k{i}")
    n = faults.injected(b)
    assert near(len(failed), 400, 0.4)
    assert n["server_error_before"] + n["server_error_after"] == len(failed)
    assert near(n["server_error_after"], len(failed), 0.5)
    stored = {it["sk"] for it in await inner_table(b).query("p")}
    assert len(stored & set(failed)) == n["server_error_after"] > 0


async def test_server_error_after_send_enqueued_it(make: Make) -> None:
    b = make(FaultPlan(seed=4, server_error=0.5))
    inner = inner_queues(b)
    await inner.create("q", visibility_s=1)
    failed = 0
    for i in range(100):
        try:
            await b.queues.send("q", [str(i).encode()])
        except BackendError:
            failed += 1
    n = faults.injected(b)
    assert failed == n["server_error_before"] + n["server_error_after"]
    assert (await inner.counts("q"))[0] == 100 - n["server_error_before"]


async def test_reads_never_fail_after_the_fact(make: Make) -> None:
    b = make(FaultPlan(seed=5, server_error=1.0))
    for _ in range(50):
        with pytest.raises(BackendError):
            await b.table.get("p", "s")
        with pytest.raises(BackendError):
            await b.queues.counts("q")
    assert faults.injected(b) == Counter(server_error_before=100)


async def test_condition_failed_is_an_answer_not_a_fault(make: Make) -> None:
    b = make(FaultPlan(seed=6, server_error=1.0))
    await inner_table(b).put("p", "s", {"v": 1})
    outcomes: Counter[str] = Counter()
    for _ in range(200):
        try:
            await b.table.put("p", "s", {"v": 2}, condition=Present("nope"))
        except BackendError as exc:
            outcomes[type(exc).__name__] += 1
    assert near(outcomes["ConditionFailed"], 200, 0.5)
    assert outcomes["BackendError"] == faults.injected(b)["server_error_before"]
    assert faults.injected(b)["server_error_after"] == 0
    assert await inner_table(b).get("p", "s") == {"pk": "p", "sk": "s", "v": 1}
    quiet = make(FaultPlan(seed=6, stale_read=1.0, delay_max_s=0.001))
    await quiet.table.put("p", "s", {"v": 1})
    with pytest.raises(ConditionFailed):
        await quiet.table.update(Update("p", "s", set_={"v": 2}, condition=Present("nope")))


async def test_duplicate_delivery_reaches_the_next_receiver(make: Make) -> None:
    b = make(FaultPlan(seed=7, duplicate_delivery=0.25))
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [str(i).encode() for i in range(200)])
    seen: Counter[str] = Counter()
    while got := await b.queues.receive("q"):
        seen.update(m.message_id for m in got)
    deliveries = sum(seen.values())
    assert len(seen) == 200
    assert deliveries - 200 == faults.injected(b)["duplicate_delivery"]
    assert near(deliveries - 200, deliveries, 0.25)
    assert await b.queues.counts("q") == (0, 200)


async def test_a_duplicate_delivery_makes_the_first_receipt_stale(make: Make) -> None:
    b = make(FaultPlan(seed=8, duplicate_delivery=1.0))
    inner = inner_queues(b)
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [b"x"])
    [first] = await b.queues.receive("q")
    [second] = await inner.receive("q")
    assert (second.message_id, second.receive_count) == (first.message_id, 2)
    await b.queues.delete_messages("q", [first.receipt])
    assert await inner.counts("q") == (0, 1)
    await b.queues.delete_messages("q", [second.receipt])
    assert await inner.counts("q") == (0, 0)


async def test_a_lost_lease_makes_the_message_reappear_quickly(make: Make) -> None:
    b = make(FaultPlan(seed=9, lease_loss=1.0))
    inner = inner_queues(b)
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [str(i).encode() for i in range(5)])
    got = await b.queues.receive("q")
    assert len(got) == 5
    assert await inner.counts("q") == (0, 5)
    await asyncio.sleep(faults.LEASE_CUT_MAX_S + 0.1)
    assert await inner.counts("q") == (5, 0)
    again = await inner.receive("q")
    assert {m.message_id for m in again} == {m.message_id for m in got}
    assert {m.receive_count for m in again} == {2}
    assert faults.injected(b) == Counter(lease_loss=5)


async def test_lease_loss_rate(make: Make) -> None:
    b = make(FaultPlan(seed=10, lease_loss=0.3))
    inner = inner_queues(b)
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [str(i).encode() for i in range(300)])
    received = 0  # a message whose lease was cut early may be received (and cut) again
    while got := await b.queues.receive("q"):
        received += len(got)
    await asyncio.sleep(faults.LEASE_CUT_MAX_S + 0.1)
    cut = faults.injected(b)["lease_loss"]
    assert near(cut, received, 0.3)
    visible, in_flight = await inner.counts("q")
    assert visible + in_flight == 300
    assert 0 < visible <= cut  # cut messages are visible again, unless received again


async def test_close_cancels_pending_lease_cuts(make: Make) -> None:
    b = make(FaultPlan(seed=11, lease_loss=1.0))
    inner = inner_queues(b)
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [b"a", b"b"])
    async with b:
        assert len(await b.queues.receive("q")) == 2
    await asyncio.sleep(faults.LEASE_CUT_MAX_S + 0.1)
    assert await inner.counts("q") == (0, 2)


async def test_a_lease_cut_on_a_deleted_queue_is_harmless(make: Make) -> None:
    b = make(FaultPlan(seed=12, lease_loss=1.0))
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [b"a"])
    [m] = await b.queues.receive("q")
    await b.queues.delete_messages("q", [m.receipt])
    await b.queues.delete("q")
    await asyncio.sleep(faults.LEASE_CUT_MAX_S + 0.1)  # the cut runs and finds nothing


async def test_empty_receives(make: Make) -> None:
    b = make(FaultPlan(seed=13, empty_receive=0.3))
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [b"x"])
    empties = 0
    for _ in range(300):
        got = await b.queues.receive("q", visibility_s=0)  # stays visible for the next try
        empties += not got
    assert empties == faults.injected(b)["empty_receive"]
    assert near(empties, 300, 0.3)
    assert b.calls()["sqs.ReceiveMessage"] == 300


async def test_reorder_shuffles_and_skips_the_oldest(make: Make) -> None:
    b = make(FaultPlan(seed=14, reorder=1.0))
    shuffled = skipped = 0
    for t in range(40):
        q = f"q{t}"
        await b.queues.create(q, visibility_s=30)
        await b.queues.send(q, [bytes([i]) for i in range(10)])
        got = [m.body[0] for m in await b.queues.receive(q)]
        assert got
        assert (await inner_queues(b).counts(q)) == (10 - len(got), len(got))
        shuffled += got != sorted(got)
        skipped += 0 not in got
        await b.queues.send(q, [b"more", b"and more"])
        one = await b.queues.receive(q, max_messages=1)
        assert len(one) == 1
    assert shuffled > 10
    assert skipped > 10
    assert faults.injected(b)["reorder"] >= 40


async def test_reorder_rate(make: Make) -> None:
    b = make(FaultPlan(seed=15, reorder=0.3))
    await b.queues.create("q", visibility_s=30)
    await b.queues.send("q", [bytes([i]) for i in range(10)])
    for _ in range(300):
        assert await b.queues.receive("q", visibility_s=0)
    assert near(faults.injected(b)["reorder"], 300, 0.3)


async def test_duplicate_send_enqueues_twice(make: Make) -> None:
    b = make(FaultPlan(seed=16, duplicate_send=0.25))
    inner = inner_queues(b)
    await b.queues.create("q", visibility_s=30)
    for i in range(40):
        await b.queues.send("q", [f"{i}.{j}".encode() for j in range(10)])
    bodies: Counter[bytes] = Counter()
    while got := await inner.receive("q"):
        bodies.update(m.body for m in got)
    twice = faults.injected(b)["duplicate_send"]
    assert len(bodies) == 400
    assert sum(bodies.values()) == 400 + twice
    assert set(bodies.values()) <= {1, 2}
    assert near(twice, 400, 0.25)


async def test_delays(make: Make) -> None:
    b = make(FaultPlan(seed=17, delay_max_s=0.02))
    start = time.monotonic()
    for _ in range(50):
        await b.table.get("p", "s")
    assert time.monotonic() - start >= 0.3  # mean 0.5 s, sd 0.04 s
    assert faults.injected(b)["delay"] == 50


async def test_stale_reads_only_when_eventual(make: Make) -> None:
    b = make(FaultPlan(seed=18, stale_read=0.5))
    await b.table.put("p", "s", {"v": 1})
    await b.table.update(Update("p", "s", set_={"v": 2}))
    await b.table.put("p", "s", {"v": 3})
    for _ in range(200):
        assert await b.table.get("p", "s") == {"pk": "p", "sk": "s", "v": 3}
        assert await b.table.query("p") == [{"pk": "p", "sk": "s", "v": 3}]
    assert faults.injected(b)["stale_read"] == 0
    seen: Counter[int | None] = Counter()
    for _ in range(400):
        item = await b.table.get("p", "s", consistent=False)
        seen[None if item is None else item["v"]] += 1
    assert set(seen) == {None, 1, 2, 3}  # None: before its first write, as a replica lags
    assert seen[3] + faults.injected(b)["stale_read"] == 400
    assert near(400 - seen[3], 400, 0.5)


async def test_stale_queries_see_one_earlier_point(make: Make) -> None:
    b = make(FaultPlan(seed=19, stale_read=1.0))
    await b.table.put("p", "a", {"v": 1})
    await b.table.put("p", "b", {"v": 1})
    await b.table.update(Update("p", "a", set_={"v": 2}))
    await b.table.update(Update("p", "b", set_={"v": 2}))
    await b.table.delete("p", "a")
    await b.table.put("other", "a", {"v": 9})
    history = [{}, {"a": 1}, {"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 2, "b": 2}, {"b": 2}]
    states = []
    for _ in range(200):
        rows = await b.table.query("p", consistent=False)
        assert [r["sk"] for r in rows] == sorted(r["sk"] for r in rows)
        states.append({r["sk"]: r["v"] for r in rows})
    assert all(s in history[:-1] for s in states)  # stale_read=1.0: never the latest point
    assert all(s in states for s in history[:-1])
    assert await b.table.query("p") == [{"pk": "p", "sk": "b", "v": 2}]
    assert await b.table.get("p", "a") is None
    gone = [await b.table.get("p", "a", consistent=False) for _ in range(50)]
    assert {None if g is None else g["v"] for g in gone} == {None, 1, 2}


async def test_items_written_elsewhere_are_never_stale(make: Make) -> None:
    b = make(FaultPlan(seed=20, stale_read=1.0))
    await inner_table(b).put("p", "s", {"v": 1})
    await inner_table(b).put("p", "s", {"v": 2})
    for _ in range(20):
        assert await b.table.get("p", "s", consistent=False) == {"pk": "p", "sk": "s", "v": 2}
        assert await b.table.query("p", consistent=False) == [{"pk": "p", "sk": "s", "v": 2}]
    assert faults.injected(b)["stale_read"] == 0


async def test_stale_reads_are_copies(make: Make) -> None:
    b = make(FaultPlan(seed=21, stale_read=1.0))
    await b.table.put("p", "s", {"v": [1]})
    await b.table.put("p", "s", {"v": [2]})
    old = await b.table.get("p", "s", consistent=False)
    while old is None:
        old = await b.table.get("p", "s", consistent=False)
    old["v"].append(99)
    again = [await b.table.get("p", "s", consistent=False) for _ in range(20)]
    assert all(a is None or a["v"] == [1] for a in again)


async def test_faults_share_one_counter_across_services(make: Make, tmp_path: Path) -> None:
    b = make(FaultPlan(seed=22, throttle=1.0))
    for _, call in every_call(b, tmp_path)[::8]:
        with pytest.raises(Throttled):
            await call()
    assert faults.injected(b) == Counter(throttle=3)
