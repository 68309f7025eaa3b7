"""A blob store of plain files under any local directory, addressed by ``file://`` URLs."""

from __future__ import annotations

import asyncio
import builtins
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
from collections import Counter
from collections.abc import AsyncIterable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from cmr.backends.base import (
    BlobInfo,
)
from cmr.errors import BlobMissing, ConditionFailed
from cmr.fileurls import file_path, file_url

INLINE_READ_BYTES = 256 * 1024  # reads this small run on the event loop itself
COPY_CHUNK = 1 << 30  # bytes per sendfile call


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask (0o644 for the usual
    022). Reading the umask means setting it, for every thread: done once, at import."""
    umask = os.umask(0o077)
    os.umask(umask)
    return 0o666 & ~umask


# A blob, once complete, has the mode any tool's output would have: the user's umask decides
# who may read a published part, as it decides for the rest of their files.
FILE_MODE = _new_file_mode()


def prefix_path(url: str) -> str:
    """A URL prefix as a local path string, keeping a trailing slash."""
    path = str(file_path(url))
    return path + "/" if url.endswith("/") and not path.endswith("/") else path


_T = TypeVar("_T")


def _into_dir(path: Path, write: Callable[[], _T]) -> _T:
    """Write a blob file, making its directory; what ``write`` returns. S3 has no
    directories: a PUT under a prefix that a concurrent delete_prefix just removed still
    succeeds. Here that delete can remove the directory between the mkdir and the write, so
    make it again and retry."""
    for attempt in range(5):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return write()
        except FileNotFoundError:
            if attempt == 4 or path.parent.exists():
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _temp_beside(path: Path) -> Path:
    # Random, and created with O_EXCL: never an existing file, nor a link planted there.
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _write_private(path: Path, fill: Callable[[int], object]) -> None:
    """Write a file as a blob store must: into a temporary file beside it that only its
    owner can read (0600) while ``fill`` writes it through its descriptor, given FILE_MODE
    once complete, then renamed over ``path`` (readers never see half a blob, as with S3).
    A failed write leaves nothing behind."""
    tmp = _temp_beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            fill(fd)
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _link_private(source: str, path: Path) -> bool:
    """Make ``path`` a hard link to ``source`` (a file its writer never writes again), with
    a blob's mode, as _write_private would make a copy of it; False where the file system
    cannot link it there (another device): copy it then. Idempotent, as a retried upload
    needs."""
    tmp = _temp_beside(path)
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            return False
        raise
    try:
        os.chmod(tmp, FILE_MODE)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def _bytes(data: bytes) -> Callable[[int], object]:
    def fill(fd: int) -> None:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)

    return fill


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _contents_of(source: str | Path) -> Callable[[int], object]:
    def fill(fd: int) -> None:
        with open(source, "rb") as src:
            try:
                # In the kernel, as shutil.copyfile does on Linux.
                offset = 0
                while sent := os.sendfile(fd, src.fileno(), offset, COPY_CHUNK):
                    offset += sent
            except OSError:
                if offset:
                    raise
                with open(fd, "wb", closefd=False) as out:
                    shutil.copyfileobj(src, out, 1 << 20)  # no sendfile between these files

    return fill


class EmbeddedBlobs:
    """Blobs as files under any local directory, addressed by ``file://`` URLs."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()  # charged by the Counting middleware

    async def put(self, url: str, data: bytes) -> None:
        path = file_path(url)

        await asyncio.to_thread(_into_dir, path, lambda: _write_private(path, _bytes(data)))

    async def put_if(self, url: str, data: bytes, *, etag: str | None) -> str:
        path = file_path(url)

        def write() -> str:
            path.parent.mkdir(parents=True, exist_ok=True)
            # The compare and the swap under one lock on the directory, so that writers in
            # other processes (two `cmr run` into one output) are serialised as S3 would.
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = _etag(path.read_bytes())
                except FileNotFoundError:
                    current = None
                if current != etag:
                    raise ConditionFailed(f"{url}: etag is {current}, not {etag}")
                _write_private(path, _bytes(data))
            finally:
                os.close(fd)  # closing the descriptor releases the lock
            return _etag(data)

        return await asyncio.to_thread(write)

    async def get(self, url: str) -> bytes:
        try:
            return await asyncio.to_thread(file_path(url).read_bytes)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobMissing(f"no blob at {url}") from None

    async def get_with_etag(self, url: str) -> tuple[bytes, str]:
        data = await self.get(url)
        return data, _etag(data)

    async def copy(self, src: str, dst: str) -> None:
        source, target = file_path(src), file_path(dst)

        def link() -> None:
            # Blobs are immutable once written (puts replace whole files), so a hard link is
            # a copy that costs no bytes (of a file complete, and with its mode, already);
            # across file systems, a real copy.
            tmp = _temp_beside(target)
            try:
                try:
                    os.link(source, tmp)
                except OSError as exc:
                    if isinstance(exc, FileNotFoundError) and not source.exists():
                        raise
                    _write_private(target, _contents_of(source))
                else:
                    tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)  # a failed copy leaves nothing behind

        try:
            await asyncio.to_thread(_into_dir, target, link)
        except (FileNotFoundError, IsADirectoryError):
            if not source.is_file():
                raise BlobMissing(f"no blob at {src}") from None
            raise

    async def get_range(self, url: str, start: int, end: int) -> bytes:

        def read() -> bytes:
            with file_path(url).open("rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))

        try:
            if end - start <= INLINE_READ_BYTES:
                # A small read from the page cache takes microseconds, less than the hop to
                # a thread and back: a task of 400 small files would spend more on hops.
                return read()
            return await asyncio.to_thread(read)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobMissing(f"no blob at {url}") from None

    async def size(self, url: str) -> int:
        path = file_path(url)
        if not path.is_file():
            raise BlobMissing(f"no blob at {url}")
        return path.stat().st_size

    async def list(self, prefix: str) -> builtins.list[BlobInfo]:
        return await asyncio.to_thread(self._under, prefix)

    def _under(self, prefix: str) -> builtins.list[BlobInfo]:
        """Files whose path starts with prefix *as a string*, as S3 lists keys: the prefix
        ".../job-1" also matches ".../job-10/x", exactly as it would on S3."""
        raw = prefix_path(prefix)
        root = Path(raw) if raw.endswith("/") else Path(raw).parent
        if not root.is_dir():
            return []
        found = []
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                p = Path(dirpath, f)
                if str(p).startswith(raw) and not f.endswith(".tmp"):
                    try:
                        size = p.stat().st_size
                    except FileNotFoundError:
                        continue  # deleted since the walk saw it (another deleter): gone
                    found.append(BlobInfo(file_url(p), size))
        return sorted(found, key=lambda b: b.url)

    async def delete_prefix(self, prefix: str) -> int:

        def remove() -> int:
            gone = self._under(prefix)
            for blob in gone:
                file_path(blob.url).unlink(missing_ok=True)
            raw = prefix_path(prefix)
            if raw.endswith("/"):
                shutil.rmtree(raw, ignore_errors=True)  # empty directories are not blobs
            return len(gone)

        return await asyncio.to_thread(remove)

    async def delete(self, urls: Sequence[str]) -> None:

        def remove() -> None:
            for url in urls:
                file_path(url).unlink(missing_ok=True)

        await asyncio.to_thread(remove)

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        dst = file_path(url)

        if not os.path.isfile(path):
            raise FileNotFoundError(path)

        if frozen and await asyncio.to_thread(_into_dir, dst, lambda: _link_private(path, dst)):
            return  # shared, not copied: 2 GB of TeraSort output cost ~1 s of a core to copy
        # Never in place: the old file may be hard-linked to a published copy.
        await asyncio.to_thread(_into_dir, dst, lambda: _write_private(dst, _contents_of(path)))

    async def upload_stream(
        self, url: str, chunks: AsyncIterable[bytes], *, size_hint: int = 0
    ) -> int:
        dst = file_path(url)

        def create() -> tuple[Path, int]:
            tmp = _temp_beside(dst)
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

        # Written as _write_private writes: private until complete, then renamed over.
        tmp, fd = await asyncio.to_thread(_into_dir, dst, create)
        size = 0
        try:
            try:
                async for chunk in chunks:
                    await asyncio.to_thread(_write_all, fd, chunk)
                    size += len(chunk)
                os.fchmod(fd, FILE_MODE)
            finally:
                os.close(fd)
            await asyncio.to_thread(tmp.replace, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return size

    async def download_file(self, url: str, path: str) -> None:
        src = file_path(url)

        def copy_file() -> None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            _write_private(Path(path), _contents_of(src))  # never a partial file at path

        try:
            await asyncio.to_thread(copy_file)
        except (FileNotFoundError, IsADirectoryError):
            # Also when a concurrent delete wins the race mid-copy, as S3 would answer 404.
            raise BlobMissing(f"no blob at {url}") from None


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()  # what S3 uses for a PUT
