"""One seam around the three services: every call as a typed record, through middlewares.

``wrap(backend, a, b)`` returns the backend with each call going through ``a``, then ``b``,
then the services: ``a`` is outermost. A middleware sees a :class:`Call` (which service and
method, its arguments, the AWS operation it is charged as, whether it changes state, what
it targets) and a ``proceed`` that runs the rest of the chain; it may change the call, run
it several times, not at all, or add calls of its own on the services beneath it (given to
``bind``). Retries (:mod:`cmr.backends.retry`), fault injection (:mod:`cmr.backends.faults`),
request counting (:class:`Counting`) and the fleet simulator's latency are middlewares.

The wrapper classes below implement the three protocols once: each method builds its call
and nothing else, so a middleware never repeats the services' signatures. There are no
global middlewares (dramatiq's idea, without its broker-wide registry): a backend has the
ones it was wrapped with.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections import Counter
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cmr import billing, usage
from cmr.backends.base import (
    Backend,
    BlobInfo,
    Blobs,
    Condition,
    Item,
    Queues,
    Received,
    Table,
    TxWrite,
    Update,
)

Service = Literal["queues", "blobs", "table"]


@dataclass(frozen=True)
class Call:
    """One protocol call on its way to the service."""

    service: Service
    method: str  # the protocol's name for it: "send", "put_if", "transact", ...
    args: tuple[Any, ...]  # positional arguments, as the protocol declares them
    kwargs: dict[str, Any]  # keyword-only arguments
    op: str  # the AWS operation it is charged as: "sqs.SendMessageBatch", ...
    writes: bool  # changes the service's state (a receive does: it leases messages)
    target: str  # the queue name, blob URL or "pk/sk" it is about: for messages and meters
    requests: int = 1  # requests it costs: batches are 10 messages or 1000 keys a request

    def replace(self, *args: Any, **kwargs: Any) -> Call:
        """The same call with these positional arguments (if any) and keywords changed."""
        return dataclasses.replace(self, args=args or self.args, kwargs={**self.kwargs, **kwargs})

    def __str__(self) -> str:
        return f"{self.op} {self.target}"


Proceed = Callable[[Call], Awaitable[Any]]


class Middleware:
    """Runs around every call of a wrapped backend. Override ``around``; the default passes
    the call on unchanged."""

    def bind(self, below: Backend) -> None:
        """Called once by ``wrap``, with the services beneath this middleware (for calls of
        its own that the middlewares above should not see, such as a fault's lease release).
        A middleware that keeps them serves one ``wrap``."""

    async def around(self, call: Call, proceed: Proceed) -> Any:
        return await proceed(call)


def batches(n: int, size: int) -> int:
    return (n + size - 1) // size


class _Layer:
    """One middleware over the services beneath it."""

    def __init__(self, middleware: Middleware, below: Backend) -> None:
        self.middleware = middleware
        self.below = below
        middleware.bind(below)

    async def run(self, call: Call) -> Any:
        return await self.middleware.around(call, self._proceed)

    async def _proceed(self, call: Call) -> Any:
        # The call names a protocol method; the services beneath implement the protocol.
        method = getattr(getattr(self.below, call.service), call.method)
        return await method(*call.args, **call.kwargs)


class LayerQueues:
    def __init__(self, layer: _Layer) -> None:
        self._layer = layer
        self.inner: Queues = layer.below.queues

        self.calls: Counter[str] = self.inner.calls  # the same object: one count per request

    @property
    def max_message_bytes(self) -> int:
        return self.inner.max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None:
        self.inner.max_message_bytes = value

    def _call(self, method: str, op: str, name: str, *args: Any, **kw: Any) -> Call:
        writes = method not in ("list", "counts")
        return Call("queues", method, (name, *args), kw, op, writes, name)

    async def create(self, name: str, *, visibility_s: int) -> None:
        await self._layer.run(
            self._call("create", "sqs.CreateQueue", name, visibility_s=visibility_s)
        )

    async def delete(self, name: str) -> None:
        await self._layer.run(self._call("delete", "sqs.DeleteQueue", name))

    async def list(self, prefix: str) -> builtins.list[str]:
        names: builtins.list[str] = await self._layer.run(
            self._call("list", "sqs.ListQueues", prefix)
        )
        return names

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        call = self._call("send", "sqs.SendMessageBatch", name, bodies)
        await self._layer.run(dataclasses.replace(call, requests=batches(len(bodies), 10)))

    async def receive(
        self,
        name: str,
        *,
        max_messages: int = 10,
        wait_s: float = 0,
        visibility_s: int | None = None,
    ) -> builtins.list[Received]:
        call = self._call(
            "receive",
            "sqs.ReceiveMessage",
            name,
            max_messages=max_messages,
            wait_s=wait_s,
            visibility_s=visibility_s,
        )
        got: builtins.list[Received] = await self._layer.run(call)
        return got

    async def delete_messages(self, name: str, receipts: Sequence[str]) -> None:
        call = self._call("delete_messages", "sqs.DeleteMessageBatch", name, receipts)
        await self._layer.run(dataclasses.replace(call, requests=batches(len(receipts), 10)))

    async def change_visibility(self, name: str, receipts: Sequence[str], seconds: int) -> None:
        call = self._call(
            "change_visibility", "sqs.ChangeMessageVisibilityBatch", name, receipts, seconds
        )
        await self._layer.run(dataclasses.replace(call, requests=batches(len(receipts), 10)))

    async def counts(self, name: str) -> tuple[int, int]:
        got: tuple[int, int] = await self._layer.run(
            self._call("counts", "sqs.GetQueueAttributes", name)
        )
        return got


class LayerBlobs:
    def __init__(self, layer: _Layer) -> None:
        self._layer = layer
        self.inner: Blobs = layer.below.blobs
        self.calls: Counter[str] = self.inner.calls

    async def _run(
        self, method: str, op: str, target: str, *args: Any, writes: bool, **kw: Any
    ) -> Any:
        return await self._layer.run(Call("blobs", method, args, kw, op, writes, target))

    async def put(self, url: str, data: bytes) -> None:
        await self._run("put", "s3.PutObject", url, url, data, writes=True)

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        new: str = await self._run("put_if", "s3.PutObject", url, url, data, writes=True, etag=etag)
        return new

    async def get(self, url: str) -> bytes:
        data: bytes = await self._run("get", "s3.GetObject", url, url, writes=False)
        return data

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        got: tuple[bytes, str] = await self._run(
            "get_with_etag", "s3.GetObject", url, url, writes=False
        )
        return got

    async def copy(self, src: str, dst: str) -> None:
        await self._run("copy", "s3.CopyObject", dst, src, dst, writes=True)

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        data: bytes = await self._run(
            "get_range", "s3.GetObject", url, url, start, end, writes=False
        )
        return data

    async def size(self, url: str) -> int:
        n: int = await self._run("size", "s3.HeadObject", url, url, writes=False)
        return n

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        found: builtins.list[BlobInfo] = await self._run(
            "list", "s3.ListObjectsV2", prefix, prefix, writes=False
        )
        return found

    async def delete_prefix(self, prefix: str) -> int:
        n: int = await self._run("delete_prefix", "s3.DeleteObjects", prefix, prefix, writes=True)
        return n

    async def delete(self, urls: Sequence[str]) -> None:
        call = Call(
            "blobs", "delete", (urls,), {}, "s3.DeleteObjects", True, urls[0] if urls else ""
        )
        await self._layer.run(dataclasses.replace(call, requests=batches(len(urls), 1000)))

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        await self._run("upload_file", "s3.PutObject", url, path, url, writes=True, frozen=frozen)

    async def upload_stream(
        self, url: str, chunks: AsyncIterable[bytes], *, size_hint: int = 0
    ) -> int:
        n: int = await self._run(
            "upload_stream", "s3.PutObject", url, url, chunks, writes=True, size_hint=size_hint
        )
        return n

    async def download_file(self, url: str, path: str) -> None:
        await self._run("download_file", "s3.GetObject", url, url, path, writes=False)


class LayerTable:
    def __init__(self, layer: _Layer) -> None:
        self._layer = layer
        self.inner: Table = layer.below.table
        self.calls: Counter[str] = self.inner.calls

    async def _run(
        self, method: str, op: str, target: str, *args: Any, writes: bool, **kw: Any
    ) -> Any:
        return await self._layer.run(Call("table", method, args, kw, op, writes, target))

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        await self._run(
            "put", "dynamodb.PutItem", f"{pk}/{sk}", pk, sk, item, writes=True, condition=condition
        )

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        found: Item | None = await self._run(
            "get", "dynamodb.GetItem", f"{pk}/{sk}", pk, sk, writes=False, consistent=consistent
        )
        return found

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> builtins.list[Item]:
        items: builtins.list[Item] = await self._run(
            "query",
            "dynamodb.Query",
            f"{pk}/{start or prefix}*",
            pk,
            writes=False,
            prefix=prefix,
            start=start,
            consistent=consistent,
        )
        return items

    async def update(self, write: Update) -> Item:
        target = f"{write.pk}/{write.sk}"
        new: Item = await self._run("update", "dynamodb.UpdateItem", target, write, writes=True)
        return new

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        await self._run(
            "delete", "dynamodb.DeleteItem", f"{pk}/{sk}", pk, sk, writes=True, condition=condition
        )

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        where = ", ".join(f"{w.pk}/{w.sk}" for w in writes[:3])
        await self._run(
            "transact", "dynamodb.TransactWriteItems", where, writes, writes=True, token=token
        )


def wrap(backend: Backend, *middlewares: Middleware) -> Backend:
    """The backend with every call going through ``middlewares``, the first outermost. Its
    other fields (name, scratch, capabilities; a FaultyBackend's plan) are kept."""
    for middleware in reversed(middlewares):
        layer = _Layer(middleware, backend)
        backend = dataclasses.replace(
            backend, queues=LayerQueues(layer), blobs=LayerBlobs(layer), table=LayerTable(layer)
        )
    return backend


@dataclass
class Counting(Middleware):
    """Charges each call to the ``calls`` of the service beneath it as the AWS requests it
    would make (a send of 25 bodies is three SendMessageBatch). For backends that do not
    count on the wire, as the aws backend does with a botocore hook."""

    below: Backend | None = field(default=None, init=False)

    def bind(self, below: Backend) -> None:
        self.below = below

    async def around(self, call: Call, proceed: Proceed) -> Any:
        assert self.below is not None, "bound by wrap"
        calls: Counter[str] = getattr(self.below, call.service).calls
        if call.method == "send":
            # An oversized body or a deleted queue is refused before any batch is counted.
            result = await proceed(call)
            calls[call.op] += call.requests
            usage.charge(call.op, call.requests, billing.units_of_call(call, result))
            return result
        calls[call.op] += call.requests
        result = None
        try:
            result = await proceed(call)
            return result
        finally:
            # Charged as billed, for the job the caller works for: a failed conditional
            # write is charged too, as DynamoDB charges it.
            usage.charge(call.op, call.requests, billing.units_of_call(call, result))
