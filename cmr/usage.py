"""What each process spends on each job: requests in billing units, and worker-seconds.

**Attribution.** :data:`JOB` names the job the running coroutine works for. A worker sets
it where a slot polls for or takes a task of a job, runs a backup attempt, or runs a duty
of a job; the client where it submits and watches one. asyncio tasks copy the context
when they are made, so the tasks a task starts (lease renewals, parallel reads) work for
its job too. Requests made with no job set (a fleet polling the active index, beating its
worker row, `cmr status`) are the fleet's overhead: counted under ``None`` and written
into the worker's row (cmr.workers; cmr.cost.fleet_overhead sums them), never into a
job's cost.

**Counting.** Every request is charged here by what sends it: the aws clients' botocore
hook and the azure clients' per-request hook (so retries, multipart parts and pages count
as sent), the embedded backend's Counting middleware. A charge is a ContextVar read, two
dict lookups and two additions: counting costs a job nothing measurable.

**Usage rows.** Each process writes, per job, its cumulative totals as absolute values to
``pk=job#<id>, sk=usage#<process>`` (a repeated write never counts twice): at most every
FLUSH_S while they change, when it stops serving the job, after the job's cleanup, and as
it stops. Each write counts itself: it carries the cost of one such write as measured the
time before (a process's first write of a job's row is made twice, to measure it). A
SIGKILLed process's counts are kept up to its last write. Rows read back are validated
and bounded (:func:`decode`, used by cmr.cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import socket
import weakref
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from cmr import clock, wire
from cmr.errors import BackendError, WireError

JOB: ContextVar[str | None] = ContextVar("cmr_job", default=None)
PREFIX = "usage#"
FLUSH_S = 5.0  # a process writes a job's row at most this often while its totals change
INSTANCE_SETTING = "CMR_INSTANCE_TYPE"  # the EC2 type this process runs on (worker-seconds)
_USAGE = "usage:"  # JOB while a usage row is written: that cost is kept apart, then added

# A row read back is a stranger's: these bound what it may hold.
MAX_OPS = 200  # distinct operations in one row
MAX_OP_BYTES = 64
MAX_COUNT = 2**53  # requests or units of one operation (exact in a float)
MAX_SECONDS = 10.0 * 365 * 24 * 3600  # a process's worker-seconds for one job
MAX_INSTANCE = 41
MAX_ROW_BYTES = MAX_OPS * (MAX_OP_BYTES + 24) + MAX_INSTANCE + 64
_OP = re.compile(r"[a-z0-9]{1,12}\.[A-Za-z0-9]{1,50}")
INSTANCE = re.compile(r"[a-z0-9-]{1,20}\.[a-z0-9-]{1,20}")
VERSION = 1
WRITES_TO_LEARN = 3  # writes of a row at most, to learn what one costs (see flush)


_PROCESS: tuple[int, str] | None = None


def process_id() -> str:
    """This process's name in usage rows: host, pid and a random part (a reused pid on
    another boot must not overwrite an earlier process's row)."""
    global _PROCESS  # noqa: PLW0603 - one per process, made on first use (after a fork)
    if _PROCESS is None or _PROCESS[0] != os.getpid():
        host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40] or "host"
        _PROCESS = (os.getpid(), f"{host}.{os.getpid()}.{secrets.token_hex(3)}")
    return _PROCESS[1]


def instance_type() -> str:
    """The instance type this process's seconds are priced at: CMR_INSTANCE_TYPE, else ""
    (the price table's default)."""
    value = os.environ.get(INSTANCE_SETTING, "").strip()
    return value if INSTANCE.fullmatch(value) else ""


Ops = dict[str, list[float]]  # "sqs.SendMessageBatch": [requests, units]


def _add(into: Ops, more: Ops) -> None:
    for op, (n, u) in more.items():
        row = into.setdefault(op, [0, 0.0])
        row[0] += n
        row[1] += u


class Ledger:
    """This process's totals: per job (None: the fleet's), per operation, [requests, units];
    and worker-seconds per job (None: idle)."""

    def __init__(self) -> None:
        self.jobs: dict[str | None, Ops] = {}
        self.seconds: dict[str | None, float] = {}
        self.clocks: weakref.WeakSet[WorkerClock] = weakref.WeakSet()

    def charge(self, op: str, requests: int = 1, units: float = 1) -> None:
        """One request (or ``requests``) of ``op``, billed as ``units``, for JOB's job."""
        job = JOB.get()
        ops = self.jobs.get(job)
        if ops is None:
            ops = self.jobs[job] = {}
        row = ops.get(op)
        if row is None:
            ops[op] = [requests, units]
        else:
            row[0] += requests
            row[1] += units

    def totals(self, job: str | None) -> Ops:
        """The job's totals, its usage rows' own writes included (a copy)."""
        out = {op: list(v) for op, v in self.jobs.get(job, {}).items()}
        if job is not None:
            _add(out, self.jobs.get(_USAGE + job, {}))
        return out

    def worker_seconds(self, job: str | None) -> float:
        for c in list(self.clocks):
            c.accrue()
        return self.seconds.get(job, 0.0)


LEDGER = Ledger()


def charge(op: str, requests: int = 1, units: float = 1) -> None:
    """The hot path: every request a backend sends calls this once."""
    LEDGER.charge(op, requests, units)


class WorkerClock:
    """A worker's wall time, split equally among the jobs it serves at each moment (its
    slots' tasks and its duties); time serving none is the fleet's idle time (None)."""

    def __init__(self, ledger: Ledger = LEDGER) -> None:
        self.ledger = ledger
        self.serving: dict[str, int] = {}
        self.last = clock.monotonic()
        ledger.clocks.add(self)

    def accrue(self) -> None:
        now = clock.monotonic()
        spent, self.last = max(0.0, now - self.last), now
        seconds = self.ledger.seconds
        if not self.serving:
            seconds[None] = seconds.get(None, 0.0) + spent
            return
        share = spent / len(self.serving)
        for job in self.serving:
            seconds[job] = seconds.get(job, 0.0) + share

    def enter(self, job: str) -> None:
        self.accrue()
        self.serving[job] = self.serving.get(job, 0) + 1

    def leave(self, job: str) -> None:
        self.accrue()
        n = self.serving.get(job, 0) - 1
        if n > 0:
            self.serving[job] = n
        else:
            self.serving.pop(job, None)


@contextlib.contextmanager
def working_for(job_id: str, worker: WorkerClock | None = None) -> Iterator[None]:
    """Requests made inside (and by tasks made inside) are ``job_id``'s; with ``worker``,
    its time inside is too (shared with the other jobs it serves meanwhile)."""
    token = JOB.set(job_id)
    if worker is not None:
        worker.enter(job_id)
    try:
        yield
    finally:
        if worker is not None:
            worker.leave(job_id)
        JOB.reset(token)


# Rows.


@dataclass
class Row:
    """One process's usage of one job, as its row holds it."""

    process: str
    instance: str  # "" when the process did not say: the price table's default
    worker_s: float
    ops: Ops = field(default_factory=dict)  # op: [requests, units]


def encode(instance: str, worker_s: float, ops: Ops) -> bytes:
    rows = [[op, int(n), float(u)] for op, (n, u) in sorted(ops.items())]
    return wire.pack([VERSION, instance, round(float(worker_s), 3), rows])


def decode(process: str, data: Any) -> Row:
    """A usage row's payload; WireError, with a short text, when it is not what a process
    writes: wrong version, too many or repeated operations, bad names, values out of range,
    extra bytes."""
    try:
        return _decode(process, data)
    except WireError:
        raise
    except Exception as exc:  # msgpack's zoo, whatever the bytes provoke
        raise WireError(f"usage is malformed ({type(exc).__name__})") from None


def _number(value: Any, most: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{what} is not a number")
    if not (math.isfinite(value) and 0 <= value <= most):
        raise WireError(f"{what} is out of range")
    return float(value)


def _decode(process: str, data: Any) -> Row:
    if not isinstance(data, bytes) or len(data) > MAX_ROW_BYTES:
        raise WireError(f"usage is not msgpack bytes of at most {MAX_ROW_BYTES}")
    up = wire.unpacker(len(data), max_str=MAX_OP_BYTES)
    up.feed(data)
    if up.read_array_header() != 4:
        raise WireError("usage is not [version, instance, worker_s, ops]")
    version, instance = up.unpack(), up.unpack()
    if version != VERSION:
        raise WireError(f"usage version {str(version)[:20]!r} is not {VERSION}")
    if not isinstance(instance, str) or (instance and not INSTANCE.fullmatch(instance)):
        raise WireError("usage's instance type is not a name like c7i.large")
    worker_s = _number(up.unpack(), MAX_SECONDS, "usage's worker-seconds")
    n = up.read_array_header()
    if n > MAX_OPS:
        raise WireError(f"{n} operations in a usage row (at most {MAX_OPS})")
    ops: Ops = {}
    for _ in range(n):
        if up.read_array_header() != 3:
            raise WireError("a usage operation is not [op, requests, units]")
        op, requests, units = up.unpack(), up.unpack(), up.unpack()
        if not isinstance(op, str) or not _OP.fullmatch(op):
            raise WireError(f"usage operation {str(op)[:40]!r} is not service.Operation")
        if op in ops:
            raise WireError(f"usage operation {op!r} appears twice")
        if type(requests) is not int:
            raise WireError(f"usage operation {op!r}: requests is not an int")
        ops[op] = [
            _number(requests, MAX_COUNT, f"{op} requests"),
            _number(units, MAX_COUNT, f"{op} units"),
        ]
    if up.tell() != len(data):
        raise WireError("extra bytes after the usage")
    return Row(process, instance, worker_s, ops)


def overhead() -> bytes:
    """This process's requests for no job and its workers' idle seconds, as a row payload
    (the worker row's ``usage``)."""
    return encode(instance_type(), LEDGER.worker_seconds(None), LEDGER.totals(None))


# Writing.


class _Written:
    """What this process last wrote for each job, and what one write of a row costs."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[bytes, float]] = {}  # job: (payload as it stood, when)
        self.write_cost: dict[str, Ops] = {}  # job: one write of its row, as measured
        self.lock = asyncio.Lock()


_written: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Written] = (
    weakref.WeakKeyDictionary()
)


def _state() -> _Written:
    loop = asyncio.get_running_loop()
    state = _written.get(loop)
    if state is None:
        state = _written[loop] = _Written()
    return state


def _payload(job: str, extra: Ops) -> bytes:
    ops = LEDGER.totals(job)
    _add(ops, extra)
    return encode(instance_type(), round(LEDGER.worker_seconds(job), 1), ops)


async def flush(backend: Any, jobs: Iterable[str], *, due: bool = True) -> int:
    """Write the rows of ``jobs`` whose totals changed since this process last wrote them;
    ``due=False``: only those last written FLUSH_S ago or more. How many were written."""
    pk_of = _job_pk()
    state = _state()
    written = 0
    async with state.lock:
        for job in list(jobs):
            if not LEDGER.jobs.get(job) and not LEDGER.seconds.get(job):
                continue
            last = state.rows.get(job)
            now = clock.monotonic()
            if last is not None and not due and now - last[1] < FLUSH_S:
                continue
            if last is not None and last[0] == _payload(job, {}):
                continue  # nothing new since: the row holds it, its own write included
            try:
                # A write carries its own cost as predicted by the last one's; a process's
                # first write of a row predicts none, and on Azure a row's first write is an
                # insert where the next ones are updates: written again until the prediction
                # holds (at most WRITES_TO_LEARN times; the periodic flush corrects the rest).
                for _ in range(WRITES_TO_LEARN):
                    predicted = state.write_cost.get(job, {})
                    before = LEDGER.totals(_USAGE + job)
                    payload = _payload(job, predicted)
                    with working_for(_USAGE + job):
                        await backend.table.put(
                            pk_of(job), PREFIX + process_id(), {"usage": payload}
                        )
                    state.write_cost[job] = _delta(LEDGER.totals(_USAGE + job), before)
                    # Equal to the totals now unless the cost was mispredicted or more came
                    # meanwhile: then the next flush writes again.
                    state.rows[job] = (payload, now)
                    if state.write_cost[job] == predicted:
                        break
                written += 1
            except BackendError:
                continue  # written at the next flush (a process killed first loses it)
    return written


def _job_pk() -> Any:
    from cmr.records import job_pk  # here: records is heavier than what the backends need

    return job_pk


def _delta(after: Ops, before: Ops) -> Ops:
    out: Ops = {}
    for op, (n, u) in after.items():
        b = before.get(op, [0, 0.0])
        if n - b[0] or u - b[1]:
            out[op] = [n - b[0], u - b[1]]
    return out
