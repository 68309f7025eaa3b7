"""What a simulated fleet node asks of the services: calls, queues, table keys, units."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgpack

from cmr.backends.base import (
    Item,
)
from cmr.records import ACTIVE_PK

# When each map task's modelled compute ran (benchmarks.fleetsim.job.work_spans).
WORK_SPANS: list[tuple[float, float]] = []

QUEUE_KINDS = (("-in", "input queue"), ("-reduce", "reduce queue"))
PART_QUEUE = re.compile(r"-p\d{5}$")


def queue_kind(name: str) -> str:
    if PART_QUEUE.search(name):
        return "partition queues"
    for suffix, kind in QUEUE_KINDS:
        if name.endswith(suffix):
            return kind
    return "other queue"


def key_kind(pk: str, sk: str = "") -> str:
    """The table's keys by role (cmr/records.py): every worker hits the same few."""
    if pk.startswith("job#"):
        if sk == "job":
            return "job#<id> / job (the job record)"
        role = sk.split("#", 1)[0] if sk else "*"
        return f"job#<id> / {role}#*"
    return f"{pk} / <id>" if pk in ("jobs", ACTIVE_PK) and sk else f"{pk} / *"


def item_bytes(item: Item | None) -> int:
    """DynamoDB's item size, approximately (names + values, as msgpack encodes them)."""
    if not item:
        return 0
    return len(msgpack.packb(item, use_bin_type=True, default=str))


def read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / 4096))
    return float(units) if consistent else units / 2


def write_units(size: int) -> float:
    return float(max(1, math.ceil(size / 1024)))


@dataclass
class Meter:
    """What one worker (or the client) asked of the services."""

    calls: Counter[str] = field(default_factory=Counter)
    busy_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    queues: Counter[str] = field(default_factory=Counter)  # "kind|op"
    keys: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    prefixes: Counter[str] = field(default_factory=Counter)  # "area|op"
    commit_times: list[float] = field(default_factory=list)  # map commits written, time.time()
    commit_cpu: list[float] = field(default_factory=list)  # process CPU at each map commit
    gone: Counter[str] = field(default_factory=Counter)  # calls on queues already deleted

    def copy(self) -> Meter:
        out = Meter()
        out.add(self)
        return out

    def add(self, other: Meter) -> None:
        self.gone.update(other.gone)
        self.calls.update(other.calls)
        for k, v in other.busy_s.items():
            self.busy_s[k] += v
        self.queues.update(other.queues)
        for k, v in other.keys.items():
            self.keys[k] += v
        self.prefixes.update(other.prefixes)
        self.commit_times.extend(other.commit_times)
        self.commit_cpu.extend(other.commit_cpu)
