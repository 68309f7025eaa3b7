"""A map task: read the split, map/combine/partition in the pool, send tagged batches, and
commit the attempt.

Duplicate deliveries of a task are allowed to run (method 1 of the seeds): every attempt
has its own id and tags its batches with it; after all its batches are sent, the attempt
tries to write the task's commit record *if absent*. The first such write wins, forever;
reducers take only the winner's batches, so a losing or crashed attempt's output is never
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack

from cmr import compute, wire
from cmr.backends.base import Eq, Received, item_absent
from cmr.errors import ConditionFailed, QueueGone
from cmr.lease import message_lease
from cmr.lifecycle import fail, job_scratch
from cmr.records import JobSpec, MapCommit, fail_sk, job_pk, map_sk
from cmr.runtime import Runtime
from cmr.split import read_split

SEND_CONCURRENCY = 16


async def run_map_task(rt: Runtime, spec: JobSpec, msg: Received, task: wire.MapTask) -> None:
    in_q, _, part_qs = spec.queues()
    table, queues = rt.backend.table, rt.backend.queues
    pk = job_pk(spec.job_id)
    stats: Counter[str] = Counter()
    if await table.get(pk, map_sk(task.task)) is not None:
        stats["map_duplicates_skipped"] += 1
        await queues.delete_messages(in_q, [msg.receipt])
        await rt.add_stats(spec.job_id, stats)
        return
    attempt = secrets.token_hex(6)
    log = rt.log.bind(job=spec.job_id, task=task.task, attempt=attempt)
    async with message_lease(queues, in_q, msg.receipt, spec.visibility_s, rt.awake):
        chunks = await asyncio.gather(*(read_split(rt.backend.blobs, r) for r in task.ranges))
        result = await rt.cpu(
            compute.run_map,
            spec.ref,
            spec.params,
            [(r.name, data) for r, data in zip(task.ranges, chunks, strict=True)],
            compute.MapSpec(
                spec.job_id,
                task.task,
                attempt,
                spec.partitions,
                rt.settings.shuffle_bytes(queues.max_message_bytes),
                rt.spool_dir,
                compress=rt.settings.compress,
                combine=rt.settings.use_combiner,
                piece_bytes=compute.map_piece_bytes(rt.settings.memory_mb * 1024 * 1024),
            ),
        )
        del chunks
        if result.error:
            await task_failed(
                rt, spec, f"m{task.task}", f"map task {task.task}", result.error, in_q, msg
            )
            return
        try:
            await _send_spool(rt, spec, task.task, attempt, result.spool, part_qs)
        finally:
            os.unlink(result.spool)
        commit = MapCommit(
            attempt,
            {p: b for p, b in enumerate(result.batches) if b},
            {p: r for p, r in enumerate(result.records) if r},
            result.records_in,
            result.bytes_in,
        )
        try:
            await table.put(pk, map_sk(task.task), commit.to_item(), condition=item_absent())
            won = True
        except ConditionFailed:
            # Read back: a retried put that was applied the first time is refused, yet won.
            held = await table.get(pk, map_sk(task.task), consistent=True)
            won = held is not None and held.get("attempt") == attempt
        if not won:
            stats["map_attempts_filtered"] += 1
            log.info("map attempt lost to an earlier commit; its batches will be ignored")
        else:
            # For progress displays only: finalize writes exact totals from the commits.
            stats["progress_maps"] += 1
            stats["progress_bytes"] += result.bytes_in
        await rt.step("map.committed", task=task.task, attempt=attempt, won=won)
        try:
            await queues.delete_messages(in_q, [msg.receipt])
        except QueueGone:
            # The job ended and was cleaned up while we worked (a pause, a slow network):
            # our commit landed on a cleaned table. Take it back, so nothing stray remains.
            if won:
                with contextlib.suppress(ConditionFailed):
                    await table.delete(pk, map_sk(task.task), condition=Eq("attempt", attempt))
            raise
    await rt.add_stats(spec.job_id, stats)


async def _send_spool(
    rt: Runtime, spec: JobSpec, task: int, attempt: str, spool: str, part_qs: list[str]
) -> None:
    queues, blobs = rt.backend.queues, rt.backend.blobs
    gate = asyncio.Semaphore(SEND_CONCURRENCY)
    pending: dict[int, list[bytes]] = {}

    sent = 0

    async def send(p: int, bodies: list[bytes]) -> None:
        nonlocal sent
        async with gate:
            await queues.send(part_qs[p], bodies)
        sent += 1
        if sent == 1:
            await rt.step("map.partly_sent", task=task, attempt=attempt)

    async def spilled_body(p: int, seq: int, n: int, stream: bytes) -> bytes:
        # A value too big for one message travels through the blob store instead.
        url = f"{job_scratch(spec.scratch, spec.job_id)}spill/{task}-{attempt}-{p}-{seq}"
        await blobs.put(url, stream)
        return wire.encode(
            wire.Batch(spec.job_id, task, attempt, p, seq, n, b"", url),
            compress=rt.settings.compress,
        )

    try:
        await _send_all(spool, pending, send, spilled_body)
    except BaseExceptionGroup as group:
        # Callers handle single backend errors (retry, abandon the attempt); not groups.
        raise group.exceptions[0] from None


async def _send_all(
    spool: str,
    pending: dict[int, list[bytes]],
    send: Callable[[int, list[bytes]], Coroutine[Any, Any, None]],
    spilled_body: Callable[[int, int, int, bytes], Coroutine[Any, Any, bytes]],
) -> None:
    async with asyncio.TaskGroup() as tg:
        with open(spool, "rb") as f:
            for p, seq, n, data, spilled in msgpack.Unpacker(f, raw=False, use_list=False):
                body = await spilled_body(p, seq, n, data) if spilled else data
                bucket = pending.setdefault(p, [])
                bucket.append(body)
                if len(bucket) >= 10:
                    tg.create_task(send(p, bucket))
                    pending[p] = []
        for p, bucket in pending.items():
            if bucket:
                tg.create_task(send(p, bucket))


async def task_failed(
    rt: Runtime, spec: JobSpec, task_id: str, what: str, error: str, queue: str, msg: Received
) -> None:
    """User code raised: count it; retry the task, or fail the job once it keeps failing."""
    item = await rt.backend.table.update(
        job_pk(spec.job_id), fail_sk(task_id), set_={"error": error[-4000:]}, add={"count": 1}
    )
    failures = int(item["count"])
    rt.log.warning(
        "user code failed",
        job=spec.job_id,
        task=what,
        failures=failures,
        error=error.strip().splitlines()[-1],
    )
    if failures >= spec.max_task_failures:
        await fail(rt.backend, spec, f"{what} failed {failures} times; last error:\n{error}")
        return
    await rt.add_stats(spec.job_id, Counter(tasks_retried=1))
    await rt.backend.queues.change_visibility(queue, [msg.receipt], 0)
