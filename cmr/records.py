"""The job's shared state in the table: one partition per job, plus indexes of jobs.

    pk=jobs          sk=<job id>          state, created       (what `cmr status` lists)
    pk=jobs#active   sk=<job id>          state, while the job has duties left: running, or
                                          ended and not yet cleaned up (what workers poll)
    pk=outputs       sk=<output URL>      the job that owns the output place while it runs
    pk=job#<id>      sk=job               the job record: spec, state, counters, error
    pk=job#<id>      sk=map#<task>        the task's winning attempt and its per-partition counts
    pk=job#<id>      sk=fail#<m|r><n>     how often a map task or partition failed or restarted
    pk=job#<id>      sk=reduce#<p>        the partition's claim (owner, token, epoch, beat) and
                                          commit (output, records, bytes, blake3)
    pk=job#<id>      sk=att#<m|r><n>#<id> a task attempt: worker, start, end, outcome
                                          (cmr.attempts); folded into timeline#<n> at cleanup
    pk=workers       sk=<worker id>       a worker's beat: host, jobs, busy (cmr.workers)

Every decision record is written once with a condition, so whoever reads it later — any
worker, any time — reaches the same conclusion (the "stable decisions" invariant). A job's
state changes together with its index rows, in one transaction (``cmr.lifecycle``).
"""

from __future__ import annotations

import functools
import posixpath
import re
import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cmr import counters as counting
from cmr import formats, sidefiles, wire
from cmr.backends.base import Item
from cmr.errors import WireError
from cmr.fileurls import file_path
from cmr.inputs import glob_owns
from cmr.job import LINE_ENDINGS, MAX_STEPS, JobRef

JOBS_PK = "jobs"  # every job ever submitted (what `cmr status` lists)
ACTIVE_PK = "jobs#active"  # jobs with duties left: what workers poll, so it stays small
OUTPUTS_PK = "outputs"  # output places and the job that owns each while it runs
WORKERS_PK = "workers"  # the workers seen lately, one row each (cmr.workers)
# A job's records its cleanup keeps beside the job record: what the dashboard shows of it.
KEPT = ("timeline#", "usage#")  # usage#: its cost, by process (cmr.usage)


class JobState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


# Counters the job record accumulates; ``cmr status`` shows them.
STATS = (
    "progress_maps",  # approximate, while running; maps_done/records_in/bytes_in/records_out
    "progress_bytes",  # are written exactly from the commit records when the job succeeds
    "map_attempts_filtered",  # method 1: attempts that finished but lost to the winner
    "map_duplicates_skipped",  # task messages for tasks that already had a winner
    "batches_dropped",  # method 2: repeated batches (same tag) a reducer threw away
    "batches_filtered",  # batches of losing or dead attempts
    "reduce_conflicts",  # method 3: claims refused because another worker held the partition
    "tasks_retried",
    "tasks_restarted",  # task attempts started again after a worker died or lost its lease
    "leases_lost",
    "messages_rejected",
    "reduce_spills",  # sorted runs reducers wrote to local disk to stay in their budget
    "conflict_checks",  # times a reducer's counts stalled and it asked the store who reads
    "tasks_resent",  # task messages a worker sent again from the plan (lost from a queue)
    "partitions_committed",  # commits seen (finalize.count_commit): when to look, not what
    "backups_map",  # backup attempts started for straggling map tasks (cmr.backup)
    "backups_reduce",  # reduce claims taken over from stragglers by a backup
)


def new_job_id() -> str:
    # 64 random bits: two submits in one second never share an id (and with it the queues,
    # the scratch and the plan of a job).
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(8)


def job_pk(job_id: str) -> str:
    return f"job#{job_id}"


def map_sk(task: int) -> str:
    return f"map#{task:07d}"


def fail_sk(task_id: str) -> str:
    """task_id: "m<task>" for a map task, "r<partition>" for a reduce task."""
    return f"fail#{task_id}"


def reduce_sk(p: int) -> str:
    return f"reduce#{p:05d}"


# A blob-shuffle attempt's parts are written in pages of this many partitions, one table
# item each, beside its commit record: a reducer reads its own page of each winner. Named
# in the commit, every partition's part made a record that grew with the partitions, which
# every reducer read (1,280 reducers: 44 KB records, read over and over while they polled;
# benchmarks/cloudsort.py).
PAGE_PARTITIONS = 64


def pages_for(partitions: int) -> int:
    """How many pages a paged attempt of a job of ``partitions`` writes."""
    return -(-partitions // PAGE_PARTITIONS)


def page_sk(task: int, attempt: str, page: int) -> str:
    """A map attempt's page of parts: keyed by its attempt (a loser's never stands for the
    winner's), under its own prefix (a reducer's poll of "map#" reads no page)."""
    return f"{task_pages(task)}{attempt}#{page:05d}"


def task_pages(task: int) -> str:
    """The prefix of every page of every attempt of a map task."""
    return f"page#{task:07d}#"


@functools.lru_cache(maxsize=64)
def queue_names(prefix: str, job_id: str, partitions: int) -> tuple[str, str, tuple[str, ...]]:
    """(input queue, master reduce queue, one queue per partition). Cached: a worker asks for
    every task, and a job may have 10,000 partitions."""
    base = f"{prefix}{job_id}"
    return f"{base}-in", f"{base}-reduce", tuple(f"{base}-p{p:05d}" for p in range(partitions))


@dataclass(frozen=True)
class JobSpec:
    """What a worker needs to run a job's tasks; immutable once submitted."""

    job_id: str
    ref: JobRef
    params: dict[str, str]
    maps: int
    partitions: int
    output: str  # URL prefix the parts are published under (a directory or S3 prefix)
    scratch: str  # URL prefix for this job's plan, attempt outputs and spills
    queue_prefix: str
    visibility_s: int  # task and claim leases
    max_task_failures: int  # a task that raises this often fails the job (--max-task-attempts)
    # A task started this often without finishing or raising (its workers died) fails the job.
    max_task_attempts: int = 10
    task_timeout_s: int = 0  # a task's time limit; 0: grows with its input (cmr.timelimit)
    plan_digest: str = ""  # sha256 of the plan blob: task messages only point into it
    replaces: str = ""  # the output's manifest etag when submitted ("": there was none)
    input_root: str = ""  # the file or prefix every range of the plan lies under
    lines: str = ""  # input line endings, "lf" or "universal"; "": the job class's ``lines``
    # Pipelines (cmr.pipeline): this job is step ``step`` (0-based, of the job's steps()) of
    # the run of steps first_step..last_step whose first job's id is ``pipeline``;
    # ``step_partitions`` holds each of those steps' partitions. A one-step job: all zero.
    step: int = 0
    first_step: int = 0
    last_step: int = 0
    pipeline: str = ""  # "": the job is its own pipeline (job_id)
    step_partitions: tuple[int, ...] = ()
    job_steps: int = 1  # how many steps the job's steps() has (the last writes text)

    @property
    def pipeline_id(self) -> str:
        return self.pipeline or self.job_id

    @property
    def final(self) -> bool:
        """Whether this job's output is the run's output (not the next step's input)."""
        return self.step >= self.last_step

    @property
    def writes_pairs(self) -> bool:
        """Whether this step writes pairs (for a next step of the job) rather than its
        output format: every step but the job's last."""
        return self.step < self.job_steps - 1

    input_format: str = ""  # cmr.formats' input format; "": the job class's
    output_format: str = ""  # cmr.formats' output format; "": the job class's
    files: tuple[sidefiles.SideFile, ...] = ()  # side files staged at submit (cmr.sidefiles)
    # Several inputs: every root (input_root is then the first, for people to read), and
    # the patterns of glob inputs, whose matches are read (cmr.inputs). One input: both ().
    input_roots: tuple[str, ...] = ()
    input_globs: tuple[str, ...] = ()
    # How map output reaches the reducers (SHUFFLE_MODES): "queue", tagged batches in one
    # queue per partition; "blob", one object per map attempt, which its commit record
    # names part by part (cmr.bulk), and no partition queues at all.
    shuffle: str = "queue"

    def owns_input(self, url: str) -> bool:
        """Whether ``url`` is (under) one of the job's recorded inputs: a plan's range
        elsewhere is not this job's to read, whatever the plan says."""
        if not (self.input_roots or self.input_globs):
            return _owns(self.input_root, url)
        return any(_owns(r, url) for r in self.input_roots) or any(
            _glob_owns(g, url) for g in self.input_globs
        )

    def queues(self) -> tuple[str, str, tuple[str, ...]]:
        """The input queue, the reduce task queue and the partition queues (none when the
        shuffle goes through the blob store)."""
        in_q, reduce_q, part_qs = queue_names(self.queue_prefix, self.job_id, self.partitions)
        return in_q, reduce_q, part_qs if self.shuffle == "queue" else ()

    def to_item(self) -> Item:
        return {
            "job": self.ref.target,
            "digest": self.ref.digest,
            "params": self.params,
            "maps": self.maps,
            "partitions": self.partitions,
            "output": self.output,
            "scratch": self.scratch,
            "queue_prefix": self.queue_prefix,
            "visibility_s": self.visibility_s,
            "max_task_failures": self.max_task_failures,
            "max_task_attempts": self.max_task_attempts,
            "task_timeout_s": self.task_timeout_s,
            "plan_digest": self.plan_digest,
            "replaces": self.replaces,
            "input_root": self.input_root,
            "lines": self.lines,
            **(
                {
                    "step": self.step,
                    "first_step": self.first_step,
                    "last_step": self.last_step,
                    "pipeline": self.pipeline,
                    "step_partitions": list(self.step_partitions),
                    "job_steps": self.job_steps,
                }
                if self.pipeline
                else {}
            ),
            "input_format": self.input_format,
            "output_format": self.output_format,
            **({"input_roots": list(self.input_roots)} if self.input_roots else {}),
            **({"input_globs": list(self.input_globs)} if self.input_globs else {}),
            **({"files": sidefiles.to_record(self.files)} if self.files else {}),
            **({"shuffle": self.shuffle} if self.shuffle != "queue" else {}),
        }

    @staticmethod
    def from_item(job_id: str, item: Item) -> JobSpec:
        """Read a job record as what it is, input from the table: whoever can write the table
        must not be able to make a worker allocate without limit or misread a field, so
        every field is type- and range-checked here (where it points is the worker's
        admission's to judge: cmr.admission)."""
        fields = _Fields(job_id, item)
        if not wire.is_job_id(job_id):
            raise WireError(f"job record {job_id[:80]!r}: not a job id")
        params = item.get("params")
        if not isinstance(params, dict) or len(params) > MAX_PARAMS:
            raise WireError(f"job record {job_id}: params must be a map of at most {MAX_PARAMS}")
        for k, v in params.items():
            if not (isinstance(k, str) and isinstance(v, str)) or len(k) + len(v) > MAX_PARAM:
                raise WireError(f"job record {job_id}: params must map short strings to strings")
        digest = fields.text("digest", 64)
        plan_digest = fields.text("plan_digest", 64, default="")
        if not _SHA256.fullmatch(digest) or (plan_digest and not _SHA256.fullmatch(plan_digest)):
            raise WireError(f"job record {job_id}: a digest is not a sha256")
        lines = fields.text("lines", 20, default="")
        if lines and lines not in LINE_ENDINGS:
            raise WireError(f"job record {job_id}: field 'lines' must be '', 'lf' or 'universal'")
        input_format = fields.text("input_format", formats.MAX_FORMAT_LEN, default="")
        output_format = fields.text("output_format", formats.MAX_FORMAT_LEN, default="")
        try:
            if input_format:
                formats.parse_input(input_format)
            if output_format:
                formats.check_output(output_format)
        except formats.FormatError as exc:
            raise WireError(f"job record {job_id}: {exc}") from None
        queue_prefix = fields.text("queue_prefix", 40)
        if not _QUEUE_PREFIX.fullmatch(queue_prefix):
            raise WireError(f"job record {job_id}: queue_prefix is not a queue name prefix")
        steps = _steps(fields, job_id)
        shuffle = fields.text("shuffle", 10, default="queue")
        if shuffle not in SHUFFLE_MODES:
            raise WireError(f"job record {job_id}: field 'shuffle' must be one of {SHUFFLE_MODES}")
        partitions = fields.number("partitions", 1, MAX_PARTITIONS)
        if steps[3] and steps[4][steps[0] - steps[1]] != partitions:
            raise WireError(f"job record {job_id}: partitions differ from its step's")
        return JobSpec(
            job_id,
            JobRef(fields.text("job", MAX_URL), digest),
            dict(params),
            fields.number("maps", 0, MAX_MAPS),
            partitions,
            fields.url("output"),
            fields.url("scratch"),
            queue_prefix,
            fields.number("visibility_s", 1, MAX_VISIBILITY_S),
            fields.number("max_task_failures", 1, MAX_TASK_TRIES),
            fields.number("max_task_attempts", 1, MAX_TASK_TRIES, default=10),
            fields.number("task_timeout_s", 0, MAX_TASK_TIMEOUT_S, default=0),
            plan_digest,
            fields.text("replaces", 200, default=""),
            fields.url("input_root"),
            lines,
            *steps,
            input_format,
            output_format,
            # Staged once for the whole run, under its first job's id.
            files=sidefiles.from_record(
                steps[3] or job_id, fields.url("scratch"), item.get("files")
            ),
            input_roots=fields.urls("input_roots", MAX_INPUTS),
            input_globs=fields.urls("input_globs", MAX_INPUTS),
            shuffle=shuffle,
        )


def step_job_id(pipeline: str, first_step: int, step: int) -> str:
    """The job id of step ``step`` of a pipeline: its first job's id, then ``-s<n>`` (n the
    1-based step number). Ids are derived, never chosen: a record cannot claim to be a step
    of another pipeline, and any worker names the next step as every other does."""
    return pipeline if step == first_step else f"{pipeline}-s{step + 1}"


def _steps(fields: _Fields, job_id: str) -> tuple[int, int, int, str, tuple[int, ...], int]:
    """(step, first_step, last_step, pipeline, step_partitions, job_steps) of a record,
    checked: the step lies in its run, the job id is the one the pipeline's id and step
    derive, and each step's partitions are in range."""
    pipeline = fields.text("pipeline", 64, default="")
    if not pipeline:
        return 0, 0, 0, "", (), 1
    step = fields.number("step", 0, MAX_STEPS - 1)
    first = fields.number("first_step", 0, MAX_STEPS - 1)
    last = fields.number("last_step", 0, MAX_STEPS - 1)
    parts = fields.item.get("step_partitions")
    job_steps = fields.number("job_steps", 1, MAX_STEPS)
    if not (
        wire.is_job_id(pipeline)
        and first <= step <= last < job_steps
        and job_id == step_job_id(pipeline, first, step)
    ):
        raise WireError(f"job record {job_id}: its pipeline fields do not name this job")
    if (
        not isinstance(parts, list | tuple)
        or len(parts) != last - first + 1
        or not all(type(n) is int and 1 <= n <= MAX_PARTITIONS for n in parts)
    ):
        raise WireError(f"job record {job_id}: step_partitions must be one count per step")
    return step, first, last, pipeline, tuple(parts), job_steps


MAX_MAPS = wire.MAX_TASKS  # map tasks a job may have: what a task message may point at
MAX_PARTITIONS = wire.MAX_PARTITIONS  # one queue each: more is a mistake, not a job
MAX_VISIBILITY_S = 12 * 3600  # SQS's longest visibility timeout
MAX_TASK_TRIES = 1_000  # max_task_failures and max_task_attempts
MAX_TASK_TIMEOUT_S = 7 * 24 * 3600
MAX_PARAMS = 256
MAX_PARAM = 64 * 1024  # a parameter's name and value together
MAX_INPUTS = 256  # roots and globs a record names (--input options; a glob is one)
MAX_URL = 1024  # S3 keys are at most 1,024 bytes; local paths are shorter in practice
_SHA256 = re.compile(r"[0-9a-f]{64}")
SHUFFLE_MODES = ("queue", "blob")  # what a job record may say (cmr run --shuffle adds auto)
_QUEUE_PREFIX = re.compile(r"[0-9A-Za-z_-]{0,40}")  # SQS queue names: 80 of these characters
_URL = re.compile(r"(s3|azure|file)://[^\x00-\x1f\x7f]+")


def _owns(root: str, url: str) -> bool:
    """Whether ``url`` is the file ``root``, or lies under the directory ``root`` ("/")."""
    if not root:
        return False
    whole = not root.endswith("/")
    if root.startswith("file://"):
        # A local path: "..", "%2e%2e" and doubled slashes must not lead out of the root.
        if not url.startswith("file://"):
            return False
        base, path = _local_path(root), _local_path(url)
        return path == base if whole else path.startswith(base.rstrip("/") + "/")
    return url == root if whole else url.startswith(root)


def _glob_owns(pattern: str, url: str) -> bool:
    """Whether ``url`` is a match of the glob ``pattern``, or lies under one."""
    if pattern.startswith("file://"):
        # Decoded and normalised as _owns does: ".." cannot lead out of a match.
        return url.startswith("file://") and glob_owns(_local_path(pattern), _local_path(url))
    return not url.startswith("file://") and glob_owns(pattern, url)


@functools.lru_cache(maxsize=4096)
def _local_path(url: str) -> str:
    # Decoded as the embedded blob store decodes it to read, then normalised.
    return posixpath.normpath("/" + str(file_path(url)))


class _Fields:
    """Typed reads of one record's fields: a wrong type or a value out of range is a
    WireError naming the field, never a TypeError, OverflowError or a silent coercion."""

    def __init__(self, job_id: str, item: Item) -> None:
        self.job_id = job_id[:80]
        self.item = item

    def _get(self, name: str, default: Any) -> Any:
        value = self.item.get(name, default)
        if value is None:
            raise WireError(f"job record {self.job_id}: field {name!r} is missing")
        return value

    def number(self, name: str, low: int, high: int, default: int | None = None) -> int:
        value = self._get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise WireError(
                f"job record {self.job_id}: field {name!r} must be a whole number from {low} "
                f"to {high}"
            )
        return value

    def text(self, name: str, limit: int, default: str | None = None) -> str:
        value = self._get(name, default)
        if not isinstance(value, str) or len(value) > limit or "\x00" in value:
            raise WireError(
                f"job record {self.job_id}: field {name!r} must be a string of at most "
                f"{limit} characters"
            )
        return value

    def url(self, name: str) -> str:
        value = self.text(name, MAX_URL)
        if not _URL.fullmatch(value) or "/../" in value or value.endswith("/.."):
            raise WireError(
                f"job record {self.job_id}: field {name!r} is not an s3://, azure:// or file:// URL"
            )
        return value

    def urls(self, name: str, limit: int) -> tuple[str, ...]:
        """A list of URLs (absent: none), each checked as :meth:`url` checks one."""
        value = self.item.get(name, [])
        if not isinstance(value, list | tuple) or len(value) > limit:
            raise WireError(
                f"job record {self.job_id}: field {name!r} must be a list of at most {limit} URLs"
            )
        return tuple(_Fields(self.job_id, {name: v}).url(name) for v in value)


# A map commit is a stranger's record to whoever reads it: its counts are bounded like a
# message's (one row per partition; counts below 2^63, which is what DynamoDB sums keep).
MAX_COMMIT_COUNTS_BYTES = 400 * 1024  # DynamoDB's item limit: no real record is larger
MAX_COUNT = 2**63 - 1
# A blob attempt's part digests: the first 16 bytes (128 bits) of each part's BLAKE3, enough
# that no bucket writer can make other bytes match, small enough that a commit of 10,000
# partitions stays within DynamoDB's item limit.
PART_DIGEST = 16
MAX_PART_BYTES = 5 * 1024**4  # S3's largest object


@dataclass(frozen=True)
class MapCommit:
    """The winning attempt of a map task and how many batches/records it sent where."""

    attempt: str
    batches: dict[int, int]  # partition -> batches (partitions with none are absent)
    records: dict[int, int]
    records_in: int = 0  # input records and bytes the attempt read: the job's totals are
    bytes_in: int = 0  # summed from winners, so a worker dying after its commit loses none
    # The attempt's Job.increment_counter totals: they count only if this commit wins.
    counters: counting.Flat = field(default_factory=dict)
    # A blob-shuffle attempt (cmr.bulk): where each partition's batches lie in its one
    # object, partition -> (offset, length, the first PART_DIGEST bytes of their digest).
    # Exactly the partitions of ``batches``, laid out in partition order from offset 0.
    parts: dict[int, tuple[int, int, bytes]] = field(default_factory=dict)
    # A paged blob attempt: how many page items (MapPage) hold its counts and parts; its
    # record then holds none of them (``batches``, ``records`` and ``parts`` empty).
    pages: int = 0

    def to_item(self) -> Item:
        sparse = [[p, self.batches[p], self.records.get(p, 0)] for p in sorted(self.batches)]
        item: Item = {
            "attempt": self.attempt,
            "records_in": self.records_in,
            "bytes_in": self.bytes_in,
        }
        if not self.pages:
            # A paged record has no counts at all: a worker of before pages refuses it
            # (its counts are not bytes) rather than read it as an attempt with no batches.
            item["counts"] = wire.pack(sparse)
        if self.counters:
            item["counters"] = counting.encode(self.counters)
        if self.parts:
            # Offsets are not stored: they follow from the lengths, in partition order.
            rows = [[p, self.parts[p][1], self.parts[p][2]] for p in sorted(self.parts)]
            item["parts"] = wire.pack(rows)
        if self.pages:
            item["pages"] = self.pages
        return item

    @staticmethod
    def from_item(item: Item) -> MapCommit:
        """The record's commit, or WireError (only WireError, with a short text) when it is
        not one a mapper wrote: inf, NaN, negative or huge counts, too many rows, wrong
        shapes, an attempt id that could not name a spool file."""
        try:
            attempt = item.get("attempt")
            if not wire.is_attempt_id(attempt):
                raise WireError("its attempt is not an attempt id (1 to 64 lowercase hex)")
            pages = MapCommit._count(item.get("pages", 0), "pages", MAX_PAGES)
            if pages and ("counts" in item or "parts" in item):
                raise WireError("a paged commit names counts or parts of its own")
            batches, records = MapCommit._counts(item.get("counts")) if not pages else ({}, {})
            parts = MapCommit._parts(item["parts"], batches) if "parts" in item else {}
            return MapCommit(
                str(attempt),
                batches,
                records,
                MapCommit._count(item.get("records_in", 0), "records_in", MAX_COUNT),
                MapCommit._count(item.get("bytes_in", 0), "bytes_in", MAX_COUNT),
                counting.decode(item.get("counters")),
                parts,
                pages,
            )
        except WireError as exc:
            raise WireError(wire.bounded(f"map commit record is malformed: {exc}")) from None
        except Exception as exc:  # msgpack's zoo, MemoryError: whatever the record provokes
            raise WireError(f"map commit record is malformed ({type(exc).__name__})") from None

    @staticmethod
    def _count(value: Any, what: str, most: int) -> int:
        if type(value) is not int or not 0 <= value <= most:
            raise WireError(f"{what} is not a count from 0 to {most}")
        return value

    @staticmethod
    def _counts(data: Any) -> tuple[dict[int, int], dict[int, int]]:
        # Rows are walked header first and msgpack builds no array by itself (max_len=0):
        # a row count is refused before a row is read, and nesting is never built.
        if not isinstance(data, bytes) or len(data) > MAX_COMMIT_COUNTS_BYTES:
            raise WireError(f"counts are not msgpack bytes of at most {MAX_COMMIT_COUNTS_BYTES}")
        up = wire.unpacker(len(data), max_str=0)
        up.feed(data)
        rows = up.read_array_header()
        if rows > wire.MAX_PARTITIONS:
            raise WireError(f"{rows} rows of counts (at most {wire.MAX_PARTITIONS})")
        batches: dict[int, int] = {}
        records: dict[int, int] = {}
        for _ in range(rows):
            if up.read_array_header() != 3:
                raise WireError("a row of counts is not [partition, batches, records]")
            p = MapCommit._count(up.unpack(), "a partition", wire.MAX_PARTITIONS - 1)
            if p in batches:
                raise WireError(f"partition {p} is counted twice")
            batches[p] = MapCommit._count(up.unpack(), "a batch count", wire.MAX_SEQ + 1)
            records[p] = MapCommit._count(up.unpack(), "a record count", MAX_COUNT)
        if up.tell() != len(data):
            raise WireError("extra bytes after the counts")
        return batches, records

    @staticmethod
    def _parts(data: Any, batches: dict[int, int]) -> dict[int, tuple[int, int, bytes]]:
        """A blob attempt's parts: [partition, length, digest] rows in partition order, one
        for each partition the counts give batches, none else."""
        if not isinstance(data, bytes) or len(data) > MAX_COMMIT_COUNTS_BYTES:
            raise WireError(f"parts are not msgpack bytes of at most {MAX_COMMIT_COUNTS_BYTES}")
        up = wire.unpacker(len(data), max_str=0, max_bin=PART_DIGEST)
        up.feed(data)
        rows = up.read_array_header()
        if rows != len(batches):
            raise WireError(f"{rows} parts for {len(batches)} partitions with batches")
        parts: dict[int, tuple[int, int, bytes]] = {}
        offset, last = 0, -1
        for _ in range(rows):
            if up.read_array_header() != 3:
                raise WireError("a part is not [partition, length, digest]")
            p = MapCommit._count(up.unpack(), "a partition", wire.MAX_PARTITIONS - 1)
            if p <= last or p not in batches:
                raise WireError(f"part {p} is out of order or has no batches")
            length = MapCommit._count(up.unpack(), "a part's length", MAX_PART_BYTES)
            digest = up.unpack()
            if not isinstance(digest, bytes) or len(digest) != PART_DIGEST:
                raise WireError(f"a part's digest is not {PART_DIGEST} bytes")
            if length == 0:
                raise WireError(f"part {p} is empty, yet has batches")
            parts[p], offset, last = (offset, length, digest), offset + length, p
        if up.tell() != len(data):
            raise WireError("extra bytes after the parts")
        return parts


MAX_PAGES = pages_for(wire.MAX_PARTITIONS)


@dataclass(frozen=True)
class MapPage:
    """One page of a paged blob attempt's parts: for each partition of the page with
    batches, (offset in the object, length, batches, records, digest). A stranger's record
    to whoever reads it, checked as a commit is."""

    page: int
    rows: dict[int, tuple[int, int, int, int, bytes]]

    @staticmethod
    def of(
        page: int,
        parts: dict[int, tuple[int, int, bytes]],
        batches: dict[int, int],
        records: dict[int, int],
    ) -> MapPage:
        first = page * PAGE_PARTITIONS
        rows = {
            p: (parts[p][0], parts[p][1], batches[p], records.get(p, 0), parts[p][2])
            for p in range(first, first + PAGE_PARTITIONS)
            if p in parts
        }
        return MapPage(page, rows)

    def to_item(self) -> Item:
        rows = [[p, *self.rows[p]] for p in sorted(self.rows)]
        return {"page": self.page, "rows": wire.pack(rows)}

    @staticmethod
    def from_item(item: Item, page: int, partitions: int) -> MapPage:
        """The page ``page`` of a job of ``partitions``, or WireError: rows outside the
        page or the job, out of order, empty, overlapping, or counts past their bounds."""
        try:
            if item.get("page") != page:
                raise WireError(f"it is not page {page}")
            data = item.get("rows")
            if not isinstance(data, bytes) or len(data) > MAX_COMMIT_COUNTS_BYTES:
                raise WireError("its rows are not msgpack bytes")
            up = wire.unpacker(len(data), max_str=0, max_bin=PART_DIGEST)
            up.feed(data)
            n = up.read_array_header()
            if n > PAGE_PARTITIONS:
                raise WireError(f"{n} rows in a page of {PAGE_PARTITIONS}")
            first = page * PAGE_PARTITIONS
            last_p, end = first - 1, 0
            rows: dict[int, tuple[int, int, int, int, bytes]] = {}
            for _ in range(n):
                if up.read_array_header() != 6:
                    raise WireError(
                        "a row is not [partition, offset, length, batches, records, digest]"
                    )
                p = MapCommit._count(up.unpack(), "a partition", wire.MAX_PARTITIONS - 1)
                if not last_p < p < min(first + PAGE_PARTITIONS, partitions):
                    raise WireError(f"partition {p} is out of order, or not of this page")
                offset = MapCommit._count(up.unpack(), "an offset", MAX_PART_BYTES)
                length = MapCommit._count(up.unpack(), "a part's length", MAX_PART_BYTES)
                batches = MapCommit._count(up.unpack(), "a batch count", wire.MAX_SEQ + 1)
                records = MapCommit._count(up.unpack(), "a record count", MAX_COUNT)
                digest = up.unpack()
                if not isinstance(digest, bytes) or len(digest) != PART_DIGEST:
                    raise WireError(f"a part's digest is not {PART_DIGEST} bytes")
                if length == 0 or batches == 0:
                    raise WireError(f"part {p} is empty")
                if offset < end:
                    raise WireError(f"part {p} overlaps the one before")
                rows[p] = (offset, length, batches, records, digest)
                last_p, end = p, offset + length
            if up.tell() != len(data):
                raise WireError("extra bytes after the rows")
            return MapPage(page, rows)
        except WireError as exc:
            raise WireError(wire.bounded(f"map page record is malformed: {exc}")) from None
        except Exception as exc:  # msgpack's zoo
            raise WireError(f"map page record is malformed ({type(exc).__name__})") from None

    def commit_for(self, commit: MapCommit, partition: int) -> MapCommit:
        """``commit`` as a reducer of ``partition`` needs it: its part of the page (none:
        no batches for it), as an unpaged commit names it."""
        row = self.rows.get(partition)
        if row is None:
            return MapCommit(commit.attempt, {}, {}, commit.records_in, commit.bytes_in)
        offset, length, batches, records, digest = row
        return MapCommit(
            commit.attempt,
            {partition: batches},
            {partition: records},
            commit.records_in,
            commit.bytes_in,
            parts={partition: (offset, length, digest)},
        )


def task_of(sk: str) -> int:
    """The task (or partition) a ``map#``/``reduce#`` record names; -1 for a sort key no
    task of cmr's writes (a table writer's: ``map#²``, which int() would refuse)."""
    tail = sk.split("#", 1)[1] if "#" in sk else ""
    return int(tail) if tail.isascii() and tail.isdigit() else -1
