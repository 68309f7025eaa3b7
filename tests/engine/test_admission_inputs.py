"""A table writer must not choose what a worker reads or which queues it touches (issue 26,
items 1 and 7): a worker serves a job only if every input it reads lies under its
``--inputs-under`` (default: its store's bucket) or its store's scratch, and only if the
job's queue prefix is its store's."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from cmr import submit
from cmr.admission import Admission, serving_own_job
from cmr.api import job_ref
from cmr.backends.base import Backend
from cmr.errors import JobRefused, UsageError
from cmr.job import JobRef
from cmr.lifecycle import end, job_scratch, record_submit
from cmr.plan import Plan, plan_url
from cmr.pool import cpu_pool
from cmr.records import JobSpec, JobState, job_pk, new_job_id, step_job_id
from cmr.settings import WorkerSettings
from cmr.submit import JobOptions
from cmr.wire import Range
from cmr.worker import Worker

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = str(REPO / "examples" / "wordcount.py")
SCRATCH = "s3://cmr-data/cmr"


def _spec(**changes: Any) -> JobSpec:
    base = JobSpec(
        new_job_id(),
        JobRef(WORDCOUNT, "0" * 64),
        {},
        3,
        2,
        "s3://cmr-data/out/",
        SCRATCH + "/",
        "cmr-",
        60,
        3,
        plan_digest="1" * 64,
        input_root="s3://cmr-data/in/",
    )
    return dataclasses.replace(base, **changes)


def _refusal(adm: Admission, **changes: Any) -> str:
    return adm.refusal(_spec(**changes)) or ""


# --- what a worker reads ------------------------------------------------------------------


def test_inputs_default_to_the_stores_bucket_and_its_scratch() -> None:
    adm = Admission.of([str(REPO)], [], SCRATCH)
    assert adm.refusal(_spec()) is None
    assert adm.refusal(_spec(input_root="s3://cmr-data/in/a.txt")) is None
    reason = _refusal(adm, input_root="s3://other-bucket/private/secret.txt")
    assert "its input s3://other-bucket/private/secret.txt is outside" in reason
    assert "see --inputs-under" in reason and len(reason) < 300
    # s3://cmr-data/ does not admit the bucket s3://cmr-data2.
    assert _refusal(adm, input_root="s3://cmr-data2/in/")


def test_narrow_inputs_under_keeps_the_scratch_readable() -> None:
    adm = Admission.of([str(REPO)], [], SCRATCH, ["s3://cmr-data/in"])
    assert adm.refusal(_spec()) is None
    assert _refusal(adm, input_root="s3://cmr-data/in2/")
    assert _refusal(adm, input_root="s3://cmr-data/private/x")
    # A job's own staged input lies in its own scratch; a pipeline step's input is the
    # step before's outputs. Another job's scratch (its staged input, its outputs) is not
    # readable beyond --inputs-under: a table writer could otherwise point a job at them.
    spec = _spec()
    own = f"{SCRATCH}/jobs/{spec.job_id}/input/"
    assert adm.refusal(dataclasses.replace(spec, input_root=own)) is None
    other = _refusal(adm, input_root=f"{SCRATCH}/jobs/x/input/")
    assert "its input" in other and "see --inputs-under" in other
    assert _refusal(adm, input_root=f"{SCRATCH}/jobs/x/out/")
    step2 = dataclasses.replace(
        spec,
        job_id=step_job_id(spec.job_id, 0, 1),
        pipeline=spec.job_id,
        step=1,
        last_step=1,
        step_partitions=(3, 3),
        job_steps=2,
        input_root=f"{SCRATCH}/jobs/{spec.job_id}/out/",
    )
    assert adm.refusal(step2) is None, adm.refusal(step2)
    # ... and not the outputs of a step of another pipeline.
    assert adm.refusal(dataclasses.replace(step2, input_root=f"{SCRATCH}/jobs/x/out/"))


def test_every_root_and_glob_is_checked() -> None:
    adm = Admission.of([str(REPO)], [], SCRATCH, ["s3://cmr-data/in/"])
    roots = ("s3://cmr-data/in/a/", "s3://cmr-data/in/b/")
    assert adm.refusal(_spec(input_roots=roots)) is None
    assert _refusal(adm, input_roots=(*roots, "s3://victim/x/"))
    assert adm.refusal(_spec(input_globs=("s3://cmr-data/in/*/2024-*.txt",))) is None
    assert "s3://victim/logs/" in _refusal(adm, input_globs=("s3://victim/logs/*.gz",))
    # A glob character in the bucket, or in a name next to the allowed prefix, matches
    # other buckets and names: only its whole literal directory counts.
    assert _refusal(adm, input_globs=("s3://cmr-data*/in/x",))
    assert _refusal(adm, input_globs=("s3://cmr-data/in*/x",))


def test_local_inputs_are_compared_as_the_blob_store_reads_them(tmp_path: Path) -> None:
    public = tmp_path / "public"
    adm = Admission.of([str(REPO)], ["file://"], f"file://{tmp_path}/scratch", [f"file://{public}"])
    assert adm.refusal(_local(tmp_path, f"file://{public}/a.txt")) is None
    assert adm.refusal(_local(tmp_path, f"file://{public}/")) is None
    escapes = [
        f"file://{tmp_path}/secret.txt",
        f"file://{tmp_path}/public2/a.txt",
        f"file://{public}/%2e%2e/secret.txt",  # decoded to .. when read
        f"file://{public}//..%2Fsecret.txt",
        f"file://elsewhere{tmp_path}/secret.txt",  # the host part is dropped when read
    ]
    for url in escapes:
        assert adm.refusal(_local(tmp_path, url)), url
    # A glob is read decoded and normalised: "a*/.." collapses, leaving /etc/passwd.
    trick = f"file://{public}/a%2A%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd"
    assert adm.refusal(_local(tmp_path, f"file://{public}/", input_globs=(trick,)))
    ok = f"file://{public}/*.txt"
    assert adm.refusal(_local(tmp_path, f"file://{public}/", input_globs=(ok,))) is None


def _local(tmp_path: Path, root: str, **changes: Any) -> JobSpec:
    return _spec(
        scratch=f"file://{tmp_path}/scratch/",
        output=f"file://{tmp_path}/out/",
        input_root=root,
        **changes,
    )


def test_a_local_scratch_admits_any_local_input_by_default(tmp_path: Path) -> None:
    adm = Admission.of([str(REPO)], [], f"file://{tmp_path}/scratch")
    assert adm.refusal(_local(tmp_path, "file:///anywhere/in.txt")) is None
    assert _refusal(adm, scratch=f"file://{tmp_path}/scratch/", output=f"file://{tmp_path}/o/")


def test_the_submitters_own_workers_read_its_input(tmp_path: Path) -> None:
    spec = _spec(
        input_root="s3://public-data/set/a/",
        input_roots=("s3://public-data/set/a/", "s3://public-data/set/b.txt"),
        input_globs=("s3://public-data/logs/2024-*/x.gz",),
    )
    base = WorkerSettings(jobs_from=(str(REPO),))
    assert Admission.of([str(REPO)], [], SCRATCH).refusal(spec)
    ws = serving_own_job(base, spec)
    adm = Admission.of(ws.jobs_from, ws.outputs_under, SCRATCH, ws.inputs_under)
    assert adm.refusal(spec) is None
    assert _refusal(adm, input_root="s3://public-data/set/c/")


def test_inputs_under_must_be_a_url_prefix() -> None:
    for bad in ("/srv/in", "http://x/", "s3:///"):
        with pytest.raises(UsageError, match="--inputs-under"):
            Admission.of([str(REPO)], [], SCRATCH, [bad])


# --- which queues a worker touches ----------------------------------------------------------


def test_a_queue_prefix_not_the_stores_is_refused() -> None:
    adm = Admission.of([str(REPO)], [], SCRATCH, queue_prefix="cmr-")
    assert adm.refusal(_spec()) is None
    reason = _refusal(adm, queue_prefix="victim-")
    assert "its queue prefix 'victim-' is not this worker's store's ('cmr-')" in reason
    assert _refusal(adm, queue_prefix="")  # "" would name the queues of every prefix's job
    assert Admission.of([str(REPO)], [], SCRATCH, queue_prefix="team-a-").refusal(_spec())


# --- end to end on the embedded backend -----------------------------------------------------


async def _wordcount(be: Backend, source: Path, out: Path) -> JobSpec:
    return await submit.submit(
        be, job_ref(WORDCOUNT), str(source), str(out), JobOptions(partitions=1),
        queue_prefix="cmr-", parallelism=1,
    )  # fmt: skip


async def test_a_forged_plan_and_input_root_outside_inputs_under_is_refused(
    embedded: Backend, tmp_path: Path
) -> None:
    """The issue's reproduction on the embedded backend: a table and scratch writer points a
    submitted job's plan and input root at a file outside the worker's --inputs-under. The
    worker refuses the job; the file's words are never read into an output."""
    public = tmp_path / "public"
    public.mkdir()
    (public / "in.txt").write_text("apple banana\n")
    secret = tmp_path / "private" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("zebra launchcode\n")
    spec = await _wordcount(embedded, public / "in.txt", tmp_path / "out")
    url = f"file://{secret}"
    size = secret.stat().st_size
    tasks = tuple((Range(url, 0, size if i == 0 else 0, "secret.txt"),) for i in range(spec.maps))
    data = Plan(tasks).to_bytes()
    await embedded.blobs.put(plan_url(job_scratch(spec.scratch, spec.job_id)), data)
    item = await embedded.table.get(job_pk(spec.job_id), "job")
    assert item is not None
    item.update(plan_digest=Plan.digest(data), input_root=url)
    await embedded.table.put(job_pk(spec.job_id), "job", item)

    ws = WorkerSettings(
        processes=1, poll_s=0.1, jobs_from=(str(REPO),), inputs_under=(f"file://{public}/",)
    )
    with cpu_pool(1) as pool, pytest.raises(JobRefused) as refused:
        await asyncio.wait_for(Worker(embedded, ws, pool, only_job=spec.job_id).run(), 120)
    assert f"its input file://{secret} is outside" in str(refused.value)
    assert "see --inputs-under" in str(refused.value)
    assert list((tmp_path / "out").iterdir()) == []  # made at submit, never written
    record = await embedded.table.get(job_pk(spec.job_id), "job")
    assert record is not None and record["state"] == "running"  # refused, not failed


async def test_a_forged_queue_prefix_never_makes_a_worker_touch_its_queues(
    embedded: Backend, tmp_path: Path
) -> None:
    """A record naming another queue prefix (another store's, sharing the queue service)
    and ended as cancelled: a worker cleaning it up would delete that store's queues of a
    job of the same id. The worker refuses it; the queues stay."""
    (tmp_path / "in.txt").write_text("a\n")
    real = await _wordcount(embedded, tmp_path / "in.txt", tmp_path / "out")
    forged = dataclasses.replace(
        real, job_id=new_job_id(), queue_prefix="victim-", output=f"file://{tmp_path}/o2/"
    )
    in_q, reduce_q, parts = forged.queues()
    victims = [in_q, reduce_q, *parts]
    for q in victims:
        await embedded.queues.create(q, visibility_s=30)
    await record_submit(embedded, forged, {})
    assert await end(embedded, forged, JobState.CANCELLED, reason="forged")

    ws = WorkerSettings(processes=1, poll_s=0.1, jobs_from=(str(REPO),))
    with cpu_pool(1) as pool:
        worker = Worker(embedded, ws, pool)
        run = asyncio.create_task(worker.run())
        try:
            # Until the worker has decided: refused it, or cleaned it up (old code). The
            # table has no event to wait on.
            for _ in range(1200):
                record = await embedded.table.get(job_pk(forged.job_id), "job") or {}
                if forged.job_id in worker._refused or record.get("cleaned"):
                    break
                await asyncio.sleep(0.05)
        finally:
            worker.done.set()
            await run
    assert sorted(await embedded.queues.list("victim-")) == sorted(victims)
    assert forged.job_id in worker._refused
