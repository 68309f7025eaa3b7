"""The middleware seam: order of middlewares, the calls they see, and request counting
charged exactly as the embedded backend charged it inline before the seam."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from cmr.backends.base import Backend, Check, Present, Put, Update
from cmr.backends.embedded import embedded_backend
from cmr.backends.middleware import Call, Middleware, Proceed, wrap
from cmr.errors import BackendError, UsageError
from cmr.fileurls import file_url


async def count_script(be: Backend, root: Path) -> None:
    """Every method, batches of several requests, and calls that fail before or after a
    request is counted."""

    async def quiet(aw: Awaitable[Any]) -> None:
        with contextlib.suppress(BackendError, UsageError, OSError):
            await aw

    q = be.queues
    await q.create("q", visibility_s=30)
    await q.list("")
    await q.send("q", [b"x%d" % i for i in range(25)])
    await q.send("q", [])
    await quiet(q.send("missing", [b"x"]))
    await quiet(q.send("q", [b"x" * (q.max_message_bytes + 1)]))
    got = await q.receive("q", max_messages=10)
    got += await q.receive("q", max_messages=10)
    await quiet(q.receive("missing"))
    await q.change_visibility("q", [m.receipt for m in got[:11]], 60)
    await q.delete_messages("q", [m.receipt for m in got])
    await quiet(q.delete_messages("missing", ["r"]))
    await q.counts("q")
    await q.delete("q")
    b = be.blobs
    u = file_url(root / "blobs") + "/"
    await b.put(u + "a", b"aaa")
    await b.put_if(u + "b", b"b", etag=None)
    await quiet(b.put_if(u + "b", b"b", etag=None))
    await b.get(u + "a")
    await b.get_with_etag(u + "a")
    await quiet(b.get(u + "nope"))
    await b.get_range(u + "a", 0, 2)
    await b.size(u + "a")
    await b.copy(u + "a", u + "c")
    await quiet(b.copy(u + "nope", u + "d"))
    await b.list(u)
    (root / "f").write_bytes(b"file")
    await b.upload_file(str(root / "f"), u + "f")
    await quiet(b.upload_file(str(root / "nofile"), u + "g"))
    await b.download_file(u + "f", str(root / "g"))
    await b.delete([u + f"k{i}" for i in range(1001)])
    await b.delete([])
    await b.delete_prefix(u)
    t = be.table
    await t.put("p", "a", {"v": 1})
    await quiet(t.put("p", "a", {"v": 1}, condition=Present("nope")))
    await t.get("p", "a")
    await t.query("p", prefix="a")
    await t.update(Update("p", "a", add={"n": 1}))
    await quiet(
        t.transact(
            [Put("p", "b", {}), Update("p", "a", set_={"w": 2}), Check("p", "c", Present("v"))],
            token="t0",
        )
    )
    await t.transact([Put("p", "b", {}), Update("p", "a", set_={"w": 2})], token="t1")
    await t.transact([Put("p", "b", {})], token="t1")
    await t.delete("p", "b")


# Recorded by running count_script on the embedded backend before the seam (commit 4477b33,
# where each embedded method counted its own requests inline).
COUNTS_BEFORE_THE_SEAM = {
    "dynamodb.DeleteItem": 1,
    "dynamodb.GetItem": 1,
    "dynamodb.PutItem": 2,
    "dynamodb.Query": 1,
    "dynamodb.TransactWriteItems": 3,
    "dynamodb.UpdateItem": 1,
    "s3.CopyObject": 2,
    "s3.DeleteObjects": 3,
    "s3.GetObject": 5,
    "s3.HeadObject": 1,
    "s3.ListObjectsV2": 1,
    "s3.PutObject": 5,
    "sqs.ChangeMessageVisibilityBatch": 2,
    "sqs.CreateQueue": 1,
    "sqs.DeleteMessageBatch": 3,
    "sqs.DeleteQueue": 1,
    "sqs.GetQueueAttributes": 1,
    "sqs.ListQueues": 1,
    "sqs.ReceiveMessage": 3,
    "sqs.SendMessageBatch": 3,
}


async def test_counting_charges_what_the_embedded_backend_charged(tmp_path: Path) -> None:
    be = embedded_backend(tmp_path / "scratch")
    await count_script(be, tmp_path)
    assert be.calls() == Counter(COUNTS_BEFORE_THE_SEAM)


class Log(Middleware):
    """Records the calls it sees, tagged, then passes them on."""

    def __init__(self, tag: str, seen: list[tuple[str, Call]]) -> None:
        self.tag = tag
        self.seen = seen

    async def around(self, call: Call, proceed: Proceed) -> Any:
        self.seen.append((self.tag, call))
        return await proceed(call)


class DoubleSend(Middleware):
    """Changes a call on its way down: every send is sent twice."""

    async def around(self, call: Call, proceed: Proceed) -> Any:
        if call.method == "send":
            name, bodies = call.args
            return await proceed(call.replace(name, [*bodies, *bodies]))
        return await proceed(call)


async def test_first_middleware_is_outermost_and_sees_typed_calls(tmp_path: Path) -> None:
    seen: list[tuple[str, Call]] = []
    raw = embedded_backend(tmp_path / "scratch")
    be = wrap(raw, Log("outer", seen), DoubleSend(), Log("inner", seen))
    assert (be.name, be.scratch, be.capabilities) == (raw.name, raw.scratch, raw.capabilities)
    assert be.queues.calls is raw.queues.calls
    await be.queues.create("q", visibility_s=30)
    await be.queues.send("q", [b"a"] * 11)
    assert await be.queues.counts("q") == (22, 0)
    await be.table.put("p", "s", {"v": 1})
    await be.blobs.delete([])
    outer = [c for tag, c in seen if tag == "outer"]
    inner = [c for tag, c in seen if tag == "inner"]
    assert [tag for tag, _ in seen[:2]] == ["outer", "inner"]
    send = outer[1]
    assert (send.service, send.method, send.op, send.target) == (
        "queues",
        "send",
        "sqs.SendMessageBatch",
        "q",
    )
    assert (send.writes, send.requests, len(send.args[1])) == (True, 2, 11)
    assert len(inner[1].args[1]) == 22  # changed by the middleware between them
    assert (outer[2].op, outer[2].writes) == ("sqs.GetQueueAttributes", False)
    put = outer[3]
    assert (put.op, put.target, put.kwargs) == ("dynamodb.PutItem", "p/s", {"condition": None})
    assert (outer[4].op, outer[4].requests) == ("s3.DeleteObjects", 0)
    assert raw.calls()["sqs.SendMessageBatch"] == 3  # 22 bodies reached the counted backend
