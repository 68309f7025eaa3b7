"""Writers that act after the moment that should have stopped them, found by a review of the
no-hidden-master work: a task failure racing a publisher, a committed output that vanishes
before publication, a reducer committing after its job ended, an interrupted submit. Every
run is clientless: nobody waits, and the job must still end, with nothing left behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cmr import failures, janitor, lifecycle
from cmr import submit as submission
from cmr.api import job_ref, open_backend
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.lifecycle import load_spec
from cmr.records import JOBS_PK, JobState, job_pk
from cmr.runtime import Runtime
from cmr.settings import AwsSettings, WorkerSettings
from cmr.submit import JobOptions
from cmr.testing import backend_leftovers, chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time

WORDCOUNT = "examples/wordcount.py"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("a b c d e\n" * 200 + "f g\n" * 30)
    return src


@in_virtual_time
async def test_a_task_failure_cannot_fail_a_job_while_it_publishes(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """A worker fails the job (a late duplicate attempt giving up, say) while its publisher
    has copied the parts and not yet written the manifest. It used to end the job failed,
    clean its parts away, and then the publisher's manifest went up listing parts that no
    longer existed (with --overwrite, in place of the old output)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000-old").write_text("old\t1\n")
    (out / "_SUCCESS").write_text(
        json.dumps(
            {
                "cmr": 1,
                "job": "old",
                "finished": 0.0,
                "records": 1,
                "bytes": 6,
                "parts": [{"name": "part-00000-old", "records": 1, "bytes": 6, "attempt": ""}],
            }
        )
    )
    fired: list[str] = []

    async def late_failure(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "publish.copied" and not fired:
            fired.append(context["job"])
            spec, _ = await load_spec(rt.backend, context["job"])
            await failures.fail_job(rt, spec, "a late duplicate attempt failed for good")
            # Had that failed the job, its cleaner would run now, before our manifest.
            job = await rt.backend.table.get(job_pk(spec.job_id), "job", consistent=True)
            if job is not None and job["state"] != "running":
                await lifecycle.cleanup(rt.backend, spec, JobState(job["state"]))

    result = await chaos_run(
        WORDCOUNT,
        data,
        out,
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[late_failure],
        workers=1,
        reducers=2,
        clientless=True,
        timeout_s=60,
        job_options={"overwrite": True},
    )
    assert fired
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert diff_outputs(sequential(WORDCOUNT, data, 2), read_output(out, 2)) == []
    manifest = json.loads((out / "_SUCCESS").read_text())
    assert manifest["job"] == result.job_id
    assert all((out / p["name"]).exists() for p in manifest["parts"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["_SUCCESS", *(p["name"] for p in manifest["parts"])]
    )
    assert result.leftovers == []


@in_virtual_time
async def test_a_committed_output_that_vanishes_fails_the_job(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """A committed partition's output disappears from the scratch before publication (a
    lifecycle rule, a hand delete). The job used to stay `publishing` forever, refusing
    cancel and holding its output place; it must fail, naming the cause, and let go."""
    fired: list[str] = []

    async def vanish(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "finalize.begin" and not fired:
            items = await rt.backend.table.query(job_pk(context["job"]), prefix="reduce#")
            fired.append(str(items[0]["output"]))
            await rt.backend.blobs.delete([str(items[0]["output"])])

    settings = WorkerSettings(map_slots=2, reduce_slots=2, processes=1, memory_mb=1, janitor_s=1.0)
    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[vanish, vanish],
        workers=2,
        reducers=2,
        clientless=True,
        timeout_s=60,
        settings=settings,
    )
    assert fired
    assert result.record["state"] == "failed"
    assert "a committed output is missing" in result.record["error"]
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert result.leftovers == []  # the output place is free again


class GatedBlobs:
    """Blobs that, when the reducer of partition 0 uploads its output, first end the job and
    run its cleanup up to (and paused at) the sweep of the task records."""

    def __init__(self, inner: Any, test: LateCommit) -> None:
        self.inner, self.test = inner, test

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def upload_file(self, path: str, url: str, *, frozen: bool = False) -> None:
        if "/out/p00000" in url and self.test.cleaner is None:
            await self.test.end_and_clean(url)
        await self.inner.upload_file(path, url, frozen=frozen)

    async def delete(self, urls: Sequence[str]) -> None:
        await self.inner.delete(urls)
        if any("/out/p00000" in u for u in urls):
            self.test.reducer_done.set()  # its commit was refused: it threw its output away


class LateCommit:
    def __init__(self) -> None:
        self.be: Backend | None = None
        self.cleaner: asyncio.Task[None] | None = None
        self.swept = asyncio.Event()
        self.reducer_done = asyncio.Event()

    def wrap(self, be: Backend) -> Backend:
        blobs = GatedBlobs(be.blobs, self)
        self.be = Backend(
            be.name, be.queues, blobs, be.table, be.scratch, local_blobs=be.local_blobs
        )
        return self.be

    async def end_and_clean(self, url: str) -> None:
        assert self.be is not None
        spec, _ = await load_spec(self.be, url.split("/jobs/")[1].split("/", maxsplit=1)[0])
        await lifecycle.end(self.be, spec, JobState.FAILED, reason="another task failed")
        # We are its cleaner (as a worker's janitor would be): no other cleanup sweeps the
        # scratch again after the late commit.
        rt = SimpleNamespace(backend=self.be)
        assert await janitor.take_cleanup(rt, spec, "test-cleaner", None)  # type: ignore[arg-type]

        async def step(name: str, context: dict[str, Any]) -> None:
            if name == "cleanup.scratch":  # queues and scratch are gone, records not yet
                self.swept.set()
                await self.reducer_done.wait()

        self.cleaner = asyncio.create_task(lifecycle.cleanup(self.be, spec, JobState.FAILED, step))
        await self.swept.wait()

    async def hook(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "reduce.committed" and "p00000" in context["output"]:
            self.reducer_done.set()  # (the old code let it commit)
            assert self.cleaner is not None
            await self.cleaner


@in_virtual_time
async def test_a_reducer_cannot_commit_after_its_job_ended(
    data: Path, pool: Executor, tmp_path: Path
) -> None:
    """The job fails while a reducer computes; its cleanup sweeps queues and scratch; the
    reducer then uploads its output and commits. The commit used to succeed (the claim
    record was still there), and the output blob outlived the cleanup for good."""
    late = LateCommit()
    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[late.hook],
        workers=1,
        reducers=2,
        clientless=True,
        timeout_s=60,
        wrap=late.wrap,
    )
    assert late.cleaner is not None
    await late.cleaner
    assert result.record["state"] == "failed"
    assert result.leftovers == []


class Interrupted(Exception):
    pass


async def submit(be: Backend, src: Path, out: Path) -> None:
    await submission.submit(
        be,
        job_ref(WORDCOUNT),
        str(src),
        str(out),
        JobOptions(partitions=2),
        queue_prefix="cmr-",
        parallelism=1,
    )


@in_virtual_time
async def test_an_interrupted_submit_leaves_nothing(tmp_path: Path) -> None:
    """A submit that stops half-way (Ctrl-C while sending its tasks) used to leave its
    staged input, plan and queues behind, with no job record for a worker to find."""
    src = tmp_path / "in.txt"
    src.write_text("a b\n" * 100)
    async with open_backend("embedded", AwsSettings()) as be:
        real_send = be.queues.send

        async def send(name: str, bodies: Sequence[bytes]) -> None:
            if name.endswith("-reduce"):
                raise Interrupted
            await real_send(name, bodies)

        be.queues.send = send  # type: ignore[method-assign]
        with pytest.raises(Interrupted):
            await submit(be, src, tmp_path / "out")
        assert await backend_leftovers(be, "cmr-") == []
        assert await be.table.query(JOBS_PK) == []


@in_virtual_time
async def test_a_submit_whose_answer_was_lost_is_cancelled_not_pulled(tmp_path: Path) -> None:
    """The submit transaction applied, but its answer never came: the job exists and is
    listed running. Deleting its queues (as the old code did) left it for a fleet to fail
    with the wrong reason, or holding its output forever with no fleet. It is cancelled."""
    src = tmp_path / "in.txt"
    src.write_text("a b\n" * 100)
    async with open_backend("embedded", AwsSettings()) as be:
        real = be.table.transact
        lost: list[str] = []

        async def transact(writes: Sequence[Any], *, token: str) -> None:
            await real(writes, token=token)
            if not lost and any(getattr(w, "sk", None) == "job" for w in writes):
                lost.append(token)
                raise Interrupted  # applied, then the answer was lost

        be.table.transact = transact  # type: ignore[method-assign]
        with pytest.raises(Interrupted):
            await submit(be, src, tmp_path / "out")
        (row,) = await be.table.query(JOBS_PK)
        job = await be.table.get(job_pk(str(row["sk"])), "job")
        assert job is not None and job["state"] == "cancelled"
        assert "submission was interrupted" in job["error"]
        assert await backend_leftovers(be, "cmr-") == []
