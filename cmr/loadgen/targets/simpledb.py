"""SimpleDB: GetAttributes with ConsistentRead; PutAttributes with Expected."""

from __future__ import annotations

from typing import Any

from cmr.loadgen.targets.aws import KeyedTarget
from cmr.loadgen.targets.base import (
    NEVER,
    VALUE,
    VERSION,
    Reply,
    _int,
    _retries_of,
)


class SimpleDBTarget(KeyedTarget):
    service = "sdb"
    name = "simpledb"
    resource = "domain"

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "get_attributes",
            DomainName=self.store,
            ItemName=key,
            AttributeNames=[VALUE, VERSION],
            ConsistentRead=consistent,
        )
        attrs = {a["Name"]: a["Value"] for a in got.get("Attributes", [])}
        if VERSION in attrs:
            self._versions[key] = int(attrs[VERSION])
        value = _int(attrs[VALUE].encode()) if VALUE in attrs else None
        return Reply(value, _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        seen = self._versions.get(key)
        kwargs: dict[str, Any] = {}
        if conditional and self.condition == "absent":
            kwargs["Expected"] = {"Name": NEVER, "Exists": False}
        elif conditional and seen is None:
            kwargs["Expected"] = {"Name": VERSION, "Exists": False}
        elif conditional:
            kwargs["Expected"] = {"Name": VERSION, "Value": str(seen), "Exists": True}
        got = await self._call(
            "put_attributes",
            DomainName=self.store,
            ItemName=key,
            Attributes=[
                {"Name": VALUE, "Value": str(value), "Replace": True},
                {"Name": VERSION, "Value": str((seen or 0) + 1), "Replace": True},
            ],
            **kwargs,
        )
        self._versions[key] = (seen or 0) + 1
        return Reply(None, _retries_of(got))
