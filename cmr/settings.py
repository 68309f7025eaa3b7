"""Settings: built once (by the CLI or ``cmr.run``) and passed down; no globals."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cmr.errors import UsageError

MIN_MESSAGE_BYTES = 1024


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
    poll_s: float = 1.0  # long-poll wait on queues (SQS rounds it up to whole seconds)
    # Idle waits back off to this: an idle slot's long poll, a reducer's table polls while
    # no commit is expected. Longer: fewer requests while idle, later notice of a map that
    # sent nothing to a partition. None: 5 x poll_s (5 s on SQS).
    idle_poll_s: float | None = None
    spill_dir: str | None = None
    # How often a worker checks a running job that none of its slots got a message of in
    # that long: are its task messages still there, is it due to be finalized (cmr.janitor).
    janitor_s: float = 60.0
    # The shuffle. Defaults are cmr's; ``message_bytes=7 * 1024, compress=False,
    # use_combiner=False`` mimics the 2009 implementation (SQS's 8 KB limit then, no zstd,
    # no combiner), for comparing costs. Readers accept every combination, whoever sent it.
    message_bytes: int | None = None  # largest shuffle message; None: the queue's own limit
    compress: bool = True  # zstd-compress shuffle batches (off: plain msgpack bodies)
    use_combiner: bool = True  # run the job's combine (if it has one) in map and reduce

    def __post_init__(self) -> None:
        if self.message_bytes is not None and self.message_bytes < MIN_MESSAGE_BYTES:
            raise UsageError(
                f"message_bytes must be at least {MIN_MESSAGE_BYTES} (a batch's tag and "
                f"header need room); got {self.message_bytes}"
            )

    @property
    def idle_wait_s(self) -> float:
        return max(self.poll_s, 5 * self.poll_s if self.idle_poll_s is None else self.idle_poll_s)

    def shuffle_bytes(self, queue_limit: int) -> int:
        """The size shuffle batches are packed to: ours, never above the queue's limit."""
        return min(queue_limit, self.message_bytes or queue_limit)
