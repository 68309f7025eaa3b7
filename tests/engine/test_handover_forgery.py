"""A table writer pre-writes a pipeline's next step (issue 26, item 6): a hand-over takes a
next-step record as its own only when it is exactly the one a hand-over writes and this step
ended naming it. Otherwise the step fails with a bounded reason, and what the hand-over made
for the next step (its queues and plan) is removed: nothing serves the stranger's record."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.lifecycle import job_scratch, load_spec
from cmr.pipeline import CARRIED, next_spec
from cmr.plan import Plan, plan_url
from cmr.pool import cpu_pool
from cmr.records import JobSpec, JobState, job_pk
from cmr.runtime import Runtime
from cmr.testing import task_records
from cmr.virtualtime import in_virtual_time

from .tampering import topwords_tampered


class Forger:
    """At the moment the hand-over has made the next step's plan and queues (its
    ``pipeline.next_made`` step), write the next step's record first: the one the hand-over
    would write, with ``changes``. When the job is cleaned up, note what the next step has."""

    def __init__(self, **changes: Any) -> None:
        self.changes = changes
        self.forged: dict[str, Any] | None = None
        self.nxt: JobSpec | None = None
        self.left: list[str] | None = None  # the next step's blobs, queues and task records

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        be = rt.backend
        if step == "cleanup.done" and self.nxt is not None:
            nxt = self.nxt
            self.left = [b.url for b in await be.blobs.list(job_scratch(nxt.scratch, nxt.job_id))]
            self.left += await be.queues.list(f"{nxt.queue_prefix}{nxt.job_id}-")
            self.left += await task_records(be, nxt.job_id)
        if step != "pipeline.next_made" or self.forged is not None:
            return
        spec, record = await load_spec(be, context["job"])
        data = await be.blobs.get(plan_url(job_scratch(spec.scratch, context["next"])))
        plan = Plan.from_bytes(data, Plan.digest(data))
        self.nxt = nxt = next_spec(spec, Plan.digest(data), len(plan.tasks))
        assert nxt.job_id == context["next"]
        extra = {k: record[k] for k in CARRIED if k in record}
        extra["input_bytes"] = sum(r.end - r.start for t in plan.tasks for r in t)
        extra["inputs"] = spec.partitions
        item = {**dataclasses.replace(nxt, **self.changes).to_item(), **extra}
        self.forged = {**item, "state": JobState.RUNNING.value, "created": 0}
        await be.table.put(job_pk(nxt.job_id), "job", self.forged)


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with cpu_pool(2) as p:
        yield p


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        # Fields the hand-over did not compare before: each changes what step 2 reads.
        ({"input_format": "lines"}, "its input_format differ"),
        ({"input_root": "file:///etc/"}, "its input_root differ"),
        ({"input_roots": ("file:///etc/",)}, "its input_roots differ"),
        ({"lines": "universal"}, "its lines differ"),
        # Exactly the record a hand-over writes, but this step never ended naming it.
        ({}, "this step did not end naming it"),
    ],
)
@in_virtual_time
async def test_a_forged_next_step_fails_the_step_and_is_never_served(
    changes: dict[str, Any], reason: str, pool: Executor, tmp_path: Path
) -> None:
    forger = Forger(**changes)
    result = await topwords_tampered(
        tmp_path, pool, forger, 90
    )  # old code hangs here: the step stays publishing, handed to nobody
    assert forger.forged is not None, "no hand-over reached pipeline.next_made"
    record = result.record
    # The step the pipeline is at is step 1: it never named the forged record as its next.
    assert record["step"] == 0 and "next" not in record
    assert record["state"] == JobState.FAILED.value
    error = str(record["error"])
    assert "the next step cannot be made" in error and reason in error, error
    assert "written by someone else" in error and len(error) < 400, error
    # Nothing was published, and what the hand-over made for the next step is gone: its
    # plan and queues (the forged record stays as written, served by nobody: no task record).
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert result.leftovers == []
    assert forger.left == ["job"]
