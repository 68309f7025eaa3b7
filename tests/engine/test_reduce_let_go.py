"""A reducer that lost its claim hands its batches back; what it receives after that is
handed back too, never deleted (tests/chaos/test_steps.py's pause at reduce.draining met
this about one run in fifteen: the next owner waited for a batch that no longer existed,
and the job failed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import structlog

from cmr import wire
from cmr.backends.base import Backend
from cmr.backends.embedded import embedded_backend
from cmr.backends.embedded.queues import EmbeddedQueues
from cmr.job import JobRef
from cmr.records import JobSpec, MapCommit
from cmr.reducer import Drain, _let_go

JOB_ID = "20260101-000000-0123456789abcdef"


QUEUE = f"cmr-{JOB_ID}-p0"


async def _partition(
    tmp_path: Path, bodies: list[bytes], queues: EmbeddedQueues | None = None
) -> tuple[Backend, JobSpec, SimpleNamespace]:
    """An embedded backend whose partition queue (QUEUE) of a one-map job holds ``bodies``;
    the job's spec, and a runtime as much as a drain uses."""
    be = embedded_backend(tmp_path / "scratch", queues=queues)
    spec = JobSpec(
        job_id=JOB_ID,
        ref=JobRef("examples/wordcount.py", "0" * 64),
        params={},
        maps=1,
        partitions=1,
        output=str(tmp_path / "out"),
        scratch=be.scratch,
        queue_prefix="cmr-",
        visibility_s=2,
        max_task_failures=3,
    )
    await be.queues.create(QUEUE, visibility_s=2)
    await be.queues.send(QUEUE, bodies)
    return be, spec, SimpleNamespace(backend=be, log=structlog.get_logger())


def _batch(attempt: str) -> bytes:
    """Map task 0's only batch (seq 0) of ``attempt``, as its mapper sends it."""
    return wire.encode(wire.Batch(JOB_ID, 0, attempt, 0, 0, 1, wire.pack(["word", 1])))


async def test_a_batch_received_again_after_letting_go_is_handed_back(tmp_path: Path) -> None:
    be, spec, rt = await _partition(tmp_path, [_batch("0123456789ab")])
    drain = Drain(spec, 0, str(tmp_path))
    (first,) = await be.queues.receive(QUEUE)
    await drain.accept(rt, first)  # type: ignore[arg-type]
    # The claim is lost: the renewal loop hands the batch back at once...
    await _let_go(rt, drain, QUEUE, lost=True)  # type: ignore[arg-type]
    # ...while the drain loop, still in its long poll, receives it again before it sees the
    # loss, and goes on to delete what it counts as unneeded.
    (again,) = await be.queues.receive(QUEUE)
    assert again.message_id == first.message_id
    await drain.accept(rt, again)  # type: ignore[arg-type]
    await drain.delete_unneeded(rt, QUEUE)  # type: ignore[arg-type]
    await _let_go(rt, drain, QUEUE, lost=True)  # type: ignore[arg-type]  # on its way out
    # The next owner receives the batch.
    assert [m.message_id for m in await be.queues.receive(QUEUE)] == [first.message_id]


async def test_two_readers_never_delete_both_copies_of_a_batch(tmp_path: Path) -> None:
    """A batch sent twice (a sender's retry): the owner A keeps it through one copy, and is
    paused past its lease; B claims and keeps it through the other copy. Each then receives
    the copy the other keeps (leases lapse, deliveries repeat) before A learns that it lost
    the claim. Counted as repeats and deleted, both copies left the queue, and once B lost
    its claim too, the next owner waited for the batch until the job failed (the embedded
    chaos suite's seed 94 met this once, in a full run)."""
    now = [0.0]
    body = _batch("0123456789ab")
    be, spec, rt = await _partition(tmp_path, [body, body], EmbeddedQueues(clock=lambda: now[0]))
    a, b = Drain(spec, 0, str(tmp_path / "a")), Drain(spec, 0, str(tmp_path / "b"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    m1, m2 = await be.queues.receive(QUEUE, max_messages=10)
    await be.queues.change_visibility(QUEUE, [m1.receipt], 0)  # one copy given back
    await a.accept(rt, m2)  # type: ignore[arg-type]  # A keeps the batch through M2
    now[0] += 3  # A paused past its lease: B claims; M2 reappears
    b1, b2 = await be.queues.receive(QUEUE, max_messages=10)
    await b.accept(rt, b1)  # type: ignore[arg-type]
    await b.accept(rt, b2)  # type: ignore[arg-type]  # the other copy: a repeat for B
    await b.delete_unneeded(rt, QUEUE)  # type: ignore[arg-type]
    await be.queues.change_visibility(QUEUE, [b1.receipt], 0)  # B's copy delivered again
    (a1,) = await be.queues.receive(QUEUE, max_messages=10)  # to A, not yet told of its loss
    await a.accept(rt, a1)  # type: ignore[arg-type]  # a repeat for A
    await a.delete_unneeded(rt, QUEUE)  # type: ignore[arg-type]
    await _let_go(rt, a, QUEUE, lost=True)  # type: ignore[arg-type]  # A learns of its loss
    await _let_go(rt, b, QUEUE, lost=True)  # type: ignore[arg-type]  # and B loses in turn
    now[0] += 100
    got = await be.queues.receive(QUEUE, max_messages=10)
    assert {m.body for m in got} == {body}, "no copy of the batch is left for the next owner"
    assert b.stats["batches_dropped"] == a.stats["batches_dropped"] == 1  # counted once each


async def test_a_commit_learned_after_letting_go_deletes_nothing(tmp_path: Path) -> None:
    """The renewal loop lets go while the drain waits on the table; the commit it then learns
    makes a losing attempt's batches unneeded: they were handed back, not ours to delete (it
    raised KeyError and failed the reduce)."""
    be, spec, rt = await _partition(tmp_path, [_batch("aaaaaaaaaaaa")])  # the loser's
    drain = Drain(spec, 0, str(tmp_path))
    (m,) = await be.queues.receive(QUEUE)
    await drain.accept(rt, m)  # type: ignore[arg-type]
    await _let_go(rt, drain, QUEUE, lost=True)  # type: ignore[arg-type]
    drain.learn_winner(0, MapCommit("bbbbbbbbbbbb", {0: 1}, {0: 1}))
    assert drain.unneeded == [] and drain.held == {}
    assert drain.stats["batches_filtered"] == 1
