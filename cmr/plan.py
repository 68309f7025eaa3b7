"""The plan a job's submitter commits: every map task's input ranges, and the parts its
publication replaces.

It is written once, before the job record that names its digest, and never changes. Map task
messages carry only a task number, a pointer into the plan: a worker reads the ranges from
here (checking the digest), so a message cannot tell it what to read, and a task message
lost from its queue can be sent again from the plan by any worker (``cmr.janitor``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from cmr import wire
from cmr.backends.base import Blobs
from cmr.errors import WireError
from cmr.wire import Range


def plan_url(job_scratch: str) -> str:
    return job_scratch + "plan"


@dataclass(frozen=True)
class Plan:
    tasks: tuple[tuple[Range, ...], ...]
    replaced: tuple[str, ...] = ()  # parts in the output place at submit (with --overwrite)

    def to_bytes(self) -> bytes:
        doc = {
            "tasks": [[[r.url, r.start, r.end, r.name] for r in t] for t in self.tasks],
            "replaced": list(self.replaced),
        }
        return wire.compress(wire.pack(doc))

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    @staticmethod
    def from_bytes(data: bytes, digest: str) -> Plan:
        if Plan.digest(data) != digest:
            raise WireError("the job's plan does not match the digest its record names")
        doc: Any = wire.unpack(wire.decompress(data))
        try:
            tasks = tuple(
                tuple(Range(str(u), int(s), int(e), str(n)) for u, s, e, n in t)
                for t in doc["tasks"]
            )
            replaced = tuple(str(n) for n in doc["replaced"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"the job's plan is malformed: {exc}") from None
        if any(not 0 <= r.start <= r.end for t in tasks for r in t):
            raise WireError("the job's plan has a range that ends before it starts")
        return Plan(tasks, replaced)


async def load_plan(blobs: Blobs, job_scratch: str, digest: str) -> Plan:
    return Plan.from_bytes(await blobs.get(plan_url(job_scratch)), digest)
