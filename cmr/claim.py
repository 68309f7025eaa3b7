"""Reduce claims: exactly one worker reduces a partition, and only it can commit.

Method 3 of the seeds ("no duplicate processing allowed"): a worker that receives a reduce
task records in the table that it is processing the partition and learns, in the same
atomic conditional write, whether someone else already is. The store serialises
contenders, so each reaches the same verdict without talking to the others.

Every claim attempt carries a token of its own, so two slots of one worker are two
contenders like any others, and a read-back after a lost answer recognises only its own
write. The holder beats (adds to ``beat``) every third of its lease. A contender that finds a
live claim watches the beat for one and a half leases on its *own* clock; if it has not
moved, the holder is dead or paused, and the contender takes the partition over with a write
conditional on the very (token, beat) it watched, which bumps the partition's *epoch*. No
two machines' clocks are ever compared. The commit is fenced by the token: a worker that was
paused past its lease and wakes up finds the claim moved and can never commit, overwrite or
duplicate the partition's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cmr import clock, counters
from cmr import digest as digests
from cmr.backends.base import AllOf, Condition, Eq, Missing, Table, Update
from cmr.errors import BackendError, ConditionFailed
from cmr.lease import in_background
from cmr.lifecycle import while_running
from cmr.records import ACTIVE_PK, JobState, job_pk, reduce_sk

WATCH_LEASES = 1.5  # how long a contender watches a silent claim before taking it over


@dataclass
class Claim:
    table: Table
    job_id: str
    partition: int
    owner: str  # the worker (for people and logs); the token decides
    token: str  # this claim attempt's own
    epoch: int  # claims of the partition so far, ours included
    lease_s: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[str, str]:
        return job_pk(self.job_id), reduce_sk(self.partition)

    def _ours(self) -> AllOf:
        return AllOf((Eq("token", self.token), Eq("state", "claimed")))

    async def _read_back(self) -> dict[str, object] | None:
        return await self.table.get(*self.key, consistent=True)

    async def renew(self) -> bool:
        """Beat: tell watchers we are alive. False (and ``lost`` set) if we no longer hold it."""
        try:
            await self.table.update(Update(*self.key, add={"beat": 1}, condition=self._ours()))
        except ConditionFailed:
            # A retried beat that was applied the first time is refused the second time.
            held = await self._read_back()
            if held is not None and held.get("token") == self.token:
                return held.get("state") == "claimed"
            self.lost.set()
            return False
        return True

    @contextlib.asynccontextmanager
    async def renewing(self, awake: asyncio.Event) -> AsyncIterator[None]:
        """Beat every third of the lease; set ``lost`` when a beat is refused."""

        async def loop() -> None:
            while not self.lost.is_set():
                await asyncio.sleep(max(0.2, self.lease_s / 3))
                await awake.wait()  # a paused process beats nothing
                with contextlib.suppress(BackendError):
                    await self.renew()

        async with in_background(loop()):
            yield

    async def commit(
        self,
        output: str,
        records: int,
        nbytes: int,
        counted: counters.Flat | None = None,
        *,
        digest: str = "",
    ) -> bool:
        """The fenced commit: succeeds only if nobody took the partition over meanwhile, and
        the job still runs (a commit after the job ended would leave its output blob behind
        a cleanup that has already swept the scratch). ``nbytes`` and ``digest`` (hex,
        :mod:`cmr.digest`): what
        the output blob holds, which a pipeline's next step checks before it decodes a byte
        (a commit without a digest is refused there). ``counted``: the reduce's
        Job.increment_counter totals, which count only as part of the commit that stands."""
        fields: dict[str, object] = {
            "state": "committed",
            "output": output,
            "records": records,
            "bytes": nbytes,
            "committed_at": clock.wall(),
        }
        if digest:
            fields[digests.NAME] = digest
        if counted:
            fields["counters"] = counters.encode(counted)
        commit = Update(*self.key, set_=fields, condition=self._ours())
        try:
            await self.table.transact(
                [commit, while_running(self.job_id)], token=f"commit-{self.token}"
            )
        except ConditionFailed:
            held = await self._read_back()
            if (
                held is not None
                and held.get("state") == "committed"
                and held.get("token") == self.token
            ):
                return True  # our first try was applied; its answer was lost
            self.lost.set()
            return False
        return True

    async def forget(self) -> None:
        """Delete our uncommitted claim: the job ended (its queues are gone) while we held
        it, after cleanup removed the records; ours must not linger as a stray."""
        with contextlib.suppress(ConditionFailed):
            await self.table.delete(*self.key, condition=self._ours())

    async def release(self) -> None:
        """Give the partition up at once (after a failure): the next contender takes it over
        without watching for a whole lease."""
        with contextlib.suppress(ConditionFailed):
            await self.table.update(
                Update(*self.key, set_={"state": "released"}, condition=self._ours())
            )


@dataclass(frozen=True)
class Refusal:
    committed: bool  # the partition is done (or the job ended): the task message is stale
    retry_in: float  # otherwise: seconds until the task is worth trying again
    contended: bool = False  # we found another claim alive, and stood back (method 3)


async def _take(
    table: Table,
    job_id: str,
    partition: int,
    owner: str,
    token: str,
    epoch: int,
    condition: Condition,
) -> None:
    """The claiming write, only while the job runs (a worker that wakes after its job ended
    must not leave a claim behind). Raises ConditionFailed."""
    write = Update(
        job_pk(job_id),
        reduce_sk(partition),
        set_={"owner": owner, "token": token, "state": "claimed", "beat": 0, "epoch": epoch},
        condition=condition,
    )
    await table.transact([write, while_running(job_id)], token=secrets.token_hex(16))


async def claim(
    table: Table,
    job_id: str,
    partition: int,
    owner: str,
    lease_s: int,
    awake: asyncio.Event,
) -> Claim | Refusal:
    """Claim the partition: at once if it is free or released, after watching one and a half
    leases if another claim's beat has stopped, or not at all."""
    pk, sk = job_pk(job_id), reduce_sk(partition)
    token = secrets.token_hex(8)
    # What we expect the record to be, as the condition of our claiming write.
    expect: Condition = Missing("pk")
    epoch = 1
    watched = False
    while True:
        try:
            await _take(table, job_id, partition, owner, token, epoch, expect)
            return Claim(table, job_id, partition, owner, token, epoch, lease_s)
        except ConditionFailed:
            pass
        # Read back who holds it. All contenders read the same record, so each reaches the
        # same verdict on its own.
        held = await table.get(pk, sk, consistent=True)
        if held is not None and held.get("token") == token:  # applied; its answer was lost
            return Claim(table, job_id, partition, owner, token, int(held["epoch"]), lease_s)
        if held is not None and held.get("state") == "committed":
            return Refusal(True, 0.0, contended=watched)
        active = await table.get(ACTIVE_PK, job_id, consistent=True)
        if active is None or active.get("state") != JobState.RUNNING.value:
            return Refusal(True, 0.0)  # the job ended: the task message is stale
        if held is None:
            expect, epoch = Missing("pk"), 1
            continue
        same = AllOf((Eq("token", held.get("token")), Eq("epoch", held.get("epoch"))))
        epoch = int(held.get("epoch", 0)) + 1
        if held.get("state") == "released":
            expect = AllOf((same, Eq("state", "released")))
            continue
        if watched:
            # It beat while we watched (alive), or another contender took it over first.
            return Refusal(False, float(lease_s), contended=True)
        # Watch the holder's beat on our own clock; a paused watcher measures nothing.
        expect = AllOf((same, Eq("state", "claimed"), Eq("beat", held.get("beat"))))
        watched = True
        deadline = clock.monotonic() + lease_s * WATCH_LEASES
        while (left := deadline - clock.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.5))
            if not awake.is_set():
                await awake.wait()
                deadline = clock.monotonic() + lease_s * WATCH_LEASES
