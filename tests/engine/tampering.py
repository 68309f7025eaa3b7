"""A two-step pipeline (examples/topwords.py) run clientless on the embedded backend with
one hook that tampers with the store as a stranger would: what the step-output and the
hand-over forgery tests share."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from cmr.backends.faults import FaultPlan
from cmr.settings import WorkerSettings
from cmr.testing import chaos_run

from .corpus import edge_cases

TOPWORDS = "examples/topwords.py"


async def topwords_tampered(tmp_path: Path, pool: Executor, hook: Any, timeout_s: float) -> Any:
    """The run's result (cmr.testing.chaos_run) with ``hook`` among the workers' steps."""
    return await chaos_run(
        TOPWORDS,
        edge_cases(tmp_path / "in"),
        tmp_path / "out",
        seed=1,
        pool=pool,
        plan=FaultPlan(seed=1),
        hooks=[hook],
        workers=1,
        reducers=2,
        split_bytes=4096,
        clientless=True,
        timeout_s=timeout_s,
        settings=WorkerSettings(processes=1, poll_s=0.1, janitor_s=0.5),
    )
