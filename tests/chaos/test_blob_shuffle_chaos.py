"""The blob shuffle (cmr.bulk) under attack: two attempts of a map task that both finish (only
the winner's object is ever read), workers that die between writing their object and
committing (nothing left behind, with nobody waiting on the job), and a bucket writer who
spoils a winner's object (the job fails, saying why)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from cmr import lifecycle
from cmr.backends.faults import FaultPlan
from cmr.records import PART_DIGEST, JobSpec, MapCommit, job_pk, map_sk
from cmr.runtime import Runtime, WorkerCrashed
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases

WORDCOUNT = "examples/wordcount.py"


def _quiet() -> FaultPlan:
    return FaultPlan(seed=0)


class _Reads:
    """The blob store as it is, noting every URL a range was read from."""

    def __init__(self, inner: Any, urls: list[str]) -> None:
        self._inner, self._urls = inner, urls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def get_range(self, url: str, start: int, end: int) -> bytes:
        self._urls.append(url)
        return await self._inner.get_range(url, start, end)  # type: ignore[no-any-return]


@in_virtual_time
async def test_two_attempts_both_finish_and_only_the_winners_object_is_read(
    pool: Executor, tmp_path: Path
) -> None:
    """Every task message is delivered twice, and each attempt that wrote its object waits
    at that step until another attempt of its task has too: two attempts of a map task
    both finish; one commit wins, the other attempt deletes its object, and no reducer reads
    anything but winners' objects."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"w{i % 7} x{i % 3}\n" for i in range(300)))
    reads: list[str] = []
    written: dict[int, list[str]] = {}
    both: dict[int, asyncio.Event] = {}

    async def hook(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "map.shuffle_written":
            task = context["task"]
            written.setdefault(task, []).append(context["attempt"])
            event = both.setdefault(task, asyncio.Event())
            if len(written[task]) >= 2:
                event.set()
            # Past this, the duplicate came after this attempt committed: it was skipped.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 5)

    result = await chaos_run(
        WORDCOUNT,
        src,
        tmp_path / "out",
        seed=1,
        pool=pool,
        plan=FaultPlan(seed=1, duplicate_delivery=1.0),
        hooks=[hook, hook, hook],
        workers=3,
        reducers=2,
        split_bytes=1024,
        visibility_s=30,
        wrap=lambda be: dataclasses.replace(be, blobs=_Reads(be.blobs, reads)),
        shuffle="blob",
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert diff_outputs(sequential(WORDCOUNT, src, 2), read_output(tmp_path / "out", 2)) == []
    twice = {t: a for t, a in written.items() if len(a) >= 2}
    assert twice, "no map task had two attempts that both wrote their object"
    assert int(result.record.get("map_attempts_filtered", 0)) >= len(twice)
    read_attempts = {url.rsplit("/", 1)[1] for url in reads if "/shuffle/" in url}
    for task, attempts in twice.items():
        names = {f"{task}-{a}" for a in attempts}
        assert len(names & read_attempts) == 1, (task, attempts, read_attempts)
    assert result.leftovers == []


@in_virtual_time
async def test_a_worker_that_dies_between_its_object_and_its_commit_leaves_nothing(
    pool: Executor, tmp_path: Path
) -> None:
    """Nobody waits on the job: of three workers, two die right after writing a shuffle
    object, before committing. The third finishes the job; the dead attempts' objects go
    with the job's cleanup."""
    data = edge_cases(tmp_path / "in")
    deaths: Counter[str] = Counter()

    def dies_once() -> Any:
        async def hook(rt: Runtime, step: str, context: dict[str, Any]) -> None:
            if step == "map.shuffle_written" and not deaths[rt.worker_id]:
                deaths[rt.worker_id] += 1
                raise WorkerCrashed(step)

        return hook

    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=2,
        pool=pool,
        plan=_quiet(),
        hooks=[dies_once(), dies_once(), None],
        workers=3,
        reducers=3,
        clientless=True,
        shuffle="blob",
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert sum(deaths.values()) == 2
    assert diff_outputs(sequential(WORDCOUNT, data, 3), read_output(tmp_path / "out", 3)) == []
    assert result.leftovers == []


@in_virtual_time
async def test_a_spoiled_object_fails_the_job_with_the_reason(
    pool: Executor, tmp_path: Path
) -> None:
    """A bucket writer replaces a winner's object after its commit: its part no longer
    matches the commit's digest. No other copy exists, so the job fails, saying why."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"w{i % 5}\n" for i in range(200)))

    async def spoil(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "map.committed" and context["won"]:
            spec: JobSpec = (await lifecycle.load_spec(rt.backend, context["job"]))[0]
            url = lifecycle.shuffle_url(
                spec.scratch, spec.job_id, context["task"], context["attempt"]
            )
            data = await rt.backend.blobs.get(url)
            await rt.backend.blobs.put(url, bytes(len(data)))  # as long, all zeros

    result = await chaos_run(
        WORDCOUNT,
        src,
        tmp_path / "out",
        seed=3,
        pool=pool,
        plan=_quiet(),
        hooks=[spoil],
        workers=1,
        reducers=1,
        split_bytes=None,
        job_options={"max_task_attempts": 2},
        shuffle="blob",
    )
    assert result.record["state"] == "failed"
    assert "is not what its attempt wrote (its digest differs" in result.record["error"]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("part-*"))
    assert result.leftovers == []


@in_virtual_time
async def test_a_commit_record_that_names_parts_in_a_queue_shuffle_fails_the_job(
    pool: Executor, tmp_path: Path
) -> None:
    """A table writer adds parts to a winner's commit record in a job whose shuffle goes
    through queues: no reducer reads an object for it (none was written), and the job fails
    saying the record is not the job's kind."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"w{i % 5}\n" for i in range(200)))

    async def forge(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "map.committed" and context["won"]:
            pk, sk = job_pk(context["job"]), map_sk(context["task"])
            item = await rt.backend.table.get(pk, sk)
            assert item is not None
            commit = MapCommit.from_item(item)
            offset, forged = 0, {}
            for p in sorted(commit.batches):
                forged[p] = (offset, 100, bytes(PART_DIGEST))
                offset += 100
            changed = dataclasses.replace(commit, parts=forged)
            await rt.backend.table.put(pk, sk, {**item, **changed.to_item()})

    result = await chaos_run(
        WORDCOUNT,
        src,
        tmp_path / "out",
        seed=4,
        pool=pool,
        plan=_quiet(),
        hooks=[forge],
        workers=1,
        reducers=1,
        split_bytes=None,
        job_options={"max_task_attempts": 2},
        shuffle="queue",
    )
    assert result.record["state"] == "failed"
    assert "says its output went through the blob store" in result.record["error"]
    assert result.leftovers == []


@in_virtual_time
async def test_a_winners_missing_or_forged_page_fails_the_job_with_the_reason(
    pool: Executor, tmp_path: Path
) -> None:
    """A table writer deletes a winner's page after its commit, or rewrites it to name a
    partition of another page: its part cannot be known, and no other copy exists, so the
    job fails, saying which record is wrong."""
    from cmr.records import page_sk

    src = tmp_path / "in.txt"
    src.write_text("".join(f"w{i % 5}\n" for i in range(200)))
    errors = {}
    for how in ("deleted", "forged"):

        async def spoil(rt: Runtime, step: str, context: dict[str, Any], how: str = how) -> None:
            if step == "map.committed" and context["won"]:
                pk = job_pk(context["job"])
                sk = page_sk(context["task"], context["attempt"], 0)
                if how == "deleted":
                    await rt.backend.table.delete(pk, sk)
                else:
                    import msgpack

                    rows = msgpack.packb([[70, 0, 10, 1, 1, bytes(PART_DIGEST)]])
                    await rt.backend.table.put(pk, sk, {"page": 0, "rows": rows})

        result = await chaos_run(
            WORDCOUNT,
            src,
            tmp_path / f"out-{how}",
            seed=5,
            pool=pool,
            plan=_quiet(),
            hooks=[spoil],
            workers=1,
            reducers=2,
            split_bytes=None,
            job_options={"max_task_attempts": 2},
            shuffle="blob",
        )
        assert result.record["state"] == "failed", how
        errors[how] = result.record["error"]
        assert result.leftovers == [], how
    assert "commit has no page 0" in errors["deleted"], errors
    assert "map page record is malformed: partition 70" in errors["forged"], errors


@in_virtual_time
async def test_a_job_of_many_partitions_pages_its_parts(pool: Executor, tmp_path: Path) -> None:
    """130 partitions: each winner writes three pages, its commit record names none of its
    parts (a record that did grew with the partitions, and every reducer read them all);
    the output is exact and nothing is left."""
    from cmr.records import PAGE_PARTITIONS, page_sk

    data = edge_cases(tmp_path / "in")
    seen: dict[str, Any] = {}

    async def look(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "map.committed" and context["won"] and not seen:
            pk = job_pk(context["job"])
            seen["commit"] = await rt.backend.table.get(pk, map_sk(context["task"]))
            seen["pages"] = [
                await rt.backend.table.get(pk, page_sk(context["task"], context["attempt"], g))
                for g in range(3)
            ]

    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=6,
        pool=pool,
        plan=_quiet(),
        hooks=[look],
        workers=2,
        reducers=130,
        split_bytes=4096,
        shuffle="blob",
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert diff_outputs(sequential(WORDCOUNT, data, 130), read_output(tmp_path / "out", 130)) == []
    commit = MapCommit.from_item(seen["commit"])
    assert commit.pages == 3 and not commit.batches and not commit.parts
    # No counts at all: a worker of before pages refuses the record (its counts must be
    # bytes) rather than read it as an attempt that sent nothing.
    assert "parts" not in seen["commit"] and "counts" not in seen["commit"]
    assert all(page is not None for page in seen["pages"])
    from cmr.records import MapPage

    rows = [MapPage.from_item(p, g, 130).rows for g, p in enumerate(seen["pages"])]
    assert any(rows) and all(g * PAGE_PARTITIONS <= p < (g + 1) * PAGE_PARTITIONS
                             for g, r in enumerate(rows) for p in r)  # fmt: skip
    assert result.leftovers == []


@in_virtual_time
async def test_stale_reads_of_commits_and_pages_only_delay_a_reducer(
    pool: Executor, tmp_path: Path
) -> None:
    """A reducer polls the commit records, and reads its pages, eventually consistently (at
    half a strong read's price: cmr.reducer._drain, cmr.bulk.unpaged). Here most such reads
    answer as a lagging replica would: commits not yet there, pages not yet written. The
    output is still exact, every winner's part is read once, and nothing is left."""
    data = edge_cases(tmp_path / "in")
    result = await chaos_run(
        WORDCOUNT,
        data,
        tmp_path / "out",
        seed=7,
        pool=pool,
        plan=FaultPlan(seed=7, stale_read=0.8),
        workers=2,
        reducers=3,
        split_bytes=2048,
        shuffle="blob",
    )
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert result.injected["stale_read"] > 20, result.injected
    assert diff_outputs(sequential(WORDCOUNT, data, 3), read_output(tmp_path / "out", 3)) == []
    assert result.leftovers == []
