"""Fenced publication: a job's parts become *the* output in one conditional step.

An output place (a directory, or an S3 prefix) holds::

    _SUCCESS                 the manifest: which job's output this is, and its parts
    part-00000-<job id>      the parts of that job, one per partition
    ...

Publishing copies each committed part (server-side) to a name that carries the job id, so no
write of one job can ever land on another job's part, however late or paused its publisher.
Then one conditional write of ``_SUCCESS`` (S3's If-Match / If-None-Match, or the same on a
locked directory) makes them the output: it succeeds only if the manifest is still the one
seen when the job was submitted (or absent, for a new output). Of two jobs racing for one
output, exactly one writes its manifest; the other fails with a clear message and removes its
parts. Only once the new manifest stands are the parts it replaced deleted, so ``--overwrite``
never loses the old output to a job that fails.

The contract for a reader: read ``_SUCCESS``; the parts it lists are the output of the one job
it names, complete. A place without ``_SUCCESS`` holds no complete output. Files it does not
list are leftovers (of a replaced output, being deleted; or of a job that lost a race) and are
not part of the output. A reader that started on a manifest that has since been replaced may
find a listed part gone: it reads ``_SUCCESS`` again and starts over.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cmr.backends.base import Blobs
from cmr.errors import BlobMissing, CmrError, ConditionFailed

MANIFEST = "_SUCCESS"
PUBLISH_CONCURRENCY = 32  # copies in flight: thousands of parts, one request each
_PART = re.compile(r"^part-\d{5}(-[0-9A-Za-z-]{1,64})?$")


class OutputConflict(CmrError):
    """Another job published to the output place after this job was submitted."""


def part_name(job_id: str, p: int) -> str:
    return f"part-{p:05d}-{job_id}"


def is_part(name: str) -> bool:
    """A name a cmr part can have (today's, or the job-less ``part-00000`` of old outputs)."""
    return bool(_PART.match(name))


def manifest_url(output: str) -> str:
    return output + MANIFEST


@dataclass(frozen=True)
class Part:
    name: str
    records: int
    bytes: int
    attempt: str = ""  # which committed reduce attempt it is (provenance, for people)


@dataclass(frozen=True)
class Manifest:
    job: str
    parts: tuple[Part, ...]
    finished: float  # when the job started publishing (the same for every publisher)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.parts)

    def to_bytes(self) -> bytes:
        # Deterministic: two publishers of one job write the very same bytes.
        doc = {
            "cmr": 1,
            "job": self.job,
            "finished": self.finished,
            "records": self.records,
            "bytes": sum(p.bytes for p in self.parts),
            "parts": [
                {"name": p.name, "records": p.records, "bytes": p.bytes, "attempt": p.attempt}
                for p in self.parts
            ],
        }
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    @staticmethod
    def from_bytes(data: bytes) -> Manifest:
        try:
            doc: Any = json.loads(data)
            parts = tuple(
                Part(str(p["name"]), int(p["records"]), int(p["bytes"]), str(p.get("attempt", "")))
                for p in doc["parts"]
            )
            if not all(is_part(p.name) for p in parts):
                raise ValueError("a part name is not part-NNNNN[-job]")
            return Manifest(str(doc["job"]), parts, float(doc["finished"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise OutputConflict(f"{MANIFEST} is not a cmr manifest ({exc})") from None


async def read_manifest(blobs: Blobs, output: str) -> tuple[Manifest | None, str | None]:
    """The manifest at an output place and its etag; (None, None) when there is none."""
    try:
        data, etag = await blobs.get_with_etag(manifest_url(output))
    except BlobMissing:
        return None, None
    return Manifest.from_bytes(data), etag


async def existing_parts(blobs: Blobs, output: str) -> list[str]:
    """Names of the part files directly under an output place."""
    found = await blobs.list(output)
    names = [b.url[len(output) :] for b in found]
    return sorted(n for n in names if "/" not in n and is_part(n))


@dataclass(frozen=True)
class Source:
    partition: int
    url: str  # the committed attempt output
    records: int
    bytes: int
    attempt: str = ""  # default: the URL's last segment (an attempt output's own name)
    # What the part's bytes hash to (cmr.digest, hex), as its reduce commit recorded: a
    # pipeline's next step reads the part only if it still does. "": not known (a part
    # read back from a published manifest).
    digest: str = ""


Transfer = Callable[[str, str], Awaitable[None]]  # (source URL, destination URL)


async def publish(
    dest: Blobs,
    transfer: Transfer,
    *,
    job_id: str,
    output: str,
    sources: Sequence[Source],
    replaces: str | None,
    finished: float,
    after_copy: Callable[[], Awaitable[None]] | None = None,
) -> Manifest:
    """Copy the parts into place and write the manifest if the output is still the one the job
    replaces (``replaces``: its manifest etag, None for a place without one). Idempotent:
    a second publisher of the same job writes the same names and bytes. Raises
    OutputConflict when another job's manifest got there first."""
    manifest = Manifest(
        job_id,
        tuple(
            Part(
                part_name(job_id, s.partition),
                s.records,
                s.bytes,
                s.attempt or s.url.rsplit("/", 1)[-1],
            )
            for s in sorted(sources, key=lambda s: s.partition)
        ),
        finished,
    )
    current, etag = await read_manifest(dest, output)
    if current is not None and current.job == job_id:
        return current  # published already, by another finalizer
    if etag != replaces:
        raise _conflict(output, current, job_id)
    gate = asyncio.Semaphore(PUBLISH_CONCURRENCY)

    async def place(s: Source) -> None:
        async with gate:
            await transfer(s.url, output + part_name(job_id, s.partition))

    await asyncio.gather(*(place(s) for s in sources))
    if after_copy is not None:
        await after_copy()
    try:
        await dest.put_if(manifest_url(output), manifest.to_bytes(), etag=replaces)
    except ConditionFailed:
        current, _ = await read_manifest(dest, output)
        if current is None or current.job != job_id:  # not our own write, answered late
            raise _conflict(output, current, job_id) from None
    return manifest


def _conflict(output: str, current: Manifest | None, job_id: str) -> OutputConflict:
    who = f"job {current.job}" if current is not None else "another job (and then removed)"
    return OutputConflict(
        f"the output {output} was published by {who} after job {job_id} was submitted; "
        f"this job's output was not published. Rerun it into another place, or with "
        f"--overwrite to replace that output."
    )


async def remove_parts(dest: Blobs, output: str, names: Sequence[str]) -> None:
    """Delete these parts from the output place, never one the live manifest lists."""
    if not names:
        return
    current, _ = await read_manifest(dest, output)
    live = {p.name for p in current.parts} if current is not None else set()
    await dest.delete([output + n for n in names if n not in live])
