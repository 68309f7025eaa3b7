"""How a large blob is cut into parts (S3's multipart upload, Azure's staged blocks): one
sizing for every store, so that a file costs about as many billed PUTs on each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from cmr.errors import BackendError

PART_BYTES = 8 * 1024 * 1024  # multipart upload part size (S3's minimum is 5 MiB)
PARTS_IN_FLIGHT = 4  # parts sent at once, while they fit in IN_FLIGHT_BYTES
MAX_PARTS = 10_000  # S3's most parts in one multipart upload (Azure takes 50,000 blocks)
# Each part is a PUT ($0.005 per 1,000): at 8 MiB, writing a TB costs $0.60 in parts alone,
# more than the whole of a cheap sort's bill (benchmarks/cloudsort.py). A large file is
# sent in about PARTS_WANTED parts, of at most GROWN_PART_BYTES (16 MiB parts at 1 GiB,
# 256 MiB from 16 GiB: a TB then costs $0.02 a pass).
PARTS_WANTED = 64
GROWN_PART_BYTES = 256 * 1024 * 1024
IN_FLIGHT_BYTES = 256 * 1024 * 1024  # an upload's parts held in memory at once, at most
# (one part, when a part is larger: a file past 2.5 TB)
MIB = 1024 * 1024


def part_bytes(size: int) -> int:
    """The part size of a file's multipart upload, in whole MiB: PART_BYTES for a file up
    to PART_BYTES x PARTS_WANTED (512 MiB), then growing with the file to about
    PARTS_WANTED parts, up to GROWN_PART_BYTES; and more only where S3's 10,000 parts
    would not hold the file otherwise (past 2.5 TB)."""
    grown = min(GROWN_PART_BYTES, -(-size // PARTS_WANTED))
    least = -(-size // MAX_PARTS)
    return max(PART_BYTES, -(-max(grown, least) // MIB) * MIB)


def stream_part_bytes(size_hint: int, sent: int) -> int:
    """The next part of a streamed upload that has sent ``sent`` bytes: sized for the
    hint, or, past it, as if the stream were four times what it has sent. Four, not two:
    growing that fast, a stream with no hint reaches S3's largest object (5 TiB) within
    MAX_PARTS parts; at twice it would stop at 3.25 TiB."""
    return part_bytes(max(size_hint, 4 * sent))


async def _fill(stream: AsyncIterator[bytes], buf: bytearray, want: int) -> bool:
    """Add ``stream``'s chunks to ``buf`` until it holds ``want`` bytes; True once the
    stream has ended."""
    while len(buf) < want:
        try:
            buf += await anext(stream)
        except StopAsyncIteration:
            return True
    return False


def parts_in_flight(step: int) -> int:
    """How many parts of ``step`` bytes an upload sends at once: PARTS_IN_FLIGHT while they
    fit in IN_FLIGHT_BYTES, down to one."""
    return max(1, min(PARTS_IN_FLIGHT, IN_FLIGHT_BYTES // step))


async def send_parts(
    stream: AsyncIterator[bytes],
    buf: bytearray,
    size_hint: int,
    send: Callable[[int, bytes], Coroutine[Any, Any, None]],
    too_many: Callable[[int], str],
) -> tuple[int, int]:
    """Cut a streamed upload (``buf``, then the rest of ``stream``) into parts of
    ``stream_part_bytes`` and ``send`` each with its number (from 1), at most
    PARTS_IN_FLIGHT of them and IN_FLIGHT_BYTES (one part, when larger) in flight; (the
    bytes sent, the parts). Past MAX_PARTS, BackendError(``too_many(sent)``). A failed
    part's error is raised as itself, once every other part in flight is cancelled."""
    running: dict[asyncio.Task[None], int] = {}  # part -> its bytes

    async def settle(room: int) -> None:
        """Wait until ``room`` more bytes fit among the parts in flight."""
        while running and (
            len(running) >= PARTS_IN_FLIGHT or sum(running.values()) + room > IN_FLIGHT_BYTES
        ):
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                del running[task]
                task.result()

    ended = False
    sent = number = 0
    try:
        while True:
            step = stream_part_bytes(size_hint, sent)
            if not ended and len(buf) < step:
                ended = await _fill(stream, buf, step)
            if not buf:
                break
            data = bytes(memoryview(buf)[:step])  # a whole part, or the last: one copy
            del buf[: len(data)]
            number += 1
            if number > MAX_PARTS:
                raise BackendError(too_many(sent))
            await settle(len(data))
            running[asyncio.create_task(send(number, data))] = len(data)
            sent += len(data)
        await settle(IN_FLIGHT_BYTES + 1)  # every part sent
    except BaseException:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
    return sent, number
