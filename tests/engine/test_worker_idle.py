"""``--idle-exit N``: a worker with nothing to do exits once it has been idle N seconds, not
at the first refresh of the jobs after that (every 5 s: `--idle-exit 0.5` took 5.5 s).
In virtual time: the clock is the worker's own, and the wait costs no real time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cmr import clock
from cmr.backends.embedded import temporary_backend
from cmr.pool import cpu_pool
from cmr.settings import WorkerSettings
from cmr.virtualtime import in_virtual_time
from cmr.worker import Worker


@in_virtual_time
async def test_an_idle_worker_exits_after_its_idle_seconds(tmp_path: Path) -> None:
    ws = WorkerSettings(processes=1, idle_exit_s=0.5, spill_dir=str(tmp_path))
    with cpu_pool(1) as pool:
        async with temporary_backend() as be:
            worker = Worker(be, ws, pool)
            started = clock.monotonic()
            await asyncio.wait_for(worker.run(), 60)
            took = clock.monotonic() - started
    assert 0.5 <= took < 1.0, took  # not 5 s: the refresh period (FLEET_REFRESH_S)
