"""Down or slow: whether anything accepts connections at the endpoints the environment
names, told apart in a bounded time (:mod:`cmr.backends.reach`) and before botocore's
clients (a second of CPU) load, and said in AWS's terms.

Only endpoints set by ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>`` are looked at
(LocalStack, moto, a proxy); AWS's own endpoints are left to the probe, which botocore
makes (:mod:`cmr.backends.aws.provisioning`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from cmr.backends.aws.calls import _all
from cmr.backends.aws.errors import down_message, slow_message
from cmr.backends.reach import connect, place
from cmr.errors import Unreachable

# From opening the store to its answer, at most: the bound on telling 'slow' from 'down'.
PROBE_SECONDS = 10.0
SERVICES = ("sqs", "s3", "dynamodb")


def configured(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """service -> endpoint URL, as botocore reads them from the environment."""
    if environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return {}
    urls = {s: environ.get(f"AWS_ENDPOINT_URL_{s.upper()}") or "" for s in SERVICES}
    common = environ.get("AWS_ENDPOINT_URL", "")
    return {s: url or common for s, url in urls.items() if url or common}


async def _reach(url: str, services: list[str], deadline: float) -> None:
    names = ", ".join(services)
    try:
        await connect(url, deadline)
    except TimeoutError:
        raise Unreachable(
            slow_message(names, url, "it accepted no connection", PROBE_SECONDS)
        ) from None
    except socket.gaierror:
        host = place(url)[0]
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
        places.setdefault(place(url), (url.rstrip("/"), []))[1].append(service)
    # The first to fail ends the wait: a down endpoint is not held up by a slow one.
    await _all(_reach(url, services, deadline) for url, services in places.values())
