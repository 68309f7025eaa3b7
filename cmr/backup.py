"""Backup attempts for stragglers: one slow machine must not hold a whole job back.

A slot that finds its job's queue empty is idle; before it waits again it may look at the
job's attempts (:mod:`cmr.attempts`) for a task running far longer than its finished peers,
on another worker, and run a second attempt of it. The first committed attempt wins:

* **map tasks**: method 1 makes this free. The backup is one more attempt with its own id;
  whichever commits first is the winner, the other's batches are filtered. The backup
  holds no task message (the straggler does, and deletes it when it ends).
* **reduce tasks**: method 3 allows one owner per claim, so the backup takes the claim
  over: one write, conditional on the straggler's very token (and the job running), gives
  the partition a new token and epoch. The straggler's next beat or commit is refused by
  that token (the fence every takeover has), and it hands back what it holds.

Bounded: a job's backups of each kind are counted in its record by a conditional add, never
past BACKUP_SHARE of its tasks (at least one); one backup per task (a ``bk#`` record written
if absent); only idle slots start them, so none runs while a worker has work of its own;
and a worker looks at most every CHECK_S per job and kind (one query, two for reduces).

Judged on the workers' wall clocks: a task's age is the backer's clock minus the
straggler's start. Clock skew between machines only moves *when* a backup starts; which
attempt counts is decided by the commit records alone, never by a clock.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import statistics
from dataclasses import dataclass

from cmr import clock
from cmr.attempts import Attempt, Kind, attempts
from cmr.backends.base import AllOf, AnyOf, Eq, Lt, Missing, Put, Update, item_absent
from cmr.claim import Claim
from cmr.errors import ConditionFailed
from cmr.lifecycle import while_running
from cmr.records import JobSpec, job_pk, map_sk, reduce_sk, task_of
from cmr.runtime import Runtime

BACKUP_SHARE = 0.1  # of a job's map tasks (and of its partitions) that may get a backup
FACTOR = 2.0  # a task is a straggler once it runs this many times its peers' median
MIN_AGE_S = 2.0  # nor before it has run this long (short tasks vary; a backup costs a task)
MIN_DONE = 0.5  # and only once this share of its peers have finished: the median means much
ROWS_PER_CHECK = 500  # attempt rows a worker reads a second at most, per job and kind
CHECK_S = 1.0  # a worker looks for stragglers of a job at most this often (per kind)
PREFIX = "bk#"  # one record per task backed up: pk=job#<id> sk=bk#<m|r><n>
COUNTERS = {"m": "backups_map", "r": "backups_reduce"}  # in the job record


@dataclass(frozen=True)
class Straggler:
    attempt: Attempt
    age_s: float  # how long it has run (for a reduce: since the maps were all done)
    peers_s: float  # its finished peers' median


def cap(tasks: int) -> int:
    """How many backups a job with ``tasks`` tasks of a kind may start."""
    return max(1, math.floor(BACKUP_SHARE * tasks))


@dataclass(frozen=True)
class Verdict:
    straggler: Straggler | None  # the attempt to back up now, if any
    due_in: float | None  # else, how soon the next candidate may become one (None: none is)
    check_every_s: float = 0.0  # when this worker may look again (find sets it)


def choose(
    rows: list[Attempt], kind: Kind, tasks: int, me: str, now: float, since: float = 0.0
) -> Verdict:
    """The attempt most worth backing up, if any: of a task with no committed attempt and no
    backup yet, run by another worker, older than FACTOR times its finished peers' median
    and MIN_AGE_S, once MIN_DONE of the tasks are done. ``since``: when the maps were all
    done, for reduces (a reduce waits for them; only what it takes after counts)."""
    # A row naming a task the job does not have is a stranger's: it would take a backup.
    mine = [a for a in rows if a.kind == kind and a.task < tasks]
    done = {a.task for a in mine if a.outcome == "committed"}
    if tasks <= 0 or len(done) < max(1, math.ceil(MIN_DONE * tasks)):
        return Verdict(None, None)
    peers = statistics.median(
        max(0.0, a.seconds(now) - max(0.0, since - a.started))
        for a in mine
        if a.outcome == "committed"
    )
    backed = {a.task for a in mine if a.backup}
    threshold = max(MIN_AGE_S, FACTOR * peers)
    best: Straggler | None = None
    due_in: float | None = None
    for a in mine:
        if not a.running or a.task in done or a.task in backed or a.worker == me:
            continue
        age = now - max(a.started, since)
        if age > threshold and (best is None or age > best.age_s):
            best = Straggler(a, age, peers)
        elif age <= threshold:
            due_in = threshold - age if due_in is None else min(due_in, threshold - age)
    return Verdict(best, None if best is not None else due_in)


async def find(rt: Runtime, spec: JobSpec, kind: Kind) -> Verdict:
    """Read the job's attempt rows and choose (see :func:`choose`). Eventually consistent,
    at half a strong read's price: a row a stale read lacks only delays a backup, and a
    backup is judged again by conditional writes (reserve, take_over) and by the commit
    records, never by this read. Only live rows: a job's timeline (``timeline#``) is read
    by people, not by this (before cleanup, a stranger's timeline item would stand for
    rows). A job of many tasks is looked at less often, in proportion to its rows (each
    look reads them all; ROWS_PER_CHECK a second at most per worker)."""
    rows = await attempts(rt.backend, spec.job_id, consistent=False, live=True)
    every = CHECK_S * max(1.0, len(rows) / ROWS_PER_CHECK)
    tasks = spec.maps if kind == "m" else spec.partitions
    since = 0.0
    if kind == "r":
        maps = [
            a for a in rows if a.kind == "m" and a.outcome == "committed" and a.task < spec.maps
        ]
        if len({a.task for a in maps}) < spec.maps and not await _maps_committed(rt, spec):
            return Verdict(None, None, every)  # reducers still wait for maps
        # (A map killed between its commit and its row's end leaves no end: the last end
        # seen stands for when the maps were done.)
        since = max((a.ended or 0.0 for a in maps), default=0.0)
    verdict = choose(rows, kind, tasks, rt.worker_id, clock.wall(), since)
    if verdict.straggler is not None and await _committed(rt, spec, verdict.straggler.attempt):
        # Its attempt committed and died before ending its row: nothing to back up.
        return Verdict(None, None, every)
    return dataclasses.replace(verdict, check_every_s=every)


async def _committed(rt: Runtime, spec: JobSpec, a: Attempt) -> bool:
    pk = job_pk(spec.job_id)
    if a.kind == "m":
        return await rt.backend.table.get(pk, map_sk(a.task), consistent=False) is not None
    held = await rt.backend.table.get(pk, reduce_sk(a.task), consistent=False)
    return held is not None and held.get("state") == "committed"


async def _maps_committed(rt: Runtime, spec: JobSpec) -> bool:
    """Whether every map task has its commit record (the rows say so unless an attempt
    died between its commit and its row's end)."""
    done = {
        task_of(str(i["sk"]))
        for i in await rt.backend.table.query(job_pk(spec.job_id), prefix="map#", consistent=False)
    }
    return all(t in done for t in range(spec.maps))


async def reserve(rt: Runtime, spec: JobSpec, s: Straggler) -> bool:
    """Count the backup in the job's record and mark its task, both or neither, and only
    while the job runs and its count is under the cap. False: the cap is reached, the
    task has its backup already, or the job ended."""
    kind, task = s.attempt.kind, s.attempt.task
    field = COUNTERS[kind]
    limit = cap(spec.maps if kind == "m" else spec.partitions)
    pk = job_pk(spec.job_id)
    try:
        await rt.backend.table.transact(
            [
                Update(
                    pk, "job", add={field: 1}, condition=AnyOf((Missing(field), Lt(field, limit)))
                ),
                Put(
                    pk, f"{PREFIX}{kind}{task}", {"of": s.attempt.attempt}, condition=item_absent()
                ),
                while_running(spec.job_id),
            ],
            token=secrets.token_hex(16),
        )
    except ConditionFailed:
        return False
    return True


async def take_over(rt: Runtime, spec: JobSpec, s: Straggler) -> Claim | None:
    """Take the straggler's reduce claim over: conditional on its very token, so of all
    backers (and a contender watching a dead claim) exactly one succeeds, and only while
    the job runs. None if the claim moved meanwhile (it committed, or someone else took it)."""
    p = s.attempt.task
    pk, sk = job_pk(spec.job_id), reduce_sk(p)
    held = await rt.backend.table.get(pk, sk, consistent=True)
    if held is None or held.get("token") != s.attempt.attempt or held.get("state") != "claimed":
        rt.log.info(
            "the straggler's claim moved before our backup took it",
            job=spec.job_id,
            partition=p,
            state=None if held is None else str(held.get("state"))[:20],
        )
        return None
    token = secrets.token_hex(8)
    epoch = int(held.get("epoch", 0)) + 1
    write = Update(
        pk,
        sk,
        set_={
            "owner": rt.worker_id,
            "token": token,
            "state": "claimed",
            "beat": 0,
            "epoch": epoch,
            # Kept by the claims after ours: this claim lost no start (the straggler lives),
            # and failures.reduce_claimed does not count it as one.
            "backup": True,
        },
        # Its token *and* still claimed: a commit keeps the token, and a committed
        # partition must never be claimed again (the straggler may commit after our read).
        condition=AllOf((Eq("token", s.attempt.attempt), Eq("state", "claimed"))),
    )
    try:
        await rt.backend.table.transact(
            [write, while_running(spec.job_id)], token=secrets.token_hex(16)
        )
    except ConditionFailed:
        held = await rt.backend.table.get(pk, sk, consistent=True)
        if held is None or held.get("token") != token:
            rt.log.info("the straggler's claim moved as our backup took it", job=spec.job_id)
            return None
    return Claim(rt.backend.table, spec.job_id, p, rt.worker_id, token, epoch, spec.visibility_s)
