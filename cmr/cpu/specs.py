"""What a pool task is told: MapSpec and ReduceSpec, frozen and picklable (they cross to
the pool process with the task), each built from the job's JobSpec and the worker's settings
in one place (``MapSpec.of``, ``ReduceSpec.of``), and the size of the pieces a map task
handles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: a pool process never imports the job record or settings
    from cmr.records import JobSpec
    from cmr.settings import WorkerSettings

# Bytes of whole lines handed to map_chunk at a time: a user's map_chunk may hold many
# times its input in objects (word count: ~16x), so a small memory budget gets small
# pieces; the default budget gets whole splits, as each piece costs per-key work later.
MAP_PIECE_MIN = 4 * 1024 * 1024
MAP_PIECE_OF_BUDGET = 16  # a piece is at most budget / this
REDUCE_MEMORY_MIN = 64 * 1024  # a reduce task's smallest budget: --memory-mb 0 means this


def map_piece_bytes(memory_bytes: int) -> int:
    return max(MAP_PIECE_MIN, memory_bytes // MAP_PIECE_OF_BUDGET)


def map_max_record(piece_bytes: int) -> int:
    """The longest record (a line; a compressed or whole file, decoded) a map task of pieces
    this large holds: half the budget a piece is a sixteenth of."""
    return max(MAP_PIECE_MIN, piece_bytes) * (MAP_PIECE_OF_BUDGET // 2)


@dataclass(frozen=True)
class MapSpec:
    """One attempt of a map task: where its pairs go and how they are packed."""

    job: str
    task: int
    attempt: str
    partitions: int
    max_message_bytes: int  # shuffle batches are packed to at most this many bytes
    spool_dir: str
    compress: bool = True  # zstd bodies; off: plain msgpack, packed to the byte
    combine: bool = True  # run the job's combine, if it has one
    piece_bytes: int = MAP_PIECE_MIN  # map_chunk sees at most about this much at once
    limit_s: float = 0.0  # the task's time limit (cmr.timelimit); 0: none
    lines: str = ""  # line endings ("lf", "universal"); "": the job class's own
    input_format: str = ""  # cmr.formats' name ("": lines)
    codecs: tuple[str, ...] = ()  # per chunk: its compression ("" none; () all none)
    starts: tuple[int, ...] = ()  # per chunk: the byte of its file it starts at
    step: int = 0  # which of the job's steps this task runs
    files_dir: str = ""  # the job's side files on this worker (cmr.sidefiles); "": none
    cuts: tuple[Any, ...] | None = None  # total order's cut points (the plan's); None: hash

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        settings: WorkerSettings,
        *,
        task: int,
        attempt: str,
        queue_limit: int,
        spool_dir: str,
        limit_s: float,
        input_format: str,
        codecs: tuple[str, ...],
        starts: tuple[int, ...],
        files_dir: str,
        cuts: tuple[Any, ...] | None,
    ) -> MapSpec:
        """Attempt ``attempt`` of the job's map task ``task`` on a worker with these
        settings, whose queues take messages of up to ``queue_limit`` bytes."""
        return cls(
            spec.job_id,
            task,
            attempt,
            spec.partitions,
            settings.shuffle_bytes(queue_limit),
            spool_dir,
            compress=settings.compress,
            combine=settings.use_combiner,
            piece_bytes=map_piece_bytes(settings.memory_mb * 1024 * 1024),
            limit_s=limit_s,
            lines=spec.lines,
            input_format=input_format,
            codecs=codecs,
            starts=starts,
            step=spec.step,
            files_dir=files_dir,
            cuts=cuts,
        )


@dataclass(frozen=True)
class ReduceSpec:
    """One partition's reduce task: its budget, where it spills, and what it writes."""

    job: str
    out_path: str  # the partition's output file
    memory_bytes: int  # pairs held before sorted runs are spilled
    spill_dir: str  # where the runs go
    combine: bool = True  # run the job's combine, if it has one, on long value lists
    limit_s: float = 0.0  # the task's time limit (cmr.timelimit); 0: none
    what: str = "reduce"  # the task, as the time limit's message names it
    step: int = 0  # which of the job's steps this task runs
    output_format: str = ""  # cmr.formats' name; "": the job class's
    files_dir: str = ""  # the job's side files on this worker (cmr.sidefiles); "": none
    # Each key's values reach reduce sorted, by value_order (a key function; None: natural
    # order); None: as the job class says (cmr.cpu.order.value_sorting).
    sort_values: bool | None = None
    value_order: Callable[[Any], Any] | None = None

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        settings: WorkerSettings,
        *,
        out_path: str,
        spill_dir: str,
        limit_s: float,
        what: str,
        files_dir: str,
    ) -> ReduceSpec:
        """The job's reduce task on a worker with these settings."""
        return cls(
            spec.job_id,
            out_path,
            max(REDUCE_MEMORY_MIN, settings.memory_mb * 1024 * 1024),
            spill_dir,
            combine=settings.use_combiner,
            limit_s=limit_s,
            what=what,
            step=spec.step,
            # Every step but the job's last writes pairs, what the next step reads.
            output_format="pairs" if spec.writes_pairs else spec.output_format,
            files_dir=files_dir,
        )
