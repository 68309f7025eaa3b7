"""Blob store conformance: S3 semantics, URLs built from ``backend.scratch``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cmr.backends.base import Backend
from cmr.backends.embedded.blobs import EmbeddedBlobs
from cmr.errors import BackendError, BlobMissing, ConditionFailed
from cmr.fileurls import file_url
from tests.backends.conftest import WITH_AZURE, stack_of

Folder = Callable[[], str]
# Each backend's requests for a put, a get and a size, and for a copy (the embedded backend
# counts as S3 would bill).
OPS = {
    "embedded": ("s3.PutObject", "s3.GetObject", "s3.HeadObject"),
    "aws": ("s3.PutObject", "s3.GetObject", "s3.HeadObject"),
    "azure": ("blob.PutBlob", "blob.GetBlob", "blob.GetBlobProperties"),
}
COPY_OP = {"embedded": "s3.CopyObject", "aws": "s3.CopyObject", "azure": "blob.CopyBlob"}


@pytest.fixture(params=WITH_AZURE)
def backend_name(request: pytest.FixtureRequest) -> str:
    """This suite runs on Azure (Azurite) too."""
    return stack_of(request)


@pytest.fixture
def folder(backend: Backend, unique: Callable[[], str]) -> Folder:
    """A fresh URL prefix under the backend's scratch area (file:// or s3://)."""
    return lambda: f"{backend.scratch}/{unique()}"


async def test_put_get(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/a/b/blob.bin"
    data = bytes(range(256)) * 100
    await backend.blobs.put(url, data)
    assert await backend.blobs.get(url) == data
    assert await backend.blobs.size(url) == len(data)
    await backend.blobs.put(url, b"replaced")
    assert await backend.blobs.get(url) == b"replaced"


async def test_empty_blob(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/empty"
    await backend.blobs.put(url, b"")
    assert await backend.blobs.get(url) == b""
    assert await backend.blobs.size(url) == 0
    assert await backend.blobs.get_range(url, 0, 10) == b""


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 10, b"0123456789"),
        (2, 5, b"234"),
        (0, 1, b"0"),
        (9, 10, b"9"),
        (8, 20, b"89"),  # clipped to the size
        (5, 5, b""),  # empty range
        (6, 3, b""),  # inverted range
        (10, 12, b""),  # starts at the end
        (20, 30, b""),  # starts past the end
    ],
)
async def test_get_range(
    backend: Backend, folder: Folder, start: int, end: int, expected: bytes
) -> None:
    url = f"{folder()}/digits"
    await backend.blobs.put(url, b"0123456789")
    assert await backend.blobs.get_range(url, start, end) == expected


async def test_missing_blob(backend: Backend, folder: Folder, tmp_path: Path) -> None:
    url = f"{folder()}/nothing-here"
    with pytest.raises(BlobMissing):
        await backend.blobs.get(url)
    with pytest.raises(BlobMissing):
        await backend.blobs.get_range(url, 0, 10)
    with pytest.raises(BlobMissing):
        await backend.blobs.get_range(url, 3, 3)
    with pytest.raises(BlobMissing):
        await backend.blobs.size(url)
    with pytest.raises(BlobMissing):
        await backend.blobs.download_file(url, str(tmp_path / "out.bin"))
    assert not (tmp_path / "out.bin").exists()


async def test_list_recursive_sorted(backend: Backend, folder: Folder) -> None:
    root = folder()
    urls = [f"{root}/out/part-00001", f"{root}/out/part-00000", f"{root}/out/sub/deep/x"]
    for i, url in enumerate(urls):
        await backend.blobs.put(url, b"x" * i)
    await backend.blobs.put(f"{root}/elsewhere", b"no")
    listed = await backend.blobs.list(f"{root}/out/")
    assert [b.url for b in listed] == sorted(urls)
    assert {b.url: b.size for b in listed} == {u: i for i, u in enumerate(urls)}
    assert await backend.blobs.list(f"{root}/nothing/") == []


async def test_list_is_a_string_prefix(backend: Backend, folder: Folder) -> None:
    root = folder()
    await backend.blobs.put(f"{root}/out/part-00000", b"0")
    await backend.blobs.put(f"{root}/out/part-00001", b"1")
    await backend.blobs.put(f"{root}/out/_SUCCESS", b"")
    listed = await backend.blobs.list(f"{root}/out/part-")
    assert [b.url for b in listed] == [f"{root}/out/part-00000", f"{root}/out/part-00001"]


async def test_list_prefix_spans_sibling_folders(backend: Backend, folder: Folder) -> None:
    # S3 has no folders: "job-1" is a prefix of "job-1/..." and of "job-10/..." alike.
    root = folder()
    await backend.blobs.put(f"{root}/job-1/a", b"a")
    await backend.blobs.put(f"{root}/job-10/b", b"b")
    listed = await backend.blobs.list(f"{root}/job-1")
    assert [b.url for b in listed] == [f"{root}/job-1/a", f"{root}/job-10/b"]
    assert [b.url for b in await backend.blobs.list(f"{root}/job-1/")] == [f"{root}/job-1/a"]


async def test_list_many(backend: Backend, folder: Folder) -> None:
    root = folder()
    urls = [f"{root}/k{i:04d}" for i in range(1100)]  # more than one ListObjectsV2 page
    gate = asyncio.Semaphore(32)

    async def put(url: str) -> None:
        async with gate:
            await backend.blobs.put(url, b"")

    await asyncio.gather(*(put(u) for u in urls))
    assert [b.url for b in await backend.blobs.list(f"{root}/")] == urls
    assert await backend.blobs.delete_prefix(f"{root}/") == 1100
    assert await backend.blobs.list(f"{root}/") == []


async def test_delete_prefix(backend: Backend, folder: Folder) -> None:
    root = folder()
    for name in ["tmp/a", "tmp/b", "tmp/sub/c", "keep/d"]:
        await backend.blobs.put(f"{root}/{name}", name.encode())
    assert await backend.blobs.delete_prefix(f"{root}/tmp/") == 3
    assert await backend.blobs.delete_prefix(f"{root}/tmp/") == 0  # idempotent
    assert [b.url for b in await backend.blobs.list(f"{root}/")] == [f"{root}/keep/d"]
    with pytest.raises(BlobMissing):
        await backend.blobs.get(f"{root}/tmp/a")


async def test_delete_prefix_is_a_string_prefix(backend: Backend, folder: Folder) -> None:
    root = folder()
    for name in ["out/part-0", "out/part-1", "out/_SUCCESS"]:
        await backend.blobs.put(f"{root}/{name}", b"x")
    assert await backend.blobs.delete_prefix(f"{root}/out/part-") == 2
    assert [b.url for b in await backend.blobs.list(f"{root}/")] == [f"{root}/out/_SUCCESS"]


@pytest.mark.slow  # ~10 s: 10,000 files (a race: the old code failed in 3 of 4 runs)
async def test_two_cleanups_of_one_prefix_at_once_both_end(tmp_path: Path) -> None:
    """A janitor's cleanup and a cancelled run's delete the same job's scratch at once: a
    file the other deleted between the listing and its stat is gone, not an error (the
    embedded store raised FileNotFoundError, a duty failed with a traceback in a run's log:
    tests/chaos/test_publication.py met it once in a full run)."""
    blobs = EmbeddedBlobs()
    for round_ in range(5):
        root = tmp_path / f"r{round_}" / "jobs" / "j"
        for d in range(40):
            (root / f"s{d}").mkdir(parents=True)
            for f in range(50):
                (root / f"s{d}" / f"f{f}").write_bytes(b"x")
        url = file_url(root) + "/"
        got = await asyncio.gather(blobs.delete_prefix(url), blobs.delete_prefix(url))
        assert max(got) <= 2000 and sum(got) >= 2000  # each file counted by one or both
        assert await blobs.list(url) == []


async def test_upload_download(backend: Backend, folder: Folder, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(100_000)
    src.write_bytes(data)
    url = f"{folder()}/uploaded.bin"
    await backend.blobs.upload_file(str(src), url)
    assert await backend.blobs.size(url) == len(data)
    assert await backend.blobs.get(url) == data
    dst = tmp_path / "new" / "dir" / "dst.bin"
    await backend.blobs.download_file(url, str(dst))
    assert dst.read_bytes() == data


async def test_a_frozen_upload_is_the_file_whatever_becomes_of_its_name(
    backend: Backend, folder: Folder, tmp_path: Path
) -> None:
    # A task's finished output: a store on the same disk may share it rather than copy it,
    # but the blob must outlive the file's name, and a retried upload must work.
    src = tmp_path / "output"
    data = os.urandom(300_000)
    src.write_bytes(data)
    url = f"{folder()}/part"
    await backend.blobs.upload_file(str(src), url, frozen=True)
    await backend.blobs.upload_file(str(src), url, frozen=True)  # a retry
    src.unlink()
    assert await backend.blobs.get(url) == data
    copied = f"{folder()}/published"
    await backend.blobs.copy(url, copied)
    await backend.blobs.put(url, b"replaced")  # never in place: the copy keeps its bytes
    assert await backend.blobs.get(copied) == data


async def test_upload_download_multipart(backend: Backend, folder: Folder, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(9 * 1024 * 1024 + 123)  # past the 8 MiB multipart threshold
    src.write_bytes(data)
    url = f"{folder()}/big.bin"
    await backend.blobs.upload_file(str(src), url)
    assert await backend.blobs.size(url) == len(data)
    dst = tmp_path / "big-copy.bin"
    await backend.blobs.download_file(url, str(dst))
    assert dst.read_bytes() == data
    assert await backend.blobs.get_range(url, len(data) - 5, len(data) + 5) == data[-5:]


async def _chunks(data: bytes, sizes: list[int], fail_at: int = -1) -> AsyncIterator[bytes]:
    """``data`` in chunks of the given sizes, cycled; a BackendError once ``fail_at``
    bytes have been yielded (-1: never)."""
    at, i = 0, 0
    while at < len(data):
        if 0 <= fail_at <= at:
            raise BackendError("the stream's source failed")
        n = sizes[i % len(sizes)]
        yield data[at : at + n]
        at, i = at + n, i + 1
        await asyncio.sleep(0)


async def test_a_short_stream_is_one_blob(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/short"
    data = os.urandom(300_001)
    assert await backend.blobs.upload_stream(url, _chunks(data, [65_536, 7])) == len(data)
    assert await backend.blobs.get(url) == data
    empty = f"{folder()}/empty"
    assert await backend.blobs.upload_stream(empty, _chunks(b"", [1])) == 0
    assert await backend.blobs.get(empty) == b""


@pytest.mark.parametrize("hint", [0, 1_000, 40 * 1024 * 1024])
async def test_a_long_stream_is_stored_whole_whatever_its_hint(
    backend: Backend, folder: Folder, hint: int
) -> None:
    # Past a part (8 MiB on S3): a multipart upload of parts cut from odd-sized chunks, with
    # no hint, a hint far too small, and one too large.
    url = f"{folder()}/long"
    data = os.urandom(19 * 1024 * 1024 + 5)
    n = await backend.blobs.upload_stream(url, _chunks(data, [1 << 20, 333_333]), size_hint=hint)
    assert n == len(data)
    assert await backend.blobs.size(url) == len(data)
    assert await backend.blobs.get(url) == data


@pytest.mark.parametrize("fail_at", [0, 100_000, 12 * 1024 * 1024])
async def test_a_stream_that_fails_stores_nothing(
    backend: Backend, folder: Folder, fail_at: int
) -> None:
    # Failing before anything came, within the first part, and after a part was sent: the
    # source's error passes on, no blob appears, and on S3 no upload is left unfinished
    # (its parts would be stored, and billed, until aborted).
    url = f"{folder()}/failed"
    data = os.urandom(20 * 1024 * 1024)
    with pytest.raises(BackendError, match="source failed"):
        await backend.blobs.upload_stream(url, _chunks(data, [1 << 20], fail_at))
    with pytest.raises(BlobMissing):
        await backend.blobs.get(url)
    assert [b.url for b in await backend.blobs.list(url)] == []
    s3 = getattr(backend.blobs, "_s3", None) or getattr(
        getattr(backend.blobs, "inner", None), "_s3", None
    )
    if s3 is not None:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        listed = await s3.list_multipart_uploads(Bucket=bucket, Prefix=key)
        assert listed.get("Uploads", []) == []


async def test_deleting_a_prefix_removes_what_a_dead_writer_left_there(
    backend: Backend, backend_name: str, folder: Folder
) -> None:
    """A worker killed while it streamed a task's output leaves an unfinished upload: on
    S3 its parts, stored and billed until aborted; here a private temporary file. A job's
    cleanup (delete_prefix of its scratch) must remove it with the rest."""
    prefix = f"{folder()}/job/"
    await backend.blobs.put(prefix + "done", b"x")
    if backend_name == "aws":
        s3 = backend.blobs._s3  # type: ignore[attr-defined]
        bucket, _, key = (prefix + "out/p00000").removeprefix("s3://").partition("/")
        upload = await s3.create_multipart_upload(Bucket=bucket, Key=key)
        await s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"y" * 10
        )
        assert await backend.blobs.delete_prefix(prefix) == 1
        listed = await s3.list_multipart_uploads(Bucket=bucket, Prefix=key.rsplit("/", 2)[0])
        assert listed.get("Uploads", []) == []
    elif backend_name == "azure":
        # A block staged, never committed: no blob to read, list or count; Azure discards
        # it after 7 days (there is no upload to abort).
        blobs = backend.blobs._service  # type: ignore[attr-defined]
        container, _, key = prefix.split("/", 3)[3].partition("/")
        await blobs.get_blob_client(container, key + "out/p00000").stage_block("b1", b"y" * 10)
        assert await backend.blobs.delete_prefix(prefix) == 1
    else:
        left = Path(prefix.removeprefix("file://")) / "out" / ".p00000.0123456789ab.tmp"
        left.parent.mkdir(parents=True)
        left.write_bytes(b"y" * 10)
        assert await backend.blobs.delete_prefix(prefix) == 1
        assert not left.exists()
    assert await backend.blobs.list(prefix) == []


async def test_calls_are_counted(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/counted"
    before = backend.calls()
    await backend.blobs.put(url, b"abc")
    await backend.blobs.get(url)
    await backend.blobs.get_range(url, 0, 2)
    await backend.blobs.size(url)
    calls = backend.calls() - before
    put, get, head = OPS[backend.name]
    assert calls[put] == 1
    assert calls[get] == 2
    assert calls[head] == 1


def test_embedded_write_survives_its_directory_vanishing(tmp_path: Path) -> None:
    """S3 has no directories: a PUT under a prefix that a concurrent delete_prefix removed
    still lands. The embedded store makes the directory again when that delete wins the
    race between its mkdir and its write (a chaos run once failed on it)."""
    import shutil

    from cmr.backends.embedded import _into_dir

    target = tmp_path / "jobs" / "j1" / "out" / "p00000"
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if len(calls) == 1:
            shutil.rmtree(tmp_path / "jobs")  # the concurrent cleanup, between mkdir and write
        target.write_bytes(b"part")

    _into_dir(target, write)
    assert target.read_bytes() == b"part" and len(calls) == 2


async def test_put_if_is_a_compare_and_swap(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/_SUCCESS"
    first = await backend.blobs.put_if(url, b"one", etag=None)  # only if absent
    with pytest.raises(ConditionFailed):
        await backend.blobs.put_if(url, b"two", etag=None)
    data, etag = await backend.blobs.get_with_etag(url)
    assert (data, etag) == (b"one", first)
    second = await backend.blobs.put_if(url, b"two", etag=first)
    with pytest.raises(ConditionFailed):  # a writer that saw the old version loses
        await backend.blobs.put_if(url, b"three", etag=first)
    assert await backend.blobs.get_with_etag(url) == (b"two", second)
    with pytest.raises(BlobMissing):
        await backend.blobs.get_with_etag(f"{folder()}/none")


async def test_a_large_conditional_put(backend: Backend, folder: Folder) -> None:
    # Past 1 MiB, where a store may send it otherwise than a small one (Azure: a block and
    # a commit, the condition on the commit).
    url = f"{folder()}/large"
    one, two = os.urandom(3 << 20), os.urandom((3 << 20) + 1)
    first = await backend.blobs.put_if(url, one, etag=None)
    with pytest.raises(ConditionFailed):
        await backend.blobs.put_if(url, two, etag=None)
    second = await backend.blobs.put_if(url, two, etag=first)
    with pytest.raises(ConditionFailed):
        await backend.blobs.put_if(url, one, etag=first)
    assert await backend.blobs.get_with_etag(url) == (two, second)
    await backend.blobs.put(url, one)
    assert await backend.blobs.get(url) == one


async def test_put_if_races_have_one_winner(backend: Backend, folder: Folder) -> None:
    url = f"{folder()}/_SUCCESS"
    outcomes = await asyncio.gather(
        *(backend.blobs.put_if(url, f"w{i}".encode(), etag=None) for i in range(8)),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1
    assert all(isinstance(o, ConditionFailed) for o in outcomes if not isinstance(o, str))


async def test_copy_to_a_new_key_has_the_source_content_size_and_etag(
    backend: Backend, folder: Folder
) -> None:
    root = folder()
    data = bytes(range(256)) * 40
    await backend.blobs.put(f"{root}/src", data)
    before = backend.calls()
    await backend.blobs.copy(f"{root}/src", f"{root}/deeper/dst")
    assert (backend.calls() - before)[COPY_OP[backend.name]] == 1  # one request, server-side
    assert await backend.blobs.get(f"{root}/deeper/dst") == data
    assert await backend.blobs.size(f"{root}/deeper/dst") == len(data)
    _, src_etag = await backend.blobs.get_with_etag(f"{root}/src")
    _, dst_etag = await backend.blobs.get_with_etag(f"{root}/deeper/dst")
    if backend.name == "azure":
        assert dst_etag != src_etag  # Azure: a copy is a blob of its own, with its own ETag
    else:
        assert dst_etag == src_etag  # S3: a copied single-part object keeps its MD5 etag
    assert [b.size for b in await backend.blobs.list(f"{root}/")] == [len(data), len(data)]
    assert await backend.blobs.get(f"{root}/src") == data  # the source is untouched


async def test_copy_over_an_existing_key_replaces_it(backend: Backend, folder: Folder) -> None:
    root = folder()
    await backend.blobs.put(f"{root}/src", b"new")
    await backend.blobs.put(f"{root}/dst", b"an older and longer blob")
    await backend.blobs.copy(f"{root}/src", f"{root}/dst")
    assert await backend.blobs.get(f"{root}/dst") == b"new"
    assert await backend.blobs.size(f"{root}/dst") == 3


async def test_copy_of_an_empty_blob(backend: Backend, folder: Folder) -> None:
    root = folder()
    await backend.blobs.put(f"{root}/empty", b"")
    await backend.blobs.copy(f"{root}/empty", f"{root}/empty-copy")
    assert await backend.blobs.get(f"{root}/empty-copy") == b""
    assert await backend.blobs.size(f"{root}/empty-copy") == 0


async def test_copy_of_a_missing_source_changes_nothing(backend: Backend, folder: Folder) -> None:
    root = folder()
    await backend.blobs.put(f"{root}/dst", b"kept")
    with pytest.raises(BlobMissing):
        await backend.blobs.copy(f"{root}/missing", f"{root}/dst")
    with pytest.raises(BlobMissing):
        await backend.blobs.copy(f"{root}/missing", f"{root}/new")
    assert await backend.blobs.get(f"{root}/dst") == b"kept"
    assert [b.url for b in await backend.blobs.list(f"{root}/")] == [f"{root}/dst"]


async def test_copy_and_delete(backend: Backend, folder: Folder) -> None:
    root = folder()
    await backend.blobs.put(f"{root}/src", b"payload")
    await backend.blobs.copy(f"{root}/src", f"{root}/out/dst")
    await backend.blobs.put(f"{root}/src", b"changed")  # the copy is its own blob
    assert await backend.blobs.get(f"{root}/out/dst") == b"payload"
    with pytest.raises(BlobMissing):
        await backend.blobs.copy(f"{root}/missing", f"{root}/out/other")
    await backend.blobs.delete([f"{root}/src", f"{root}/out/dst", f"{root}/never"])
    assert await backend.blobs.list(root) == []


def test_an_upload_never_takes_more_parts_than_s3_allows() -> None:
    """At 8 MiB a part, a file past ~78 GiB (a large reducer's output) needed more than S3's
    10,000 parts, and its upload failed at the last part; the part grows with the file."""
    from cmr.backends.parts import MAX_PARTS, PART_BYTES, part_bytes

    assert part_bytes(1) == part_bytes(PART_BYTES) == PART_BYTES
    assert -(-(100 << 30) // PART_BYTES) > MAX_PARTS  # what the fixed size would take
    for size in (PART_BYTES * MAX_PARTS, PART_BYTES * MAX_PARTS + 1, 100 << 30, 5 << 40):
        step = part_bytes(size)
        assert -(-size // step) <= MAX_PARTS and step % (1 << 20) == 0, (size, step)


def test_a_stream_with_no_size_hint_reaches_s3s_largest_object_within_its_parts() -> None:
    """A streamed upload that is given no hint grows its parts with what it has sent. Grown
    as if the stream were twice that, its parts ran out (10,000) at 3.25 TiB, short of the
    5 TiB an S3 object may hold; every part stays within S3's 5 GiB."""
    from cmr.backends.parts import MAX_PARTS, stream_part_bytes

    sent = parts = 0
    while sent < 5 << 40:
        step = stream_part_bytes(0, sent)
        assert step <= 5 << 30, sent
        sent, parts = sent + step, parts + 1
    assert parts <= MAX_PARTS, parts
    # A hint still sizes the parts it covers: a 1 GiB stream takes its 64.
    assert stream_part_bytes(1 << 30, 0) == 16 << 20


def test_a_large_upload_takes_few_parts_and_bounded_memory() -> None:
    """Every part is a billed PUT: at 8 MiB a part, writing a TB cost $0.60 in parts. A
    large file takes about PARTS_WANTED parts, and the parts held at once stay within
    IN_FLIGHT_BYTES (one part, when a part alone is larger)."""
    from cmr.backends.parts import (
        GROWN_PART_BYTES,
        IN_FLIGHT_BYTES,
        PART_BYTES,
        PARTS_WANTED,
        part_bytes,
        parts_in_flight,
    )

    assert part_bytes(PART_BYTES * PARTS_WANTED) == PART_BYTES
    assert part_bytes(1 << 30) == 16 << 20 and -(-(1 << 30) // part_bytes(1 << 30)) == 64
    assert part_bytes(16 << 30) == part_bytes(100 << 30) == GROWN_PART_BYTES
    assert -(-(10**12) // part_bytes(10**12)) < 4_000  # a TB in under 4,000 PUTs, not 119,210
    for size in (1, 100 << 20, 1 << 30, 4 << 30, 100 << 30, 5 << 40):
        step = part_bytes(size)
        held = parts_in_flight(step) * step
        assert held <= max(IN_FLIGHT_BYTES, step) and parts_in_flight(step) >= 1, size
