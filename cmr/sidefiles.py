"""Side files: files a job ships with it (``Job.files``, ``cmr run --file PATH[#NAME]``).

At submit each file is checked (a readable regular file, names unique and plain, all of
them within MAX_TOTAL_BYTES), hashed, and uploaded once to ``side_files_url`` (not under the
job's scratch: pipelines keep side files across their steps); the job record lists each as
[name, url, sha256, size]. A worker fetches a job's files once (concurrent tasks share the
one download) into a directory of its spool, checks each against its size and sha256, and
hands the directory to the pool, where ``Job.file(name)`` gives a file's local path (in
``setup`` too). A file that changed since submit fails the job, naming it: computing on
other data than was submitted would be silently wrong.

The list in the job record is a stranger's data to a worker: ``from_record`` bounds it, and
every URL must be exactly this job's own for its name, so a record cannot make a worker
download anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from cmr.aio import TaskGroup, first_error
from cmr.errors import BlobMissing, TaskError, UsageError, WireError

if TYPE_CHECKING:
    from cmr.backends.base import Backend, Blobs
    from cmr.jobload import LoadedJob
    from cmr.records import JobSpec
    from cmr.runtime import Runtime

MAX_FILES = 100
MAX_TOTAL_BYTES = 1 << 30  # 1 GiB: every worker downloads them all before its first task
_NAME = re.compile(r"[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]{0,199}")  # not "." or "..": no dot first
_SHA256 = re.compile(r"[0-9a-f]{64}")
FETCH_CONCURRENCY = 4
FETCH_PIECE = 8 * 1024 * 1024  # a side file is fetched in ranged reads of at most this


class SideFile(NamedTuple):
    name: str
    url: str
    sha256: str
    size: int


def side_files_url(scratch: str, job_id: str) -> str:
    """Where a job's side files are staged (a prefix; each file is the prefix + its name)."""
    return f"{scratch.rstrip('/')}/files/{job_id}/"


def local_dir(spool_dir: str, job_id: str) -> str:
    """Where a worker keeps its copies of a job's side files."""
    return os.path.join(spool_dir, f"files-{job_id}")


# --- the client: checked, hashed and staged at submit -------------------------------------


@dataclass(frozen=True)
class Given:
    path: Path
    name: str
    origin: str  # where it was named: "--file", or "Class.files"


def parse_arg(text: str) -> tuple[str, str]:
    """``PATH[#NAME]`` as (path, name); the name defaults to the path's base name."""
    path, sep, name = text.rpartition("#")
    if not sep:
        return text, os.path.basename(text.rstrip("/"))
    return path, name


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"side file {what}: its name {name[:80]!r} is not a plain file name (letters, "
            "digits and ._+=@,- only, not starting with a dot, at most 200): give it one "
            "with --file PATH#NAME"
        )


def gather(job: LoadedJob, extra: Sequence[str]) -> list[Given]:
    """The job class's ``files`` (relative to the job file's directory) and the ``--file``
    arguments (relative to the current directory), each checked: a readable regular file,
    a plain name no other file has, all of them within MAX_TOTAL_BYTES. UsageError, one
    line naming the file, otherwise."""
    cls = job.cls
    declared = cls.files
    if isinstance(declared, str) or not all(isinstance(f, str) for f in declared):
        raise UsageError(
            f"{cls.__name__}.files must be a list of paths (str); got {str(declared)[:120]!r}"
        )
    base = job.ref.path().resolve().parent
    given: list[Given] = []
    for origin, texts, root in (
        (f"{cls.__name__}.files", declared, base),
        ("--file", extra, Path.cwd()),
    ):
        for text in texts:
            if not text.strip():
                raise UsageError(f"{origin}: a side file path is empty")
            path, name = parse_arg(text)
            full = root / os.path.expanduser(path)
            given.append(Given(full, name, origin))
    if len(given) > MAX_FILES:
        raise UsageError(f"a job may ship at most {MAX_FILES} side files; got {len(given)}")
    names: dict[str, Given] = {}
    total = 0
    for g in given:
        what = f"{g.path} ({g.origin})"
        _check_name(g.name, what)
        if g.name in names:
            raise UsageError(
                f"two side files are named {g.name!r}: {names[g.name].path} "
                f"({names[g.name].origin}) and {what}; "
                "name one otherwise with --file PATH#NAME"
            )
        names[g.name] = g
        total += _checked_size(g.path, what)
        if total > MAX_TOTAL_BYTES:
            raise UsageError(
                f"side files total more than {MAX_TOTAL_BYTES >> 30} GiB with {what}: every "
                "worker downloads them all; put large data in the input (or a store) instead"
            )
    return given


def _checked_size(path: Path, what: str) -> int:
    if not path.exists():
        raise UsageError(f"side file {what} does not exist: check the path")
    if path.is_dir():
        raise UsageError(
            f"side file {what} is a directory: ship files one by one (--file PATH), or an "
            "archive of the directory"
        )
    if not path.is_file():
        raise UsageError(f"side file {what} is not a regular file")
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise UsageError(f"side file {what} cannot be read: {exc.strerror or exc}") from None
    return path.stat().st_size


def _sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


async def stage(backend: Backend, job_id: str, given: Sequence[Given]) -> tuple[SideFile, ...]:
    """Hash and upload each file once to the job's side-file prefix; what the record lists."""
    prefix = side_files_url(backend.scratch, job_id)

    async def one(g: Given) -> SideFile:
        digest = await asyncio.to_thread(_sha256, g.path)
        size = g.path.stat().st_size
        await backend.blobs.upload_file(str(g.path), prefix + g.name)
        return SideFile(g.name, prefix + g.name, digest, size)

    return tuple([await one(g) for g in given])


def to_record(files: Sequence[SideFile]) -> list[list[Any]]:
    return [[f.name, f.url, f.sha256, f.size] for f in files]


def from_record(job_id: str, scratch: str, value: Any) -> tuple[SideFile, ...]:
    """The job record's ``files`` field, checked: WireError unless it is what submit writes
    (bounded count and sizes, plain unique names, each URL this job's own for its name)."""
    if value is None:
        return ()
    where = f"job record {job_id[:80]}: field 'files'"
    if not isinstance(value, list | tuple) or len(value) > MAX_FILES:
        raise WireError(f"{where} must be a list of at most {MAX_FILES} side files")
    prefix = side_files_url(scratch, job_id)
    out: list[SideFile] = []
    total = 0
    for row in value:
        if not isinstance(row, list | tuple) or len(row) != 4:
            raise WireError(f"{where}: a side file is not [name, url, sha256, size]")
        name, url, digest, size = row
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise WireError(f"{where}: a side file's name is not a plain file name")
        if url != prefix + name:
            raise WireError(f"{where}: side file {name!r} is not under the job's own side files")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise WireError(f"{where}: side file {name!r} has no sha256")
        if type(size) is not int or not 0 <= size <= MAX_TOTAL_BYTES:
            raise WireError(f"{where}: side file {name!r} has no size within 1 GiB")
        total += size
        if total > MAX_TOTAL_BYTES or any(f.name == name for f in out):
            raise WireError(f"{where}: side files repeat a name or exceed 1 GiB in all")
        out.append(SideFile(name, url, digest, size))
    return tuple(out)


# --- the worker: fetched once per job, checked, handed to the pool -------------------------


async def fetch(rt: Runtime, spec: JobSpec) -> str:
    """The local directory holding the job's side files ("" when it has none), fetched the
    first time a task of the job needs it; tasks running meanwhile wait for the same fetch.
    A file that changed since submit is a TaskError (permanent) naming it."""
    if not spec.files:
        return ""
    cache: dict[str, asyncio.Future[str]] = rt.side_files
    fut = cache.get(spec.job_id)
    if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
        # First, or the last try failed (a store error, or our task was cancelled): again.
        fut = asyncio.ensure_future(
            _fetch(rt.backend.blobs, spec, local_dir(rt.spool_dir, spec.job_id))
        )
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        cache[spec.job_id] = fut
    return await asyncio.shield(fut)


async def _fetch(blobs: Blobs, spec: JobSpec, into: str) -> str:
    await asyncio.to_thread(shutil.rmtree, into, True)
    os.makedirs(into)
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(f: SideFile) -> None:
        part = os.path.join(into, f".{f.name}.part")
        try:
            async with gate:
                size, digest = await _download(blobs, f, part)
            if (size, digest) != (f.size, f.sha256):
                if size > f.size:
                    what = f"it is larger than the {f.size:,} bytes submitted"
                elif size < f.size:
                    what = f"it holds {size:,} bytes, not the {f.size:,} submitted"
                else:
                    what = "its sha256 differs"
                raise TaskError(
                    f"side file {f.name} ({f.url}) is not the file submitted ({what}): it was "
                    "changed after submit; submit the job again"
                )
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise
        os.replace(part, os.path.join(into, f.name))

    try:
        async with TaskGroup() as tg:
            for f in spec.files:
                tg.create_task(one(f))
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    return into


async def _download(blobs: Blobs, f: SideFile, part: str) -> tuple[int, str]:
    """(size, sha256) of what the store holds at the file's URL, written to ``part`` in
    ranged reads of at most the size submitted, plus one byte that tells a larger object
    (then its size is told as the submitted size + 1, and nothing past it was written): an
    object swapped in after submit never fills the spool that spills need."""
    h = hashlib.sha256()
    got = 0
    with open(part, "wb") as out:
        while True:
            want = min(FETCH_PIECE, f.size + 1 - got)
            try:
                piece = await blobs.get_range(f.url, got, got + want)
            except BlobMissing:
                raise TaskError(
                    f"side file {f.name} ({f.url}) no longer exists: it was deleted after the "
                    "job was submitted"
                ) from None
            if got + len(piece) > f.size:
                return f.size + 1, ""  # larger than submitted: its extra byte is not kept
            # Written and hashed in a thread: a piece is up to 8 MiB, ~5 ms of sha256.
            await asyncio.to_thread(_write_hashed, out, h, piece)
            got += len(piece)
            if len(piece) < want:
                return got, h.hexdigest()


def _write_hashed(out: BinaryIO, h: Any, piece: bytes) -> None:
    out.write(piece)
    h.update(piece)


def forget(cache: dict[str, asyncio.Future[str]], spool_dir: str, job_id: str) -> None:
    """The worker is done with the job: drop its fetch and its local copies."""
    fut = cache.pop(job_id, None)
    if fut is not None and not fut.done():
        fut.cancel()
    shutil.rmtree(local_dir(spool_dir, job_id), ignore_errors=True)


# --- the pool: Job.file(name) --------------------------------------------------------------

# Where the job whose code this process runs keeps its side files ("": none, as on a
# client). A pool process runs one task at a time, and each task (and each job instance's
# setup) begins in cmr.cpu.instances.job_instance, which says so here: the engine's own
# state, never an attribute put on the user's object.
_serving = ""


def serve(files_dir: str) -> None:
    """The job whose code this process runs from now on keeps its side files in
    ``files_dir`` ("": it has none here)."""
    global _serving  # noqa: PLW0603 - a pool process runs one task at a time
    _serving = files_dir


def serving() -> str:
    """Where the job whose code this process runs keeps its side files ("": nowhere)."""
    return _serving


def path_in(job: Any, name: str) -> str:
    """The local path of the job's side file ``name`` (for ``Job.file``)."""
    where = _serving
    names = sorted(os.listdir(where)) if where and os.path.isdir(where) else []
    names = [n for n in names if not n.startswith(".")]
    if not isinstance(name, str) or name not in names:
        shipped = ", ".join(names) if names else "none"
        raise LookupError(
            f"{type(job).__name__}.file({name!r}): no side file of that name; this job's "
            f"side files: {shipped} (ship one with `files = [...]` or --file PATH[#NAME])"
        )
    return os.path.join(where, name)
