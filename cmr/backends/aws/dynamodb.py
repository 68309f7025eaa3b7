"""The table protocol on DynamoDB: our conditions and updates as expressions, our values in
DynamoDB's typed form and back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from cmr.backends.aws.calls import counting
from cmr.backends.aws.errors import translate as _translate
from cmr.backends.base import (
    AllOf,
    AnyOf,
    Check,
    Condition,
    Delete,
    Eq,
    Item,
    Lt,
    Missing,
    Present,
    Put,
    TxWrite,
    Update,
    check_start,
)
from cmr.errors import UsageError

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _to_dynamo(value: Any) -> Any:
    """Our value types in the forms TypeSerializer accepts (it refuses float and tuple)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        # repr is the shortest string that reads back as the same float.
        return Decimal(repr(value))
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list | tuple):
        return [_to_dynamo(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Binary):
        return bytes(value.value)
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    return value


def _serialize(value: Any) -> Any:
    try:
        return _serializer.serialize(_to_dynamo(value))
    except (TypeError, ArithmeticError) as exc:
        raise UsageError(f"cannot store {value!r} in DynamoDB: {exc}") from exc


def _serialize_item(item: Item) -> dict[str, Any]:
    return {k: _serialize(v) for k, v in item.items()}


def _deserialize_item(raw: dict[str, Any]) -> Item:
    return {k: _from_dynamo(_deserializer.deserialize(v)) for k, v in raw.items()}


class _Expr:
    """Collects #n/:v placeholders while condition and update expressions are built."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attr: str) -> str:
        for placeholder, known in self.names.items():
            if known == attr:
                return placeholder
        placeholder = f"#n{len(self.names)}"
        self.names[placeholder] = attr
        return placeholder

    def value(self, value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = _serialize(value)
        return placeholder

    def condition(self, cond: Condition) -> str:
        match cond:
            case Missing(attr):
                return f"attribute_not_exists({self.name(attr)})"
            case Present(attr):
                return f"attribute_exists({self.name(attr)})"
            case Eq(attr, value):
                return self._typed(attr, "=", value)
            case Lt(attr, value):
                return self._typed(attr, "<", value)
            case AllOf(parts) | AnyOf(parts) if not parts:
                # DynamoDB has no literal true/false: an empty AllOf holds, an empty AnyOf not.
                pk = self.name("pk")
                joint = "OR" if isinstance(cond, AllOf) else "AND"
                return f"(attribute_exists({pk}) {joint} attribute_not_exists({pk}))"
            case AllOf(parts):
                return "(" + " AND ".join(self.condition(p) for p in parts) + ")"
            case AnyOf(parts):
                return "(" + " OR ".join(self.condition(p) for p in parts) + ")"
        raise TypeError(f"not a condition: {cond!r}")

    def _typed(self, attr: str, op: str, value: Any) -> str:
        """``attr op value`` that holds only where attr has value's type. On DynamoDB the
        guard changes nothing (values of two types never compare: = is false, < is false);
        it keeps the comparison away from servers that fail on mixed types (moto answers
        HTTP 500 to a string compared with a number, and equates true with 1)."""
        placeholder = self.value(value)
        kind = next(iter(self.values[placeholder]))  # S, N, B, BOOL, NULL, L or M
        type_ = self.value(kind)
        name = self.name(attr)
        return f"(attribute_type({name}, {type_}) AND {name} {op} {placeholder})"

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = self.names
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        return out


class AwsTable:
    def __init__(self, client: Any, table: str) -> None:
        self._db = client
        self._table = table
        self.calls: Counter[str] = Counter()
        counting(client, "dynamodb", self.calls)

    def _key(self, pk: str, sk: str) -> dict[str, Any]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Item": _serialize_item({**item, "pk": pk, "sk": sk}),
        }
        if condition is not None:
            expr = _Expr()
            kwargs["ConditionExpression"] = expr.condition(condition)
            kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            await self._db.put_item(**kwargs)

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        with _translate("dynamodb", f"{pk}/{sk}"):
            got = await self._db.get_item(
                TableName=self._table, Key=self._key(pk, sk), ConsistentRead=consistent
            )
        raw = got.get("Item")
        return None if raw is None else _deserialize_item(raw)

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        check_start(prefix, start)
        expr = _Expr()
        key_cond = f"{expr.name('pk')} = {expr.value(pk)}"
        if start:
            # No key condition takes both begins_with and >=: BETWEEN the start and the
            # prefix's last possible sk (sks compare as UTF-8 bytes there, as code points here:
            # the same order).
            key_cond += (
                f" AND {expr.name('sk')} BETWEEN {expr.value(start)}"
                f" AND {expr.value(prefix + chr(0x10FFFF))}"
            )
        elif prefix:
            key_cond += f" AND begins_with({expr.name('sk')}, {expr.value(prefix)})"
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": key_cond,
            "ConsistentRead": consistent,
            **expr.kwargs(),
        }
        items: list[Item] = []
        while True:
            with _translate("dynamodb", f"{pk}/{start or prefix}*"):
                page = await self._db.query(**kwargs)
            items += [_deserialize_item(raw) for raw in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def update(self, write: Update) -> Item:
        pk, sk, set_, add, condition = write.pk, write.sk, write.set_, write.add, write.condition
        expr = _Expr()
        # The key attributes cannot be updated; they are already what the caller names.
        sets = [
            f"{expr.name(k)} = {expr.value(v)}"
            for k, v in (set_ or {}).items()
            if k not in ("pk", "sk")
        ]
        adds = [
            f"{expr.name(k)} {expr.value(n)}"
            for k, n in (add or {}).items()
            if k not in ("pk", "sk")
        ]
        clauses = []
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": self._key(pk, sk),
            "ReturnValues": "ALL_NEW",
        }
        if clauses:
            kwargs["UpdateExpression"] = " ".join(clauses)
        if condition is not None:
            kwargs["ConditionExpression"] = expr.condition(condition)
        kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            got = await self._db.update_item(**kwargs)
        return _deserialize_item(got.get("Attributes") or self._key(pk, sk))

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        kwargs: dict[str, Any] = {"TableName": self._table, "Key": self._key(pk, sk)}
        if condition is not None:
            expr = _Expr()
            kwargs["ConditionExpression"] = expr.condition(condition)
            kwargs.update(expr.kwargs())
        with _translate("dynamodb", f"{pk}/{sk}"):
            await self._db.delete_item(**kwargs)

    def _tx_item(self, w: TxWrite) -> dict[str, Any]:
        expr = _Expr()
        body: dict[str, Any] = {"TableName": self._table}
        match w:
            case Put(pk, sk, item):
                kind = "Put"
                body["Item"] = _serialize_item({**item, "pk": pk, "sk": sk})
            case Update(pk, sk, set_, add):
                kind = "Update"
                body["Key"] = self._key(pk, sk)
                sets = [
                    f"{expr.name(k)} = {expr.value(v)}"
                    for k, v in (set_ or {}).items()
                    if k not in ("pk", "sk")
                ]
                adds = [f"{expr.name(k)} {expr.value(n)}" for k, n in (add or {}).items()]
                clauses = (["SET " + ", ".join(sets)] if sets else []) + (
                    ["ADD " + ", ".join(adds)] if adds else []
                )
                # An update must update something: touching the key's own value is a no-op.
                body["UpdateExpression"] = " ".join(clauses) or (
                    f"SET {expr.name('sk')} = {expr.name('sk')}"
                )
            case Delete(pk, sk):
                kind = "Delete"
                body["Key"] = self._key(pk, sk)
            case Check(pk, sk):
                kind = "ConditionCheck"
                body["Key"] = self._key(pk, sk)
        if w.condition is not None:
            body["ConditionExpression"] = expr.condition(w.condition)
        body.update(expr.kwargs())
        return {kind: body}

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        where = ", ".join(f"{w.pk}/{w.sk}" for w in writes[:3])
        with _translate("dynamodb", where):
            await self._db.transact_write_items(
                TransactItems=[self._tx_item(w) for w in writes], ClientRequestToken=token
            )
