"""An in-memory table with DynamoDB's conditional writes, transactions and item limits."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from cmr.backends.base import (
    MAX_TX_WRITES,
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
from cmr.errors import ConditionFailed, Rejected

MAX_ITEM_BYTES = 400 * 1024  # DynamoDB's item size limit


def item_bytes(value: Any) -> int:
    """About the size DynamoDB charges an item or value: names and values, UTF-8 lengths,
    numbers at most 21 bytes, a few bytes per list or map element."""
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode()) + 1 + item_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 3 + sum(1 + item_bytes(v) for v in value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 1
    return min(21, 1 + len(repr(value)) // 2)


def _kind(value: Any) -> str:
    """DynamoDB's type of a value: one number type, and booleans are not numbers."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int | float):
        return "N"
    if isinstance(value, str):
        return "S"
    if isinstance(value, bytes):
        return "B"
    return type(value).__name__


def holds(cond: Condition | None, item: Item | None) -> bool:
    """Evaluate a write condition against the current item (None: absent)."""
    cur = item or {}
    match cond:
        case None:
            return True
        case Missing(attr):
            return attr not in cur
        case Present(attr):
            return attr in cur
        case Eq(attr, value):
            return attr in cur and _kind(cur[attr]) == _kind(value) and cur[attr] == value
        case Lt(attr, value):
            v = cur.get(attr)
            return v is not None and _kind(v) == _kind(value) in ("N", "S", "B") and v < value
        case AllOf(parts):
            return all(holds(p, item) for p in parts)
        case AnyOf(parts):
            return any(holds(p, item) for p in parts)
    raise TypeError(f"not a condition: {cond!r}")


_SHARED = (str, bytes, int, float, bool, type(None), Decimal)  # immutable: shared, not copied


def _copied(value: Any) -> Any:
    """A deep copy of an item or a value in one: dicts and lists copied, immutable values
    shared. What ``copy.deepcopy`` gives, at a fraction of its cost (no memo, no dispatch
    table): a reducer polling 3,600 map commits spent most of its time in deepcopy."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, _SHARED):
        return value
    return copy.deepcopy(value)  # anything else (a set, a tuple of lists): the general way


TOKENS_KEPT = 10_000  # transaction tokens remembered (DynamoDB: ten minutes' worth)


class EmbeddedTable:
    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Item]] = {}
        self._tokens: dict[str, None] = {}  # insertion-ordered: the oldest are forgotten
        self.calls: Counter[str] = Counter()  # charged by the Counting middleware

    def _store(self, pk: str, sk: str, item: Item) -> None:
        size = item_bytes(item)
        if size > MAX_ITEM_BYTES:
            # As DynamoDB answers: a ValidationException, which no retry can cure.
            raise Rejected(
                f"dynamodb: item {pk}/{sk} of about {size:,} bytes exceeds the "
                f"{MAX_ITEM_BYTES:,}-byte item size limit"
            )
        self._parts.setdefault(pk, {})[sk] = item

    async def put(
        self, pk: str, sk: str, item: Item, *, condition: Condition | None = None
    ) -> None:
        part = self._parts.setdefault(pk, {})
        if not holds(condition, part.get(sk)):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        self._store(pk, sk, _copied({**item, "pk": pk, "sk": sk}))

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        found: Item | None = _copied(self._parts.get(pk, {}).get(sk))
        return found

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        check_start(prefix, start)
        part = self._parts.get(pk, {})
        return [_copied(part[sk]) for sk in sorted(part) if sk.startswith(prefix) and sk >= start]

    async def update(self, write: Update) -> Item:
        pk, sk = write.pk, write.sk
        cur = self._parts.get(pk, {}).get(sk)
        if not holds(write.condition, cur):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        new = _updated(pk, sk, cur, write.set_, write.add)
        self._store(pk, sk, new)
        answer: Item = _copied(new)
        return answer

    async def delete(self, pk: str, sk: str, *, condition: Condition | None = None) -> None:
        part = self._parts.get(pk, {})
        if not holds(condition, part.get(sk)):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        part.pop(sk, None)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        if token in self._tokens:
            return  # a retry of a transaction already applied: DynamoDB answers success
        keys = [(w.pk, w.sk) for w in writes]
        if len(writes) > MAX_TX_WRITES or len(set(keys)) != len(keys):
            raise Rejected(
                f"dynamodb: a transaction takes at most {MAX_TX_WRITES} writes, each item "
                f"once; got {len(writes)} writes on {len(set(keys))} items"
            )
        for w in writes:
            if not holds(w.condition, self._parts.get(w.pk, {}).get(w.sk)):
                raise ConditionFailed(f"transaction cancelled: condition failed on {w.pk}/{w.sk}")
        staged: list[tuple[str, str, Item | None]] = []
        for w in writes:
            match w:
                case Put(pk, sk, item):
                    new: Item | None = _copied({**item, "pk": pk, "sk": sk})
                case Update(pk, sk, set_, add):
                    new = _updated(pk, sk, self._parts.get(pk, {}).get(sk), set_, add)
                case Delete(pk, sk):
                    new = None
                case Check():
                    continue
            if new is not None and item_bytes(new) > MAX_ITEM_BYTES:
                raise Rejected(f"dynamodb: item {w.pk}/{w.sk} exceeds the item size limit")
            staged.append((w.pk, w.sk, new))
        for pk, sk, staged_item in staged:
            if staged_item is None:
                self._parts.get(pk, {}).pop(sk, None)
            else:
                self._parts.setdefault(pk, {})[sk] = staged_item
        self._tokens[token] = None
        if len(self._tokens) > TOKENS_KEPT:
            del self._tokens[next(iter(self._tokens))]


def _updated(
    pk: str, sk: str, cur: Item | None, set_: Item | None, add: dict[str, int] | None
) -> Item:
    new: dict[str, Any] = _copied(cur) if cur else {"pk": pk, "sk": sk}
    new.update(_copied(set_ or {}))
    for k, n in (add or {}).items():
        new[k] = new.get(k, 0) + n
    return new
