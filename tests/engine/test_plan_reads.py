"""A worker reads a job's plan once, however many of its tasks ask for it at once; a read
that failed is tried again; a cleanup reads only the parts the plan replaced. Against the
embedded backend's own blob store, counting its requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cmr.errors import BlobMissing
from cmr.plan import Plan, load_plan, plan_url
from cmr.runtime import Runtime
from cmr.settings import WorkerSettings
from cmr.wire import Range


def _plan(tmp_path: Path, files: int = 3) -> Plan:
    ranges = tuple(Range((tmp_path / f"f{i}").as_uri(), 0, 5, f"f{i}") for i in range(files))
    return Plan((ranges,), replaced=("part-00000",))


async def _stored(be: Any, tmp_path: Path, plan: Plan) -> tuple[Any, str]:
    scratch = (tmp_path / "scratch").as_uri() + "/"
    data = plan.to_bytes()
    await be.blobs.put(plan_url(scratch), data)
    spec = SimpleNamespace(job_id="j1", plan_digest=Plan.digest(data), partitions=4)
    return spec, scratch


async def test_tasks_asking_at_once_read_the_plan_once(embedded: Any, tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    spec, scratch = await _stored(embedded, tmp_path, plan)
    rt = Runtime(embedded, WorkerSettings(), None, str(tmp_path))  # type: ignore[arg-type]
    before = embedded.calls()["s3.GetObject"]
    got = await asyncio.gather(*(rt.plan(spec, scratch) for _ in range(5)))
    assert all(g == plan for g in got)
    assert await rt.plan(spec, scratch) == plan
    assert embedded.calls()["s3.GetObject"] - before == 1


async def test_a_plan_read_that_failed_is_read_again(embedded: Any, tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    scratch = (tmp_path / "scratch").as_uri() + "/"
    data = plan.to_bytes()
    spec: Any = SimpleNamespace(job_id="j1", plan_digest=Plan.digest(data), partitions=4)
    rt = Runtime(embedded, WorkerSettings(), None, str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(BlobMissing):
        await rt.plan(spec, scratch)  # not written yet
    await embedded.blobs.put(plan_url(scratch), data)
    assert await rt.plan(spec, scratch) == plan


async def test_a_task_cancelled_while_the_plan_is_read_leaves_it_to_the_others(
    embedded: Any, tmp_path: Path
) -> None:
    plan = _plan(tmp_path)
    spec, scratch = await _stored(embedded, tmp_path, plan)
    rt = Runtime(embedded, WorkerSettings(), None, str(tmp_path))  # type: ignore[arg-type]
    first = asyncio.ensure_future(rt.plan(spec, scratch))
    second = asyncio.ensure_future(rt.plan(spec, scratch))
    await asyncio.sleep(0)  # both wait on the one read
    first.cancel()
    assert await second == plan
    assert first.cancelled()


async def test_a_cleanup_reads_what_the_plan_replaced_without_its_tasks(
    embedded: Any, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, files=50)
    spec, scratch = await _stored(embedded, tmp_path, plan)
    light = await load_plan(embedded.blobs, scratch, spec.plan_digest, tasks=False)
    assert light.replaced == ("part-00000",) and light.tasks == ()
    full = await load_plan(embedded.blobs, scratch, spec.plan_digest)
    assert full == plan


class _GatedBlobs:
    """The embedded store's blobs, whose reads wait for the test's word and fail while it
    says the plan is missing (the failing read and a new ask must come in one turn of the
    loop, which no real store times)."""

    def __init__(self, blobs: Any) -> None:
        self.blobs = blobs
        self.gate: asyncio.Future[None] | None = None
        self.missing = True

    async def get(self, url: str) -> bytes:
        if self.gate is not None:
            await self.gate
        if self.missing:
            raise BlobMissing(url)
        return await self.blobs.get(url)  # type: ignore[no-any-return]


async def test_a_task_that_asks_as_the_read_fails_reads_it_again(
    embedded: Any, tmp_path: Path
) -> None:
    plan = _plan(tmp_path)
    spec, scratch = await _stored(embedded, tmp_path, plan)
    blobs = _GatedBlobs(embedded.blobs)
    backend = SimpleNamespace(blobs=blobs)
    rt = Runtime(backend, WorkerSettings(), None, str(tmp_path))  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    blobs.gate = loop.create_future()
    asked = loop.create_future()
    first = asyncio.ensure_future(rt.plan(spec, scratch))

    async def later() -> Plan:
        await asked
        blobs.missing = False  # there now: a new read finds it
        return await rt.plan(spec, scratch)

    second = asyncio.ensure_future(later())
    await asyncio.sleep(0)
    blobs.gate.set_result(None)  # the first read fails in the loop's next turn...
    asked.set_result(None)  # ...in which the second task asks
    blobs.gate = None
    with pytest.raises(BlobMissing):
        await first
    assert await second == plan
