"""No hidden master: issue 10's reproductions, each run with nobody waiting on the job.

Every run here is *clientless* (``chaos_run(clientless=True)``): the job is submitted and
left to its workers; nobody finalizes, cleans up or replaces a dead worker. The job must end
on its own — succeeded with exact output, or failed with the reason — and leave nothing
behind (``result.leftovers``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.api import cpu_pool
from cmr.backends.base import Backend, Put, TxWrite, Update
from cmr.backends.embedded import EmbeddedTable
from cmr.backends.faults import FaultPlan
from cmr.claim import Claim, Refusal, claim
from cmr.errors import BackendError, Rejected, UsageError
from cmr.mapper import SEND_CONCURRENCY
from cmr.pool import CpuPool
from cmr.records import ACTIVE_PK, JOBS_PK, JobSpec, job_pk
from cmr.runtime import Runtime, WorkerCrashed
from cmr.settings import WorkerSettings
from cmr.testing import StepChaos, chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases

WORDCOUNT = "examples/wordcount.py"
REDUCERS = 3


class At:
    """Crash (or pause) the first worker that reaches ``step``; remember who and where."""

    def __init__(self, step: str, action: str = "crash", pause_s: float = 6.0) -> None:
        self.step, self.action, self.pause_s = step, action, pause_s
        self.context: dict[str, Any] | None = None
        self.worker = ""

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step != self.step or self.context is not None:
            return
        self.context, self.worker = context, rt.worker_id
        if self.action == "crash":
            raise WorkerCrashed(step)
        await rt.pause(self.pause_s)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    data = edge_cases(tmp_path_factory.mktemp("nomaster") / "in")
    return data, sequential(WORDCOUNT, data, REDUCERS)


def quiet(seed: int = 0) -> FaultPlan:
    return FaultPlan(seed=seed)


async def clientless(data: Path, out: Path, pool: Executor, **kwargs: Any) -> Any:  # a ChaosResult
    kwargs.setdefault("plan", quiet())
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("reducers", REDUCERS)
    kwargs.setdefault("split_bytes", 4096)
    kwargs.setdefault("timeout_s", 120.0)
    return await chaos_run(WORDCOUNT, data, out, seed=0, pool=pool, clientless=True, **kwargs)


def succeeded_exactly(result: Any, expected: list[str], out: Path) -> None:
    assert result.record.get("state") == "succeeded", result.record.get("error")
    assert diff_outputs(expected, read_output(out, REDUCERS)) == []
    assert result.leftovers == []


# 1. The last committer was the only finalizer.


@pytest.mark.parametrize("step", ["finalize.begin", "publish.copied", "finalize.succeeded"])
@in_virtual_time
async def test_the_last_committer_dying_mid_finalize_strands_nothing(
    step: str, corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    at = At(step)
    result = await clientless(data, tmp_path / "out", pool, hooks=[at, at])
    assert at.context is not None
    succeeded_exactly(result, expected, tmp_path / "out")


# 2. A --job worker cancelled its own cleanup when its job turned final.


@in_virtual_time
async def test_a_lone_job_worker_finishes_its_own_cleanup(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    result = await clientless(data, tmp_path / "out", pool, workers=1, hooks=[None])
    succeeded_exactly(result, expected, tmp_path / "out")


# 3. A state change whose answer was lost left the job listed as running.


class LoseAnswer:
    """A table whose first write matching ``pick`` is applied, then answered with a 500."""

    def __init__(self, inner: Any, pick: Callable[[Sequence[TxWrite]], bool]) -> None:
        self.inner, self.pick, self.lost = inner, pick, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        await self.inner.transact(writes, token=token)
        if not self.lost and self.pick(writes):
            self.lost += 1
            raise BackendError("500 InternalError (lost after it applied)")

    async def update(self, write: Update) -> Any:
        got = await self.inner.update(write)
        # The old code's first write of a final state: update(job record, state=...).
        if not self.lost and (write.set_ or {}).get("state") == "succeeded":
            self.lost += 1
            raise BackendError("500 InternalError (lost after it applied)")
        return got


def sets_succeeded(writes: Sequence[TxWrite]) -> bool:
    return any(isinstance(w, Update) and (w.set_ or {}).get("state") == "succeeded" for w in writes)


@in_virtual_time
async def test_a_lost_answer_to_the_final_state_change_leaves_no_running_listing(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus
    lossy: list[LoseAnswer] = []

    def wrap(be: Backend) -> Backend:
        lossy.append(LoseAnswer(be.table, sets_succeeded))
        return dataclasses.replace(be, table=lossy[0])

    result = await clientless(data, tmp_path / "out", pool, wrap=wrap)
    assert lossy[0].lost == 1
    succeeded_exactly(result, expected, tmp_path / "out")
    table = lossy[0].inner
    assert (await table.get(JOBS_PK, result.job_id))["state"] == "succeeded"
    assert await table.get(ACTIVE_PK, result.job_id) is None


# 4. Failures other than user code were retried forever.


@in_virtual_time
async def test_an_input_deleted_after_submit_fails_the_job_naming_it(
    pool: Executor, tmp_path: Path
) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "keep.txt").write_text("a b c\n" * 100)
    (data / "gone.txt").write_text("x y z\n" * 100)

    async def delete(be: Backend, spec: JobSpec) -> None:
        (data / "gone.txt").unlink()

    result = await clientless(data, tmp_path / "out", pool, after_submit=delete)
    assert result.record["state"] == "failed"
    error = result.record["error"]
    assert "gone.txt" in error and "no longer exists" in error and "would fail again" in error
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert result.leftovers == []


@in_virtual_time
async def test_an_input_name_that_is_not_utf8_is_refused_at_submit(
    pool: Executor, tmp_path: Path
) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "ok.txt").write_text("a\n")
    with open(bytes(data) + b"/caf\xe9.txt", "wb") as f:  # a Latin-1 name, as old tools write
        f.write(b"b\n")
    with pytest.raises(UsageError, match=r"caf\\xe9\.txt.*not valid UTF-8"):
        await clientless(data, tmp_path / "out", pool)


class RejectMapCommits:
    """The table refuses map commits as DynamoDB refuses an item over 400 KB."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def transact(self, writes: Sequence[TxWrite], *, token: str) -> None:
        if any(isinstance(w, Put) and w.sk.startswith("map#") for w in writes):
            raise Rejected("dynamodb.TransactWriteItems rejected: ValidationException: Item size")
        await self.inner.transact(writes, token=token)


@in_virtual_time
async def test_a_write_the_store_rejects_fails_the_job_at_once(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, _ = corpus

    def wrap(be: Backend) -> Backend:
        return dataclasses.replace(be, table=RejectMapCommits(be.table))

    result = await clientless(data, tmp_path / "out", pool, wrap=wrap)
    assert result.record["state"] == "failed"
    assert "would fail again" in result.record["error"]
    assert "Rejected" in result.record["error"] and "ValidationException" in result.record["error"]
    assert result.leftovers == []


@in_virtual_time
async def test_an_engine_error_tied_to_a_worker_is_counted_and_ends_the_job(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    """Something other than the job's code fails every task (here: the worker's spool
    directory vanished, as under a tmp cleaner or a full disk): counted, bounded, reported."""
    data, _ = corpus

    class RemoveSpool:
        async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
            if step == "map.partly_sent":
                import shutil

                shutil.rmtree(rt.spool_dir, ignore_errors=True)

    result = await clientless(data, tmp_path / "out", pool, workers=1, hooks=[RemoveSpool()])
    assert result.record["state"] == "failed"
    error = result.record["error"]
    assert "failed 3 times" in error and "FileNotFoundError" in error
    assert result.leftovers == []


SPINNING_JOB = """
import signal
import cmr

class Spin(cmr.Job):
    def map(self, key, line):
        if line == "spin":
            if self.params.get("deaf"):
                # Code that never returns to Python's signal handler (a C loop) is simulated
                # by blocking the signal the soft time limit uses.
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            while True:
                pass
        yield line, 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


@in_virtual_time
async def test_user_code_that_never_returns_is_stopped_by_its_time_limit(
    pool: Executor, tmp_path: Path
) -> None:
    job = tmp_path / "spin.py"
    job.write_text(SPINNING_JOB)
    src = tmp_path / "in.txt"
    src.write_text("a\nspin\nb\n")
    result = await chaos_run(
        str(job),
        src,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=quiet(),
        hooks=[None],
        workers=1,
        reducers=1,
        clientless=True,
        job_options={"task_timeout_s": 1, "max_task_failures": 2},
    )
    assert result.record["state"] == "failed"
    error = result.record["error"]
    assert "failed 2 times" in error and "TimeLimitExceeded" in error
    assert "time limit of 1 s" in error and "spin.py" in error  # where it was stuck
    assert result.leftovers == []


@pytest.fixture
def own_pool() -> Iterator[CpuPool]:
    """A pool of the test's own, killed at its end: the job may fail while a second attempt
    of the deaf task has just started (its message came back after the restart), and a
    worker that stops leaves what it waited on running, which in the session's pool would
    spin until the session ends, and hang its shutdown."""
    pool = cpu_pool(2)
    try:
        yield pool
    finally:
        pool.kill()
        pool.shutdown()


@in_virtual_time
@pytest.mark.slow
async def test_user_code_deaf_to_its_time_limit_is_killed(
    own_pool: CpuPool, tmp_path: Path
) -> None:
    pool = own_pool
    job = tmp_path / "spin.py"
    job.write_text(SPINNING_JOB)
    src = tmp_path / "in.txt"
    src.write_text("spin\n")
    result = await chaos_run(
        str(job),
        src,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=quiet(),
        hooks=[None],
        workers=1,
        reducers=1,
        clientless=True,
        params={"deaf": "1"},
        job_options={"task_timeout_s": 1, "max_task_failures": 1},
    )
    assert result.record["state"] == "failed"
    assert "did not stop when told to" in result.record["error"]
    assert result.leftovers == []
    # The pool was restarted, not lost: it still runs work.
    assert pool.submit(sum, [1, 2]).result(timeout=30) == 3


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("visibility_s", 0, "--visibility-timeout must be between 1"),
        ("partitions", 0, "--reducers must be between 1"),
        ("partitions", 100_000, "--reducers must be between 1"),
        ("max_task_failures", 0, "--max-task-attempts must be between 1"),
        ("task_timeout_s", -1, "--task-timeout"),
    ],
)
@in_virtual_time
async def test_nonsense_settings_are_refused_at_submit(
    option: str, value: int, message: str, pool: Executor, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    kwargs: dict[str, Any] = {"job_options": {option: value}}
    if option == "visibility_s":
        kwargs = {"visibility_s": value}
    elif option == "partitions":
        kwargs = {"reducers": value}
    with pytest.raises(UsageError, match=message):
        await clientless(src, tmp_path / "out", pool, **kwargs)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@in_virtual_time
async def test_a_task_that_kills_every_worker_fails_the_job(pool: Executor, tmp_path: Path) -> None:
    """A task whose workers die on it (out of memory, say) never raises: its restarts are
    counted, and the job fails once it has started too often. A supervisor replaces the
    dead workers here, as systemd or an autoscaler would."""
    src = tmp_path / "in.txt"
    src.write_text("poison pill\n")
    kill = StepChaos(crash=1.0, max_crashes=6)
    result = await chaos_run(
        WORDCOUNT,
        src,
        tmp_path / "out",
        seed=3,
        pool=pool,
        plan=quiet(),
        steps=kill,
        workers=1,
        reducers=1,
        split_bytes=None,
        job_options={"max_task_attempts": 3},
    )
    assert result.record["state"] == "failed"
    assert "map task 0 was started 4 times without finishing" in result.record["error"]
    assert result.leftovers == []


# 5. Two reduce slots of one worker could both own a partition.


@in_virtual_time
async def test_two_slots_of_one_worker_never_own_one_partition(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, _ = corpus
    settings = WorkerSettings(map_slots=2, reduce_slots=2, processes=1, memory_mb=1)
    # One partition, and every message delivered twice: both idle reduce slots of the one
    # worker receive its task together, and claim it with the same worker id.
    result = await clientless(
        data,
        tmp_path / "out",
        pool,
        workers=1,
        reducers=1,
        hooks=[None],
        settings=settings,
        plan=FaultPlan(seed=5, duplicate_delivery=1.0),
    )
    assert result.record["state"] == "succeeded"
    assert diff_outputs(sequential(WORDCOUNT, data, 1), read_output(tmp_path / "out", 1)) == []
    assert result.leftovers == []


async def running_job(table: EmbeddedTable, job_id: str) -> None:
    await table.transact(
        [Put(ACTIVE_PK, job_id, {"state": "running"}), Put(job_pk(job_id), "job", {})],
        token=job_id,
    )


@in_virtual_time
async def test_two_claims_by_one_worker_are_two_contenders() -> None:
    """The two slots' claims carry the same worker id; only one may own the partition."""
    table = EmbeddedTable()
    await running_job(table, "20260101-000000-bbbbbb")
    awake = asyncio.Event()
    awake.set()
    first = await claim(table, "20260101-000000-bbbbbb", 0, "w1-worker", 1, awake)
    assert isinstance(first, Claim)
    async with first.renewing(awake):
        second = await claim(table, "20260101-000000-bbbbbb", 0, "w1-worker", 1, awake)
    assert isinstance(second, Refusal) and second.contended and not second.committed
    assert await first.commit("file:///out", 1, 1)


# 7. Claims compared two machines' clocks.


@in_virtual_time
async def test_a_takeover_compares_no_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contender whose wall clock runs an hour ahead must not take a live claim over: it
    watches the holder's beat on its own clock instead."""
    table = EmbeddedTable()
    job_id = "20260101-000000-aaaaaa"
    await running_job(table, job_id)
    awake = asyncio.Event()
    awake.set()
    holder = await claim(table, job_id, 0, "holder", 1, awake)
    assert isinstance(holder, Claim)
    async with holder.renewing(awake):
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600)
        contender = await claim(table, job_id, 0, "contender", 1, awake)
    assert isinstance(contender, Refusal) and not contender.committed
    assert not holder.lost.is_set()
    assert await holder.commit("file:///out", 1, 1)


# 7. The map side held its whole shuffle spool in memory while sending.


def _is_send(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", "").endswith("_send_spool.<locals>.send")


class SlowSends:
    """Queues whose sends take a while, noting the most send tasks alive at once: each holds
    its batch of bodies in memory until it is sent."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.peak = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        alive = len([t for t in asyncio.all_tasks() if _is_send(t)])
        self.peak = max(self.peak, alive)
        if name.rsplit("-", 1)[1].startswith("p"):
            await asyncio.sleep(0.02)
        await self.inner.send(name, bodies)


@in_virtual_time
async def test_a_map_holds_a_bounded_number_of_batches_while_sending(
    pool: Executor, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"word{i} " * 3 + "\n" for i in range(30_000)))  # ~1,000 batches
    slow: list[SlowSends] = []

    def wrap(be: Backend) -> Backend:
        slow.append(SlowSends(be.queues))
        return dataclasses.replace(be, queues=slow[0])

    settings = WorkerSettings(
        map_slots=1,
        reduce_slots=1,
        processes=1,
        memory_mb=64,
        message_bytes=1024,
        compress=False,
        use_combiner=False,
    )
    result = await chaos_run(
        WORDCOUNT,
        src,
        tmp_path / "out",
        seed=0,
        pool=pool,
        plan=quiet(),
        hooks=[None],
        workers=1,
        reducers=1,
        visibility_s=10,
        split_bytes=None,
        clientless=True,
        settings=settings,
        wrap=wrap,
    )
    assert result.record["state"] == "succeeded"
    assert diff_outputs(sequential(WORDCOUNT, src, 1), read_output(tmp_path / "out", 1)) == []
    assert 1 <= slow[0].peak <= SEND_CONCURRENCY


# A queue's retention ran out (or it was purged): task messages were lost for good.


@in_virtual_time
async def test_lost_task_messages_are_sent_again_from_the_plan(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, expected = corpus

    async def purge(be: Backend, spec: JobSpec) -> None:
        in_q, reduce_q, _ = spec.queues()
        for q in (in_q, reduce_q):
            while got := await be.queues.receive(q, max_messages=10):
                await be.queues.delete_messages(q, [m.receipt for m in got])

    settings = WorkerSettings(map_slots=2, reduce_slots=2, processes=1, memory_mb=1, janitor_s=1.0)
    result = await clientless(data, tmp_path / "out", pool, after_submit=purge, settings=settings)
    succeeded_exactly(result, expected, tmp_path / "out")
    assert result.record["tasks_resent"] == result.record["maps"] + REDUCERS


@in_virtual_time
async def test_a_job_whose_queues_were_deleted_fails_instead_of_waiting_forever(
    corpus: tuple[Path, list[str]], pool: Executor, tmp_path: Path
) -> None:
    data, _ = corpus

    async def delete_queues(be: Backend, spec: JobSpec) -> None:
        in_q, reduce_q, parts = spec.queues()
        for q in (in_q, reduce_q, *parts):
            await be.queues.delete(q)

    settings = WorkerSettings(map_slots=1, reduce_slots=1, processes=1, memory_mb=1, janitor_s=1.0)
    result = await clientless(
        data, tmp_path / "out", pool, after_submit=delete_queues, settings=settings
    )
    assert result.record["state"] == "failed"
    assert "queues were deleted" in result.record["error"]
    assert result.leftovers == []
