"""What a worker's tasks share: the backend, the CPU pool, local disk, its identity."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from cmr.backends.base import Backend
from cmr.records import STATS, job_pk
from cmr.settings import WorkerSettings

T = TypeVar("T")


@dataclass
class Runtime:
    backend: Backend
    settings: WorkerSettings
    pool: Executor
    spool_dir: str
    worker_id: str = field(default_factory=lambda: "w" + secrets.token_hex(4))
    log: Any = field(default_factory=lambda: structlog.get_logger("cmr.worker"))

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn in the process pool, so the event loop keeps moving bytes."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def add_stats(self, job_id: str, stats: Counter[str]) -> None:
        """Fold a task's counters into the job record in one write."""
        add = {k: v for k, v in stats.items() if v and k in STATS}
        if add:
            await self.backend.table.update(job_pk(job_id), "job", add=add)
