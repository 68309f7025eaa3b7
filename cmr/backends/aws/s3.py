"""The blob protocol on S3: conditional puts by ETag, multipart uploads and copies of our own
(aioboto3's managed transfers send raw bytes, which block the event loop)."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
from collections import Counter
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cmr.backends.aws.calls import _all, counting
from cmr.backends.aws.errors import translate as _translate
from cmr.backends.aws.errors import translated as _translated
from cmr.backends.base import BlobInfo
from cmr.backends.embedded.blobs import FILE_MODE
from cmr.backends.parts import (
    MAX_PARTS,
    PART_BYTES,
    PARTS_IN_FLIGHT,
    _fill,
    part_bytes,
    parts_in_flight,
    send_parts,
)
from cmr.errors import BackendError, Rejected, Unreachable, UsageError

COPY_PART_BYTES = 512 * 1024 * 1024  # multipart copy part size, past CopyObject's 5 GiB
COPY_MAX_BYTES = 5 * 1024**3


def _split(url: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://`` URL."""
    if not url.startswith("s3://"):
        raise UsageError(f"{url!r}: the aws backend stores blobs in S3: use s3://bucket/key URLs")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise UsageError(f"{url!r}: no bucket in this s3:// URL")
    return bucket, key


class AwsBlobs:
    def __init__(self, client: Any) -> None:
        self._s3 = client
        self.calls: Counter[str] = Counter()
        counting(client, "s3", self.calls)

    async def put(self, url: str, data: bytes) -> None:
        bucket, key = _split(url)
        with _translate("s3", url):
            # aiohttp warns that a large bytes body blocks the loop; a BytesIO is streamed.
            await self._s3.put_object(Bucket=bucket, Key=key, Body=io.BytesIO(data))

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        bucket, key = _split(url)
        cond = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        with _translate("s3", url):
            got = await self._s3.put_object(Bucket=bucket, Key=key, Body=io.BytesIO(data), **cond)
        return str(got["ETag"])

    async def get(self, url: str) -> bytes:
        return (await self.get_with_etag(url))[0]

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        bucket, key = _split(url)
        with _translate("s3", url):
            got = await self._s3.get_object(Bucket=bucket, Key=key)
            async with got["Body"] as stream:
                data: bytes = await stream.read()
        return data, str(got["ETag"])

    async def copy(self, src: str, dst: str) -> None:
        sb, sk = _split(src)
        db, dk = _split(dst)
        size = await self.size(src)
        if size <= COPY_MAX_BYTES:
            with _translate("s3", src):
                await self._s3.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
            return

        async def part(upload_id: str, number: int) -> str:
            start = (number - 1) * COPY_PART_BYTES
            end = min(size, start + COPY_PART_BYTES) - 1
            with _translate("s3", src):
                got = await self._s3.upload_part_copy(
                    Bucket=db,
                    Key=dk,
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource={"Bucket": sb, "Key": sk},
                    CopySourceRange=f"bytes={start}-{end}",
                )
            return str(got["CopyPartResult"]["ETag"])

        # Past 5 GiB CopyObject refuses: copy in parts, still inside S3.
        await self._multipart(dst, (size + COPY_PART_BYTES - 1) // COPY_PART_BYTES, part)

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        bucket, key = _split(url)
        start = max(0, start)
        if start >= end:
            await self.size(url)  # still BlobMissing when there is no blob
            return b""
        try:
            with _translate("s3", url):
                got = await self._s3.get_object(
                    Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
                )
                async with got["Body"] as stream:
                    data: bytes = await stream.read()
        except BackendError as exc:
            if exc.code in ("InvalidRange", "416"):
                return b""  # start at or past the end of the blob
            raise
        return data

    async def size(self, url: str) -> int:
        bucket, key = _split(url)
        with _translate("s3", url):
            got = await self._s3.head_object(Bucket=bucket, Key=key)
        return int(got["ContentLength"])

    async def list(self, prefix: str) -> list[BlobInfo]:
        bucket, key = _split(prefix)
        found: list[BlobInfo] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        while True:
            with _translate("s3", prefix):
                page = await self._s3.list_objects_v2(**kwargs)
            found += [
                BlobInfo(f"s3://{bucket}/{o['Key']}", int(o["Size"]))
                for o in page.get("Contents", [])
            ]
            if not page.get("IsTruncated"):
                return sorted(found, key=lambda b: b.url)
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    async def delete_prefix(self, prefix: str) -> int:
        found = await self.list(prefix)
        await self.delete([b.url for b in found])
        # And the unfinished uploads under it: a worker that died while streaming a task's
        # output left its parts stored (and billed) until aborted; a job's cleanup is where
        # every trace of it goes. Best effort: a caller whose policy predates this (no
        # s3:ListBucketMultipartUploads) still deletes the blobs, and a cleanup duty must not
        # fail for ever on it; the fleet bucket's lifecycle rule aborts them after a week.
        with suppress(Rejected, Unreachable):  # AccessDenied is Unreachable's
            await self._abort_uploads(prefix)
        return len(found)

    async def _abort_uploads(self, prefix: str) -> None:
        bucket, key = _split(prefix)
        markers: dict[str, str] = {}
        while True:
            with _translate("s3", prefix):
                page = await self._s3.list_multipart_uploads(Bucket=bucket, Prefix=key, **markers)
                await _all(
                    self._abort(bucket, u["Key"], u["UploadId"]) for u in page.get("Uploads", [])
                )
            if not page.get("IsTruncated"):
                return
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    async def _abort(self, bucket: str, key: str, upload_id: str) -> None:
        try:
            await self._s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":  # finished since
                raise

    async def delete(self, urls: Sequence[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for url in urls:
            bucket, key = _split(url)
            by_bucket.setdefault(bucket, []).append(key)

        async def delete(bucket: str, chunk: list[str]) -> None:
            with _translate("s3", f"s3://{bucket}/{chunk[0]}"):
                got = await self._s3.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                )
            if got.get("Errors"):
                e = got["Errors"][0]
                raise BackendError(
                    f"s3.DeleteObjects failed (s3://{bucket}): {len(got['Errors'])} not "
                    f"deleted, first {e.get('Key')}: {e.get('Code')}: {e.get('Message')}"
                )

        await _all(
            delete(bucket, keys[i : i + 1000])
            for bucket, keys in by_bucket.items()
            for i in range(0, len(keys), 1000)
        )

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        # Our own multipart upload: aioboto3's managed one sends parts as raw bytes, which
        # aiohttp warns may block the event loop.
        bucket, key = _split(url)
        size = (await asyncio.to_thread(os.stat, path)).st_size
        if size <= PART_BYTES:
            await self.put(url, await asyncio.to_thread(Path(path).read_bytes))
            return

        step = part_bytes(size)

        def read(offset: int) -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(step)

        async def part(upload_id: str, number: int) -> str:
            chunk = await asyncio.to_thread(read, (number - 1) * step)
            with _translate("s3", url):
                got = await self._s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=io.BytesIO(chunk),
                )
            return str(got["ETag"])

        await self._multipart(url, (size + step - 1) // step, part, parts_in_flight(step))

    async def upload_stream(
        self, url: str, chunks: AsyncIterable[bytes], *, size_hint: int = 0
    ) -> int:
        # Parts as upload_file would cut a file of the hinted size, growing with what has
        # come when there is no hint (or it was short): their PUTs stay about PARTS_WANTED.
        # The parts in flight hold at most IN_FLIGHT_BYTES (one part, when larger).
        bucket, key = _split(url)
        stream = aiter(chunks)
        buf = bytearray()
        ended = await _fill(stream, buf, part_bytes(size_hint))
        if ended:  # a stream of at most a part: one PUT
            await self.put(url, bytes(buf))
            return len(buf)
        with _translate("s3", url):
            upload_id = (await self._s3.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]
        etags: dict[int, str] = {}

        async def one(number: int, data: bytes) -> None:
            with _translate("s3", url):
                got = await self._s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=io.BytesIO(data),
                )
            etags[number] = str(got["ETag"])

        def too_many(sent: int) -> str:
            return (
                f"{url}: more than {MAX_PARTS:,} parts ({sent:,} bytes sent): too large for "
                "one S3 object"
            )

        try:
            sent, _ = await send_parts(stream, buf, size_hint, one, too_many)
            await self._complete(url, upload_id, etags)
        except BaseException:
            with suppress(ClientError, BotoCoreError):
                await self._abort(bucket, key, upload_id)
            raise
        return sent

    async def _complete(self, url: str, upload_id: str, etags: dict[int, str]) -> None:
        """Put a multipart upload's parts together, in the order of their numbers."""
        bucket, key = _split(url)
        with _translate("s3", url):
            await self._s3.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"ETag": etags[n], "PartNumber": n} for n in sorted(etags)]
                },
            )

    async def _multipart(
        self,
        url: str,
        parts: int,
        part: Callable[[str, int], Awaitable[str]],
        in_flight: int = PARTS_IN_FLIGHT,
    ) -> None:
        """One multipart upload to ``url`` (a file's, or a copy's): ``part(upload_id, n)``
        sends part n (from 1) and returns its ETag, ``in_flight`` at a time (each holds its
        part in memory, or a copy in flight); then the parts are put together. Any failure
        aborts the upload: parts of an unfinished one are stored (and billed) until it is
        aborted."""
        bucket, key = _split(url)
        with _translate("s3", url):
            upload_id = (await self._s3.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]
        gate = asyncio.Semaphore(in_flight)
        etags: dict[int, str] = {}

        async def one(number: int) -> None:
            async with gate:
                etags[number] = await part(upload_id, number)

        try:
            await _all(one(n) for n in range(1, parts + 1))
            await self._complete(url, upload_id, etags)
        except BaseException:
            with suppress(ClientError, BotoCoreError):
                await self._abort(bucket, key, upload_id)
            raise

    async def download_file(self, url: str, path: str) -> None:
        bucket, key = _split(url)
        dst = Path(path)
        await asyncio.to_thread(dst.parent.mkdir, parents=True, exist_ok=True)
        # The transfer writes as it goes: a failed download must not leave a partial file.
        tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(6)}.part")
        # Created private (the transfer opens it "wb", which keeps the mode): a part being
        # fetched is nobody else's to read; it gets the umask's mode once complete.
        await asyncio.to_thread(
            lambda: os.close(
                os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            )
        )
        try:
            with _translate("s3", url):
                await self._s3.download_file(bucket, key, str(tmp))
        except Exception as exc:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)
            # aioboto3 wraps part failures in a bare Exception whose cause is the ClientError.
            if not isinstance(exc, BackendError) and isinstance(
                exc.__cause__, ClientError | BotoCoreError
            ):
                raise _translated("s3", exc.__cause__, url) from exc.__cause__
            raise
        await asyncio.to_thread(os.chmod, tmp, FILE_MODE)
        await asyncio.to_thread(tmp.replace, dst)
