"""The blob protocol on Azure Blob storage (block blobs, through azure.storage.blob.aio).

URLs are ``azure://ACCOUNT/CONTAINER/KEY``: the account, because a container's name is
unique only within its account (an S3 bucket's is global), and the store URL
(``azure://ACCOUNT/CONTAINER/TABLE?prefix=P``, issue 29) names it the same way; a URL of
another account than the connection string's is refused, never read from the wrong one.
The key is the blob's name as is (not percent-encoded), as ``s3://bucket/key`` keeps S3's.

What S3 gives and Azure gives otherwise:

* Conditional writes: ``If-Match`` / ``If-None-Match: *`` exist as on S3. The ETag is
  Azure's (``"0x8D..."``), opaque: a copy gets an ETag of its own (S3 keeps an MD5 one).
* Copy: Copy Blob (``start_copy_from_url``) inside one account; it usually ends within
  the request, and is otherwise waited for (its status polled) before ``copy`` returns.
* Large uploads: blocks staged (Put Block) and committed in one Put Block List, sized as
  :mod:`cmr.backends.parts` sizes S3's parts. Block ids carry a random token per upload,
  so two writers of one blob never commit each other's blocks. An upload that fails
  commits nothing: its staged blocks stay uncommitted, invisible to reads and listings,
  and Azure discards them after 7 days (or when the blob is next committed or deleted);
  there is no S3 AbortMultipartUpload to call.
* Batch delete: Azure's Blob Batch takes 256 deletes a request, but Azurite 3.35.0 cannot
  read the async SDK's batch (its multipart boundary holds "=": one 400 InvalidInput for
  the whole batch; tests/backends/test_azure.py names the gap), so deletes go one Delete
  Blob a blob, DELETE_CONCURRENCY at a time, on Azure too: one code path for both.
"""

from __future__ import annotations

import asyncio
import builtins
import io
import os
import secrets
from collections import Counter
from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from azure.core import MatchConditions
from azure.storage.blob import BlobBlock
from azure.storage.blob.aio import BlobClient, BlobServiceClient, ContainerClient

from cmr.aio import run_all
from cmr.backends.azure.clients import RETRY, Counting, connection_string
from cmr.backends.azure.errors import translate
from cmr.backends.base import BlobInfo
from cmr.backends.embedded.blobs import FILE_MODE
from cmr.backends.parts import (
    MAX_PARTS,
    PART_BYTES,
    _fill,
    part_bytes,
    parts_in_flight,
    send_parts,
)
from cmr.errors import BackendError, BlobMissing, UsageError

SCHEME = "azure://"
INLINE_PUT_BYTES = 1024 * 1024  # aiohttp warns of a raw body past this (TOO_LARGE_BYTES_BODY)
DELETE_CONCURRENCY = 16  # Delete Blob requests in flight per delete()
COPY_POLL_S = 0.5  # how often a copy that did not end within its request is looked at


class AzureBlobs:
    def __init__(self, conn: str | None = None) -> None:
        """A client of the account in ``conn`` (default: AZURE_STORAGE_CONNECTION_STRING)."""
        self.calls: Counter[str] = Counter()
        self._service = BlobServiceClient.from_connection_string(
            connection_string(conn), raw_request_hook=Counting("blob", self.calls), **RETRY
        )
        self.account: str = self._service.account_name or ""

    async def close(self) -> None:
        await self._service.close()

    async def __aenter__(self) -> AzureBlobs:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def container(self, name: str) -> ContainerClient:
        """The SDK's client of one container of our account (for opening the backend)."""
        return self._service.get_container_client(name)

    def url(self, container: str, key: str) -> str:
        return f"{SCHEME}{self.account}/{container}/{key}"

    def _split(self, url: str) -> tuple[str, str]:
        """(container, key) of an ``azure://ACCOUNT/CONTAINER/KEY`` URL of our account."""
        if not url.startswith(SCHEME):
            raise UsageError(
                f"{url!r}: the azure backend stores blobs in Azure Blob storage: use "
                "azure://ACCOUNT/CONTAINER/KEY URLs"
            )
        account, _, rest = url[len(SCHEME) :].partition("/")
        container, _, key = rest.partition("/")
        if not account or not container:
            raise UsageError(f"{url!r}: an azure:// URL names ACCOUNT/CONTAINER/KEY")
        if account != self.account:
            raise UsageError(
                f"{url!r}: account {account!r} is not the one AZURE_STORAGE_CONNECTION_STRING "
                f"opens ({self.account!r})"
            )
        return container, key

    def _blob(self, url: str) -> BlobClient:
        container, key = self._split(url)
        return self._service.get_blob_client(container, key)

    async def put(self, url: str, data: bytes) -> None:
        await self._put(url, data, {})

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        if etag is None:  # If-None-Match: *
            condition: dict[str, Any] = {"match_condition": MatchConditions.IfMissing}
        else:  # If-Match: etag
            condition = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        return await self._put(url, data, condition)

    async def _put(self, url: str, data: bytes, condition: dict[str, Any]) -> str:
        """One Put Blob; past INLINE_PUT_BYTES, one Put Block and a Put Block List (the
        condition on the commit), as the SDK's Put Blob sends its body as raw bytes, which
        aiohttp warns may block the event loop, where a staged block streams. Returns the
        new ETag."""
        blob = self._blob(url)
        if len(data) <= INLINE_PUT_BYTES:
            with translate("blob", url, "PutBlob"):
                got = await blob.upload_blob(data, overwrite=True, **condition)
            return str(got["etag"])
        blocks = _Blocks(blob, url)
        await blocks.stage(1, data)
        return await blocks.commit(1, condition)

    async def get(self, url: str) -> bytes:
        return (await self.get_with_etag(url))[0]

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        blob = self._blob(url)
        with translate("blob", url, "GetBlob"):
            stream = await blob.download_blob()
            data = await stream.readall()
        return data, str(stream.properties.etag)

    async def copy(self, src: str, dst: str) -> None:
        source, target = self._blob(src), self._blob(dst)
        with translate("blob", src, "CopyBlob"):
            got = await target.start_copy_from_url(source.url)
            status = str(got.get("copy_status") or "")
            # Within an account a copy usually ends in its request; a large one may not.
            while status == "pending":
                await asyncio.sleep(COPY_POLL_S)
                status = str((await target.get_blob_properties()).copy.status or "")
        if status != "success":
            raise BackendError(
                f"blob copy {src} -> {dst} ended {status or 'unknown'}",
                service="blob",
                operation="CopyBlob",
                code=status,
            )

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        start = max(0, start)
        if start >= end:
            await self.size(url)  # still BlobMissing when there is no blob
            return b""
        blob = self._blob(url)
        try:
            with translate("blob", url, "GetBlob"):
                stream = await blob.download_blob(offset=start, length=end - start)
                return await stream.readall()
        except BackendError as exc:
            if exc.code == "InvalidRange":
                return b""  # start at or past the end of the blob (or an empty blob)
            raise

    async def size(self, url: str) -> int:
        blob = self._blob(url)
        with translate("blob", url, "GetBlobProperties"):
            return int((await blob.get_blob_properties()).size)

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        container, key = self._split(prefix)
        client = self._service.get_container_client(container)
        with translate("blob", prefix, "ListBlobs"):
            found = [
                BlobInfo(self.url(container, b.name), int(b.size))
                async for b in client.list_blobs(name_starts_with=key)
            ]
        return sorted(found, key=lambda b: b.url)

    async def delete_prefix(self, prefix: str) -> int:
        # Uncommitted blocks of an upload that never finished are not listed: Azure discards
        # them after 7 days (see the module's text).
        found = await self.list(prefix)
        await self.delete([b.url for b in found])
        return len(found)

    async def delete(self, urls: Sequence[str]) -> None:
        gate = asyncio.Semaphore(DELETE_CONCURRENCY)

        async def one(url: str) -> None:
            blob = self._blob(url)
            async with gate:
                try:
                    with translate("blob", url, "DeleteBlob"):
                        await blob.delete_blob()
                except BlobMissing:
                    pass  # absent is fine

        await run_all(one(u) for u in urls)

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        size = (await asyncio.to_thread(os.stat, path)).st_size
        if size <= PART_BYTES:
            await self.put(url, await asyncio.to_thread(Path(path).read_bytes))
            return
        step = part_bytes(size)

        def read(offset: int) -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(step)

        blocks = _Blocks(self._blob(url), url)
        gate = asyncio.Semaphore(parts_in_flight(step))

        async def one(number: int) -> None:
            async with gate:
                await blocks.stage(number, await asyncio.to_thread(read, (number - 1) * step))

        count = (size + step - 1) // step
        await run_all(one(n) for n in range(1, count + 1))
        await blocks.commit(count)

    async def upload_stream(
        self, url: str, chunks: AsyncIterable[bytes], *, size_hint: int = 0
    ) -> int:
        # As the S3 store streams: blocks cut as a file of the hinted size would be, growing
        # with what has come; at most IN_FLIGHT_BYTES of them in flight (one, when larger).
        # A failure commits nothing: the staged blocks are left to Azure to discard.
        stream = aiter(chunks)
        buf = bytearray()
        ended = await _fill(stream, buf, part_bytes(size_hint))
        if ended:  # a stream of at most a part: one Put Blob
            await self.put(url, bytes(buf))
            return len(buf)
        blocks = _Blocks(self._blob(url), url)
        sent, number = await send_parts(
            stream,
            buf,
            size_hint,
            blocks.stage,
            lambda sent: f"{url}: more than {MAX_PARTS:,} blocks ({sent:,} bytes)",
        )
        await blocks.commit(number)
        return sent

    async def download_file(self, url: str, path: str) -> None:
        blob = self._blob(url)
        dst = Path(path)
        await asyncio.to_thread(dst.parent.mkdir, parents=True, exist_ok=True)
        # A failed download must not leave a partial file; a part being fetched is private.
        tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(6)}.part")
        fd = await asyncio.to_thread(
            os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
        )
        try:
            with os.fdopen(fd, "wb") as f, translate("blob", url, "GetBlob"):
                stream = await blob.download_blob()
                async for chunk in stream.chunks():
                    await asyncio.to_thread(f.write, chunk)
        except BaseException:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)
            raise
        await asyncio.to_thread(os.chmod, tmp, FILE_MODE)
        await asyncio.to_thread(tmp.replace, dst)


class _Blocks:
    """One upload's blocks: ids unique to it (a random token, then the block's number, all
    of one length as Azure requires), staged in any order, committed in number order."""

    def __init__(self, blob: BlobClient, url: str) -> None:
        self._blob = blob
        self._url = url
        self._token = secrets.token_hex(8)

    def _id(self, number: int) -> str:
        return f"{self._token}-{number:06d}"  # the SDK base64-encodes it

    async def stage(self, number: int, data: bytes) -> None:
        with translate("blob", self._url, "PutBlock"):
            # aiohttp warns that a large bytes body blocks the loop; a BytesIO is streamed.
            await self._blob.stage_block(self._id(number), io.BytesIO(data), length=len(data))

    async def commit(self, count: int, condition: dict[str, Any] | None = None) -> str:
        """Commit blocks 1..count, under ``condition`` (If-Match ...); the new ETag."""
        ids = [BlobBlock(block_id=self._id(n)) for n in range(1, count + 1)]
        with translate("blob", self._url, "PutBlockList"):
            got = await self._blob.commit_block_list(ids, **(condition or {}))
        return str(got["etag"])
