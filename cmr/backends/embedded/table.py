"""An in-memory table with DynamoDB's conditional writes, transactions and item limits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cmr.backends.base import (
    MAX_TX_WRITES,
    Check,
    Condition,
    Delete,
    Item,
    Put,
    TxWrite,
    Update,
    check_start,
)
from cmr.backends.items import MAX_ITEM_BYTES, copied, holds, item_bytes, updated
from cmr.errors import ConditionFailed, Rejected

__all__ = ["MAX_ITEM_BYTES", "TOKENS_KEPT", "EmbeddedTable", "holds", "item_bytes"]

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
        self._store(pk, sk, copied({**item, "pk": pk, "sk": sk}))

    async def get(self, pk: str, sk: str, *, consistent: bool = True) -> Item | None:
        found: Item | None = copied(self._parts.get(pk, {}).get(sk))
        return found

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        check_start(prefix, start)
        part = self._parts.get(pk, {})
        return [copied(part[sk]) for sk in sorted(part) if sk.startswith(prefix) and sk >= start]

    async def update(self, write: Update) -> Item:
        pk, sk = write.pk, write.sk
        cur = self._parts.get(pk, {}).get(sk)
        if not holds(write.condition, cur):
            raise ConditionFailed(f"condition failed on {pk}/{sk}")
        new = updated(pk, sk, cur, write.set_, write.add)
        self._store(pk, sk, new)
        answer: Item = copied(new)
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
                    new: Item | None = copied({**item, "pk": pk, "sk": sk})
                case Update(pk, sk, set_, add):
                    new = updated(pk, sk, self._parts.get(pk, {}).get(sk), set_, add)
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
