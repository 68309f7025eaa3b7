"""Opening the azure backend: the connection string's endpoints reached (nothing listening is
said at once, not after the SDK's retries), the store URL's account checked against the
connection string's, one client per service, and the container and table made if they are
missing (and allowed to be).

Azurite is this backend with other endpoints in AZURE_STORAGE_CONNECTION_STRING: nothing
here knows about it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from azure.core.exceptions import ResourceExistsError

from cmr.aio import run_all
from cmr.backends.azure.blobs import AzureBlobs
from cmr.backends.azure.clients import SETTING, connection_string
from cmr.backends.azure.errors import translate
from cmr.backends.azure.queues import AzureQueues
from cmr.backends.azure.table import AzureTable
from cmr.backends.base import REMOTE, Backend
from cmr.backends.embedded.blobs import EmbeddedBlobs
from cmr.backends.reach import connect, place
from cmr.errors import StoreMissing, Unreachable, UsageError
from cmr.settings import AwsSettings

PROBE_SECONDS = 10.0  # a connection that takes longer than this is an endpoint not answering
SERVICES = ("blob", "queue", "table")


def settings_of(conn: str) -> dict[str, str]:
    """The key=value pairs of a connection string (keys as Azure spells them)."""
    pairs: dict[str, str] = {}
    for part in conn.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key:
            pairs[key.strip()] = value.strip()
    return pairs


def endpoints(conn: str) -> dict[str, str]:
    """Each service's endpoint: named in the string (``BlobEndpoint=``, Azurite's way), or
    made from the account and the endpoint suffix (Azure's ``<account>.blob.core.windows.net``)."""
    pairs = settings_of(conn)
    account = pairs.get("AccountName", "")
    protocol = pairs.get("DefaultEndpointsProtocol", "https")
    suffix = pairs.get("EndpointSuffix", "core.windows.net")
    return {
        s: pairs.get(f"{s.capitalize()}Endpoint") or f"{protocol}://{account}.{s}.{suffix}"
        for s in SERVICES
    }


async def reach(conn: str) -> None:
    """Connect to each service's endpoint once (:mod:`cmr.backends.reach`): refused or
    unresolvable is an Unreachable at once, and one accepting no connection by
    PROBE_SECONDS is one too, each naming the endpoint (the SDK would retry for ~17 s
    first, then say less)."""
    deadline = time.monotonic() + PROBE_SECONDS

    async def one(service: str, url: str) -> None:
        try:
            await connect(url, deadline)
        except TimeoutError:
            why = f"no connection accepted within {PROBE_SECONDS:g} s"
        except socket.gaierror:
            why = f"host {place(url)[0]} does not resolve"
        except OSError as exc:
            why = exc.strerror or str(exc)
        else:
            return
        raise Unreachable(
            f"cannot reach Azure {service} storage at {url}: {why}; is the endpoint in "
            f"{SETTING} right (for Azurite: is the local stack running? "
            "`scripts/stack.sh start`)?"
        )

    await run_all(one(s, u) for s, u in endpoints(conn).items())


async def _ensure(blobs: AzureBlobs, table: AzureTable, settings: AwsSettings) -> None:
    container = blobs.container(settings.bucket)
    if settings.create:
        # Ours inside: translate would make the answer "it exists" a BackendError first.
        with translate("blob", settings.bucket), contextlib.suppress(ResourceExistsError):
            await container.create_container()
        await table.create()
        return
    with translate("blob", settings.bucket):
        found = await container.exists()
    if not found:
        raise StoreMissing(
            "container",
            settings.bucket,
            f"no container {settings.bucket!r} in Azure storage account {blobs.account!r}: "
            "run a job there first (it creates the container), or name another store",
        )
    if not await table.exists():
        raise StoreMissing(
            "table",
            settings.table,
            f"no table {settings.table!r} in Azure storage account {blobs.account!r}: run a "
            "job there first (it creates the table), or name another store",
        )


@asynccontextmanager
async def open_azure(settings: AwsSettings) -> AsyncIterator[Backend]:
    """The azure backend on the account of AZURE_STORAGE_CONNECTION_STRING."""
    conn = connection_string()
    account = settings_of(conn).get("AccountName", "")
    if settings.account and settings.account != account:
        raise UsageError(
            f"the store names Azure storage account {settings.account!r}, but {SETTING} "
            f"opens {account!r}: set {SETTING} for that account, or name {account!r}"
        )
    await reach(conn)
    async with AsyncExitStack() as stack:
        queues = await stack.enter_async_context(AzureQueues(conn))
        blobs = await stack.enter_async_context(AzureBlobs(conn))
        table = await stack.enter_async_context(AzureTable(settings.table, conn))
        await _ensure(blobs, table, settings)
        yield Backend(
            name="azure",
            queues=queues,
            blobs=blobs,
            table=table,
            scratch=blobs.url(settings.bucket, "cmr"),
            capabilities=REMOTE,
            local_blobs=EmbeddedBlobs(),  # local outputs: inspected, and fetched into
        )
