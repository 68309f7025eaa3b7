"""Two jobs in one store, served by the same workers and pool: one job's messages cannot
affect the other's (issue 12, isolation). A cross-poster copies every message it sees in one
job's queues into the other job's matching queue (map tasks, reduce tasks, batches), for the
whole run; nobody waits on the jobs but the test, which only reads."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from pathlib import Path

from cmr import submit, watch
from cmr.api import job_ref
from cmr.backends.base import Backend
from cmr.errors import QueueGone
from cmr.pool import cpu_pool
from cmr.publish import MANIFEST, Manifest
from cmr.records import JobSpec, job_pk
from cmr.settings import WorkerSettings
from cmr.submit import JobOptions
from cmr.worker import Worker

from .corpus import edge_cases, small_files
from .reference import counts_from_parts, index_from_parts, inverted_index, word_count

REPO = Path(__file__).resolve().parents[2]
REDUCERS = 3


async def _cross_post(be: Backend, a: JobSpec, b: JobSpec, copied: Counter[str]) -> None:
    """Receive (1 s visibility, never delete) from each job's queues and send the bodies to
    the other job's queue of the same role."""
    rnd = random.Random(11)
    pairs = []
    for src, dst in ((a, b), (b, a)):
        s_in, s_red, s_parts = src.queues()
        d_in, d_red, d_parts = dst.queues()
        pairs += [(s_in, d_in, "map"), (s_red, d_red, "reduce")]
        pairs += [(sp, dp, "batch") for sp, dp in zip(s_parts, d_parts, strict=True)]
    while True:
        for src_q, dst_q, kind in pairs:
            with contextlib.suppress(QueueGone):
                got = await be.queues.receive(src_q, max_messages=10, visibility_s=1)
                bodies = [m.body for m in got if rnd.random() < 0.7]
                if bodies:
                    await be.queues.send(dst_q, bodies)
                    copied[kind] += len(bodies)
        await asyncio.sleep(0.02)


async def test_one_jobs_messages_cannot_affect_another(embedded: Backend, tmp_path: Path) -> None:
    words, docs = edge_cases(tmp_path / "words"), small_files(tmp_path / "docs", 40)
    specs = [
        await submit.submit(
            embedded,
            job_ref(str(REPO / "examples" / job)),
            str(data),
            str(tmp_path / f"out-{job}"),
            JobOptions(partitions=REDUCERS, visibility_s=5),
            queue_prefix="cmr-",
            parallelism=4,
            split_bytes=4096,
        )
        for job, data in (("wordcount.py", words), ("invertedindex.py", docs))
    ]
    copied: Counter[str] = Counter()
    ws = WorkerSettings(processes=1, poll_s=0.05, janitor_s=1, jobs_from=(str(REPO),))
    with cpu_pool(1) as pool:
        # Two workers that serve every job in the store, sharing one pool process: tasks of
        # both jobs run in the same process in turn.
        workers = [Worker(embedded, ws, pool) for _ in range(2)]
        runs = [asyncio.create_task(w.run()) for w in workers]
        poster = asyncio.create_task(_cross_post(embedded, specs[0], specs[1], copied))
        try:
            async with asyncio.timeout(180):  # watching only reads the table
                await asyncio.gather(*(watch.wait(embedded, s, poll_s=0.1) for s in specs))
        finally:
            poster.cancel()
            for w in workers:
                w.done.set()
            await asyncio.gather(*runs, poster, return_exceptions=True)
    wc, ii = specs
    assert counts_from_parts(tmp_path / "out-wordcount.py", REDUCERS) == word_count(words)
    assert index_from_parts(tmp_path / "out-invertedindex.py", REDUCERS) == inverted_index(docs)
    assert copied["map"] > 0 and copied["batch"] > 0 and copied["reduce"] > 0, copied
    rejected = 0
    for spec, out in ((wc, "out-wordcount.py"), (ii, "out-invertedindex.py")):
        record = await embedded.table.get(job_pk(spec.job_id), "job")
        assert record is not None and record["state"] == "succeeded"
        # Whether a copy reached a job's worker before that job ended is timing: one job may
        # see none. The other job's messages that did arrive are counted, not obeyed.
        rejected += record.get("messages_rejected", 0)
        manifest = Manifest.from_bytes((tmp_path / out / MANIFEST).read_bytes())
        assert manifest.job == spec.job_id
    assert rejected > 0
