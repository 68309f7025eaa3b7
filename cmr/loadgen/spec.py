"""What one load-generating map task does: the contract between the CLI, the load job's
map tasks and its reducer. A task description is plain JSON data (it travels as a job's
input file, never as code)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from cmr.errors import UsageError

TARGETS = ("dynamodb", "s3", "sqs", "simpledb", "azure-table", "azure-blob", "sim")
Kind = Literal["jam", "staleness"]
Retries = Literal["off", "standard", "adaptive"]


@dataclass(frozen=True)
class LoadTask:
    kind: Kind  # jam: readers + writers hammer items; staleness: one writer, timed readers
    target: str  # one of TARGETS
    task: int  # index of this task among the load test's tasks
    seed: int
    readers: int = 1  # concurrent readers (closed loop) in this task
    writers: int = 1  # concurrent writers in this task
    items: int = 1  # distinct keys: 1 is seed 000's single-item load, 1000 its spread-out one
    duration_s: float | None = None  # stop after this long ...
    ops: int | None = None  # ... or after this many operations in this task
    consistent_ratio: float = 0.0  # P(a read is strongly consistent)
    conditional_ratio: float = 0.0  # P(a write is conditional)
    rate: float | None = None  # open loop: intended operations/s for this task
    retries: Retries = "off"  # SDK retries: off for jamming (errors must be seen)
    write_interval_ms: int = 1000  # staleness: time between the writer's writes
    # the table/bucket/queue/domain/container name, the region, the run's id and its key
    # prefix (see prepare)
    resources: dict[str, str] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides for target sim

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UsageError(f"unknown target {self.target!r}: use one of {', '.join(TARGETS)}")
        if (self.duration_s is None) == (self.ops is None):
            raise UsageError("give exactly one of --duration and --ops")
        for name in ("consistent_ratio", "conditional_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1")
        if self.readers < 0 or self.writers < 0 or self.readers + self.writers == 0:
            raise UsageError("a task needs at least one reader or writer")
        if self.items < 1:
            raise UsageError("--items must be at least 1")

    def keys(self) -> list[str]:
        """The keys this task uses, all under ``resources["prefix"]``: a jam's ``items``
        shared keys, or a staleness task's own keys per writer (index ``[w * items + i]``).
        Teardown deletes exactly these from a store the run did not create."""
        prefix = self.resources.get("prefix", "")
        if self.kind == "jam":
            return [f"{prefix}item-{i}" for i in range(self.items)]
        return [
            f"{prefix}s-t{self.task}-w{w}-k{i}"
            for w in range(self.writers)
            for i in range(self.items)
        ]

    def writes(self) -> list[str]:
        """The keys this task may write (none on SQS, which has no keys)."""
        return [] if self.target == "sqs" or self.writers == 0 else self.keys()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> LoadTask:
        try:
            return LoadTask(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"not a load task description: {exc}") from None
