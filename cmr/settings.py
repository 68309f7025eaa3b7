"""Settings: built once (by the CLI or ``cmr.run``) and passed down; no globals."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def default_cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


@dataclass(frozen=True)
class AwsSettings:
    """Where the AWS backend keeps things. Endpoints and credentials are never here: they
    come from the standard AWS settings (AWS_ENDPOINT_URL*, AWS_PROFILE, AWS_REGION, ...)."""

    bucket: str = "cmr-data"
    table: str = "cmr"
    queue_prefix: str = "cmr-"
    region: str | None = None
    profile: str | None = None
    retries: str = "standard"  # botocore retry mode: legacy | standard | adaptive
    max_attempts: int = 6
    create: bool = True  # create the bucket and table when missing


@dataclass(frozen=True)
class WorkerSettings:
    map_slots: int = field(default_factory=default_cores)  # map tasks run at once
    reduce_slots: int = field(default_factory=default_cores)  # reduce tasks held at once
    processes: int = field(default_factory=default_cores)  # CPU pool for user code
    memory_mb: int = 512  # reducer budget before spilling to local disk
    visibility_s: int = 60  # task lease; renewed while a task runs
    idle_exit_s: float | None = None  # exit after this long with nothing to do
    poll_s: float = 1.0  # long-poll wait on queues (SQS rounds it to whole seconds)
    spill_dir: str | None = None
