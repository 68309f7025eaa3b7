"""SimpleDB: GetAttributes with ConsistentRead; PutAttributes with Expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cmr.loadgen.targets.aws import _AwsTarget, _need
from cmr.loadgen.targets.base import (
    NEVER,
    VALUE,
    VERSION,
    Condition,
    Reply,
    _int,
    _retries_of,
)


class SimpleDBTarget(_AwsTarget):
    service = "sdb"
    name = "simpledb"
    consistent_reads = True
    conditional_writes = True

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.domain = _need(resources, "domain", self.name)
        self.condition: Condition = condition
        self._versions: dict[str, int] = {}

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "get_attributes",
            DomainName=self.domain,
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
            DomainName=self.domain,
            ItemName=key,
            Attributes=[
                {"Name": VALUE, "Value": str(value), "Replace": True},
                {"Name": VERSION, "Value": str((seen or 0) + 1), "Replace": True},
            ],
            **kwargs,
        )
        self._versions[key] = (seen or 0) + 1
        return Reply(None, _retries_of(got))
