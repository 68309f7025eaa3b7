"""What a load test on an Azure target needs, found, created and removed, by the rules of
:mod:`cmr.loadgen.targets.resources`: a run deletes only what it created.

Azure has no tags on tables, so a table the run creates holds a marker entity of the run's
own (partition ``~cmr-loadgen-run``, row the run id: not hex, so no load key's partition);
a container it creates carries the run id as metadata ``cmr_loadgen_run`` (metadata names
are identifiers: no hyphens). Teardown deletes a created table or container only if the
marker still names the run. Otherwise it deletes exactly the keys the run's tasks wrote.
The account and its endpoints come from ``AZURE_STORAGE_CONNECTION_STRING`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

from cmr.aio import run_all
from cmr.backends.azure.clients import RETRY, connection_string
from cmr.backends.azure.errors import TABLE_MISSING, error_code, translated
from cmr.errors import BackendError
from cmr.loadgen.targets.azure_table import ROW, partition

MARK_PARTITION = "~cmr-loadgen-run"
METADATA = "cmr_loadgen_run"
FORGET_CONCURRENCY = 16  # deletes in flight when removing the run's keys


def _service(target: str) -> str:
    return "table" if target == "azure-table" else "blob"


@contextlib.asynccontextmanager
async def admin(target: str) -> AsyncIterator[Any]:
    """The account's table or blob service client, with cmr's bounded retries."""
    conn = connection_string()
    client: Any
    if target == "azure-table":
        from azure.data.tables.aio import TableServiceClient

        client = TableServiceClient.from_connection_string(conn, **RETRY)
    else:
        from azure.storage.blob.aio import BlobServiceClient

        client = BlobServiceClient.from_connection_string(conn, **RETRY)
    async with client:
        yield client


def failure(what: str, target: str, exc: AzureError) -> BackendError:
    """A failed prepare or clean-up as cmr's error for it, saying what was being done."""
    err = translated(_service(target), exc)
    return type(err)(f"{what}: {err}", service=err.service, operation=err.operation, code=err.code)


async def exists(target: str, client: Any, name: str) -> bool:
    if target == "azure-table":
        async for _ in client.query_tables(f"TableName eq '{name}'"):  # a checked name: no quote
            return True
        return False
    return bool(await client.get_container_client(name).exists())


async def create(target: str, client: Any, name: str, run: str) -> str | None:
    """Create the table or container marked as the run's; None: it exists (someone's)."""
    try:
        if target == "azure-table":
            table = await client.create_table(name)
            await table.create_entity({"PartitionKey": MARK_PARTITION, "RowKey": run})
        else:
            await client.create_container(name, metadata={METADATA: run})
    except ResourceExistsError:
        return None
    return run


async def is_ours(target: str, client: Any, name: str, run: str) -> bool | None:
    """Whether the resource still carries the run's marker (None: it is gone)."""
    try:
        if target == "azure-table":
            await client.get_table_client(name).get_entity(MARK_PARTITION, run)
            return True
        props = await client.get_container_client(name).get_container_properties()
    except ResourceNotFoundError as exc:
        if target == "azure-table" and error_code(exc) not in TABLE_MISSING:
            return False  # the table is there, the run's marker is not
        return None
    return bool(props.metadata.get(METADATA) == run)


async def delete(target: str, client: Any, name: str) -> None:
    with contextlib.suppress(ResourceNotFoundError):
        if target == "azure-table":
            await client.delete_table(name)
        else:
            await client.delete_container(name)


async def forget(target: str, client: Any, name: str, keys: Iterable[str]) -> None:
    """Delete the run's keys from a table or container it did not create."""
    table = target == "azure-table"
    owner = client.get_table_client(name) if table else client.get_container_client(name)
    gate = asyncio.Semaphore(FORGET_CONCURRENCY)
    await run_all(_remove(gate, owner, table, key) for key in keys)


async def _remove(gate: asyncio.Semaphore, owner: Any, table: bool, key: str) -> None:
    async with gate:
        with contextlib.suppress(ResourceNotFoundError):  # never written, or gone already
            if table:
                await owner.delete_entity(partition(key), ROW)
            else:
                await owner.delete_blob(key)
