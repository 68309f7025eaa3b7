"""The digest cmr names its own bytes by: BLAKE3, 256 bits, written as 64 hex digits.

It is what a reduce commit records of its output (and the next pipeline step checks), what
a blob-shuffle page records of each partition's part, and what a spilled batch carries of
its blob. A sort hashes every byte it writes and every byte of its shuffle twice, so the
hash's speed is the sort's: one core hashes ~3.6 GB/s with BLAKE3 and 0.22 GB/s with
sha256 where it has no SHA extensions (this project's machines), which was ~7 CPU
seconds of every GB a TeraSort sorted through S3. BLAKE3 is a cryptographic hash all the
same: a bucket writer cannot make other bytes that match a recorded digest.

What users hash themselves stays sha256 (a job's source, side files, the fleet's wheel):
``sha256sum`` checks those by hand."""

from __future__ import annotations

import asyncio

import blake3

NAME = "blake3"  # a reduce commit's field for its output's digest
# Said where a digest differs: workers before BLAKE3 (2026-11-28) hashed with sha256.
MIXED_VERSIONS = "run one version of cmr on every worker of a job"
HEX_LEN = 64
ON_LOOP = 4 * 1024 * 1024  # bytes hashed on the event loop (~1 ms); more go to a thread


def new() -> blake3.blake3:
    """A running digest (``update``, ``digest``, ``hexdigest``)."""
    return blake3.blake3()


def hex_of(data: bytes | bytearray | memoryview) -> str:
    return blake3.blake3(data).hexdigest()


async def hex_async(data: bytes) -> str:
    """``data``'s digest (hex), in a thread when it is large: blake3 lets go of the GIL
    there, so the loop keeps serving while a big spill or step output is checked."""
    if len(data) <= ON_LOOP:
        return hex_of(data)
    return await asyncio.to_thread(hex_of, data)


def is_hex(value: object) -> bool:
    """Whether ``value`` is written as a digest is: 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == HEX_LEN and not value.strip("0123456789abcdef")
