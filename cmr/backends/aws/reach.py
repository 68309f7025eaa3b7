"""Down or slow: whether anything accepts connections at the endpoints the environment
names, told apart in a bounded time and before botocore's clients (a second of CPU) load.

A refused connection, a host that does not resolve, no route: the store is *down*, and
that is said at once. A connection that does not complete is the store being *slow* (a
loaded LocalStack's full accept queue drops connects for seconds): it is tried again,
with backoff, until the deadline, and only then reported, as slow.

Only endpoints set by ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>`` are looked at
(LocalStack, moto, a proxy); AWS's own endpoints are left to the probe, which botocore
makes (:mod:`cmr.backends.aws.provisioning`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from urllib.parse import urlparse

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cmr.backends.aws.calls import _all
from cmr.backends.aws.errors import down_message, slow_message
from cmr.errors import Unreachable

# From opening the store to its answer, at most: the bound on telling 'slow' from 'down'.
PROBE_SECONDS = 10.0
SERVICES = ("sqs", "s3", "dynamodb")
_CONNECT_SECONDS = 2.0  # one attempt; the kernel retries a dropped SYN after 1 s itself


def configured(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """service -> endpoint URL, as botocore reads them from the environment."""
    if environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return {}
    urls = {s: environ.get(f"AWS_ENDPOINT_URL_{s.upper()}") or "" for s in SERVICES}
    common = environ.get("AWS_ENDPOINT_URL", "")
    return {s: url or common for s, url in urls.items() if url or common}


def _place(url: str) -> tuple[str, int]:
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
            async with asyncio.timeout(_CONNECT_SECONDS):
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


async def _reach(url: str, services: list[str], deadline: float) -> None:
    host, port = _place(url)
    names = ", ".join(services)
    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TimeoutError),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            stop=stop_after_delay(max(deadline - time.monotonic(), 0.0)),
            reraise=True,
        ):
            with attempt:
                await _connect_once(host, port)
    except TimeoutError:
        raise Unreachable(
            slow_message(names, url, "it accepted no connection", PROBE_SECONDS)
        ) from None
    except socket.gaierror:
        raise Unreachable(down_message(names, url, f"host {host} does not resolve")) from None
    except ConnectionRefusedError:
        raise Unreachable(down_message(names, url, "nothing is listening there")) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise Unreachable(down_message(names, url, f"no connection ({why})")) from None


async def preflight(deadline: float, environ: Mapping[str, str] = os.environ) -> None:
    """Raise :class:`Unreachable` if an endpoint the environment names is down (at once)
    or accepts no connection by ``deadline`` (``time.monotonic()``): then it is slow."""
    # One connection per (host, port), named by the first URL that points there.
    places: dict[tuple[str, int], tuple[str, list[str]]] = {}
    for service, url in configured(environ).items():
        places.setdefault(_place(url), (url.rstrip("/"), []))[1].append(service)
    # The first to fail ends the wait: a down endpoint is not held up by a slow one.
    await _all(_reach(url, services, deadline) for url, services in places.values())
