"""Down or slow: whether anything accepts connections at an endpoint, told apart in a
bounded time and before a cloud's SDK loads (each backend words what it found).

A refused connection, a host that does not resolve, no route: the store is *down*, and
that is known at once. A connection that does not complete is the store being *slow* (a
loaded emulator's full accept queue drops connects for seconds): it is tried again, with
backoff, until the deadline, and only then given up on, as slow.
"""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlparse

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

CONNECT_SECONDS = 2.0  # one attempt; the kernel retries a dropped SYN after 1 s itself


def place(url: str) -> tuple[str, int]:
    """The (host, port) a URL connects to."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return parsed.hostname or "", port


async def _connect_once(host: str, port: int) -> None:
    """One connection to any address of the host; refused only when every one refuses."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            # Not wait_for: 3.11's can lose a cancellation that comes as the connect does.
            async with asyncio.timeout(CONNECT_SECONDS):
                await loop.sock_connect(sock, address)
        except OSError as exc:
            # One address that times out makes it slow, whatever the others said (localhost:
            # ::1 refuses while a stalled server holds 127.0.0.1).
            if not isinstance(error, TimeoutError):
                error = exc
        else:
            return
        finally:
            sock.close()
    raise error or OSError(f"no address for {host}")


async def connect(url: str, deadline: float) -> None:
    """Connect once to ``url``'s host and port, a slow one tried again until ``deadline``
    (``time.monotonic()``). Raises TimeoutError (slow), socket.gaierror (no such host),
    ConnectionRefusedError or another OSError (down)."""
    host, port = place(url)
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(TimeoutError),
        wait=wait_exponential(multiplier=0.1, max=1.0),
        stop=stop_after_delay(max(deadline - time.monotonic(), 0.0)),
        reraise=True,
    ):
        with attempt:
            await _connect_once(host, port)
