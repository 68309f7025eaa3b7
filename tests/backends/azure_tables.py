"""What the Azure table's own tests share: its entities as Azure holds them (locks and
images included). Clients of the session's table: the ``tables`` fixture (conftest)."""

from __future__ import annotations

import os
from typing import Any


def raw_entities(table: str, pk: str) -> list[dict[str, Any]]:
    """The entities of an item partition as Azure holds them (locks and images included)."""
    from azure.data.tables import TableServiceClient

    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    with TableServiceClient.from_connection_string(conn) as s:
        client = s.get_table_client(table)
        hexed = pk.encode().hex()
        return [dict(e) for e in client.query_entities(f"PartitionKey eq '{hexed}'")]


def locks(table: str, *pks: str) -> list[str]:
    """The locks held in these partitions: none once every transaction is finished."""
    return [f"{pk}: {e.get('lk')}" for pk in pks for e in raw_entities(table, pk) if "lk" in e]
