"""A reducer that lost its claim hands its batches back; what it receives after that is
handed back too, never deleted (tests/chaos/test_steps.py's pause at reduce.draining met
this about one run in fifteen: the next owner waited for a batch that no longer existed,
and the job failed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import structlog

from cmr import wire
from cmr.backends.embedded import embedded_backend
from cmr.job import JobRef
from cmr.records import JobSpec
from cmr.reducer import Drain, _let_go

JOB_ID = "20260101-000000-0123456789abcdef"


async def test_a_batch_received_again_after_letting_go_is_handed_back(tmp_path: Path) -> None:
    be = embedded_backend(tmp_path / "scratch")
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
    queue = f"cmr-{JOB_ID}-p0"
    await be.queues.create(queue, visibility_s=2)
    batch = wire.Batch(JOB_ID, 0, "0123456789ab", 0, 0, 1, wire.pack(["word", 1]))
    await be.queues.send(queue, [wire.encode(batch)])
    rt = SimpleNamespace(backend=be, log=structlog.get_logger())
    drain = Drain(spec, 0, str(tmp_path))
    (first,) = await be.queues.receive(queue)
    await drain.accept(rt, first)  # type: ignore[arg-type]
    # The claim is lost: the renewal loop hands the batch back at once...
    await _let_go(rt, drain, queue, lost=True)  # type: ignore[arg-type]
    # ...while the drain loop, still in its long poll, receives it again before it sees the
    # loss, and goes on to delete what it counts as unneeded.
    (again,) = await be.queues.receive(queue)
    assert again.message_id == first.message_id
    await drain.accept(rt, again)  # type: ignore[arg-type]
    await drain.delete_unneeded(rt, queue)  # type: ignore[arg-type]
    await _let_go(rt, drain, queue, lost=True)  # type: ignore[arg-type]  # on its way out
    # The next owner receives the batch.
    assert [m.message_id for m in await be.queues.receive(queue)] == [first.message_id]
