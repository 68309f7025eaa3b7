"""DynamoDB: GetItem with or without ConsistentRead; PutItem with or without a condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cmr.loadgen.targets.aws import KeyedTarget
from cmr.loadgen.targets.base import (
    KEY,
    NEVER,
    VALUE,
    VERSION,
    OpFailed,
    Reply,
    _retries_of,
)


class DynamoDBTarget(KeyedTarget):
    service = "dynamodb"
    name = "dynamodb"
    resource = "table"

    def _remember(self, key: str, item: Mapping[str, Any] | None) -> int | None:
        if not item:
            return None
        if VERSION in item:
            self._versions[key] = int(item[VERSION]["N"])
        return int(item[VALUE]["N"]) if VALUE in item else None

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "get_item", TableName=self.store, Key={KEY: {"S": key}}, ConsistentRead=consistent
        )
        return Reply(self._remember(key, got.get("Item")), _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        seen = self._versions.get(key)
        item = {
            KEY: {"S": key},
            VALUE: {"N": str(value)},
            VERSION: {"N": str((seen or 0) + 1)},
        }
        kwargs: dict[str, Any] = {}
        if conditional and self.condition == "absent":
            kwargs = {
                "ConditionExpression": "attribute_not_exists(#c)",
                "ExpressionAttributeNames": {"#c": NEVER},
            }
        elif conditional and seen is None:
            kwargs = {
                "ConditionExpression": "attribute_not_exists(#c)",
                "ExpressionAttributeNames": {"#c": VERSION},
            }
        elif conditional:
            kwargs = {
                "ConditionExpression": "#c = :seen",
                "ExpressionAttributeNames": {"#c": VERSION},
                "ExpressionAttributeValues": {":seen": {"N": str(seen)}},
            }
        if kwargs:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            got = await self._call("put_item", TableName=self.store, Item=item, **kwargs)
        except OpFailed as exc:
            if exc.kind == "conditional_failed":
                self._remember(key, exc.response.get("Item"))
            raise
        self._versions[key] = (seen or 0) + 1
        return Reply(None, _retries_of(got))
