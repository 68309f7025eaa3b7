"""Azure Table storage: get = Query Entity (a point read), put = Insert Or Replace Entity.

Azure Table reads are always strong (one primary serves every read; seed 004 measured
every read fresh), so "consistent" and eventual reads are the same call and are reported
as "plain", as s3's are. Each key is an entity of its own partition: PartitionKey is the
hex of the key's UTF-8 bytes (Azure's keys refuse ``/``, which the load's keys hold, and
hex keeps their order, as cmr's Azure table stores its keys), RowKey is empty; the value
is the Int64 property ``v``.

Azure's only write conditions are an ETag (If-Match) and absence (Insert Entity, which
fails if the entity exists): there is no condition on an attribute. The two styles of
:mod:`cmr.loadgen.targets`, then:

- ``"absent"``: DynamoDB's always-true condition has no one-request counterpart. This
  target does what cmr's Azure table does for any DynamoDB condition: it reads the entity,
  finds the fictitious attribute absent (always), and writes If-Match the ETag it read
  (Insert Entity when there was none). Two requests, so a conditional put's latency is a
  read's plus a write's; and the condition can fail where DynamoDB's never does, when
  another writer's write lands between the read and the write (concurrent writers of one
  key see some ``conditional_failed``; that is what the engine's conditional writes meet).
- ``"version"``: If-Match the ETag this target last saw for the key (read or written);
  Insert Entity when it has seen none. A failure (412, or 409 on the insert, or 404 for an
  entity deleted since) is followed by a read that refreshes the ETag, as DynamoDB's
  failure returns the item: that read is part of the failed put's latency.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EdmType, EntityProperty, UpdateMode
from azure.data.tables.aio import TableClient

from cmr.backends.azure.errors import TABLE_MISSING, error_code
from cmr.loadgen.targets.aws import _need
from cmr.loadgen.targets.azure import AzureTarget, failed
from cmr.loadgen.targets.base import VALUE, Condition, Reply, _int

ROW = ""  # every key is a partition of one entity


def partition(key: str) -> str:
    """The PartitionKey of a load key."""
    return key.encode("utf-8").hex()


def _value(prop: Any) -> int | None:
    """The value of a ``v`` property (the SDK gives Int64 as an EntityProperty)."""
    raw = getattr(prop, "value", prop)
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    return _int(raw.encode()) if isinstance(raw, str) else None


def _lost_condition(exc: AzureError) -> bool:
    """A conditional write refused because the entity is not as this target saw it."""
    if isinstance(exc, ResourceModifiedError | ResourceExistsError):
        return True
    # If-Match on an entity deleted since: 404 ResourceNotFound (a missing table is not this)
    return isinstance(exc, ResourceNotFoundError) and error_code(exc) not in TABLE_MISSING


class AzureTableTarget(AzureTarget):
    service = "table"
    name = "azure-table"

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.table = _need(resources, "table", self.name)
        self.condition: Condition = condition
        self._etags: dict[str, str] = {}  # the ETag this target last saw per key

    def _open(self, conn: str, options: dict[str, Any]) -> TableClient:
        return TableClient.from_connection_string(conn, self.table, **options)

    async def _read(self, key: str) -> int | None:
        """The key's value (None: no entity), remembering its ETag."""
        try:
            entity = await self._client.get_entity(partition(key), ROW)
        except ResourceNotFoundError as exc:
            if error_code(exc) in TABLE_MISSING:
                raise
            self._etags.pop(key, None)
            return None
        self._etags[key] = entity.metadata["etag"]
        return _value(entity.get(VALUE))

    async def get(self, key: str, consistent: bool = False) -> Reply:
        with self._sending() as sent:
            try:
                value = await self._read(key)
            except AzureError as exc:
                raise failed(self.service, exc, sent[0] - 1) from exc
        return Reply(value, sent[0] - 1)

    async def _write_if(self, key: str, entity: dict[str, Any]) -> Mapping[str, Any]:
        """Insert the entity if this target saw none, else replace it If-Match its ETag."""
        seen = self._etags.get(key)
        if seen is None:
            got: Mapping[str, Any] = await self._client.create_entity(entity)
            return got
        return await self._client.update_entity(  # type: ignore[no-any-return]
            entity,
            mode=UpdateMode.REPLACE,
            etag=seen,
            match_condition=MatchConditions.IfNotModified,
        )

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        entity = {
            "PartitionKey": partition(key),
            "RowKey": ROW,
            VALUE: EntityProperty(value, EdmType.INT64),
        }
        planned = 2 if conditional and self.condition == "absent" else 1
        with self._sending() as sent:
            try:
                if not conditional:
                    got = await self._client.upsert_entity(entity, mode=UpdateMode.REPLACE)
                else:
                    if self.condition == "absent":
                        await self._read(key)  # the fictitious attribute: absent, always
                    got = await self._write_if(key, entity)
            except AzureError as exc:
                if not (conditional and _lost_condition(exc)):
                    raise failed(self.service, exc, max(0, sent[0] - planned)) from exc
                await self._refresh(key)
                retries = max(0, sent[0] - planned - 1)
                raise failed(self.service, exc, retries, "conditional_failed") from exc
        self._etags[key] = got["etag"]
        return Reply(None, max(0, sent[0] - planned))

    async def _refresh(self, key: str) -> None:
        """Learn the key's current ETag after a lost condition (best effort)."""
        try:
            await self._read(key)
        except AzureError:
            self._etags.pop(key, None)
