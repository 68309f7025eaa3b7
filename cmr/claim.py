"""Reduce claims: exactly one worker reduces a partition, and only it can commit.

Method 3 of the seeds ("no duplicate processing allowed"): a worker that receives a reduce
task records in the table that it is processing the partition and learns, in the same
atomic conditional write, whether someone else already is. The store serialises
contenders, so each reaches the same verdict without talking to the others: the first
live claim wins; a claim whose lease has run out may be taken over, which bumps the
partition's *epoch*. The commit is fenced by (owner, epoch): a worker that was paused past
its lease and wakes up finds the epoch moved and can never commit, overwrite or duplicate
the partition's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from cmr.backends.base import AllOf, AnyOf, Eq, Lt, Missing, Table
from cmr.errors import BackendError, ConditionFailed
from cmr.records import job_pk, reduce_sk


@dataclass
class Claim:
    table: Table
    job_id: str
    partition: int
    owner: str
    epoch: int
    lease_s: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[str, str]:
        return job_pk(self.job_id), reduce_sk(self.partition)

    def _ours(self) -> AllOf:
        return AllOf((Eq("owner", self.owner), Eq("epoch", self.epoch), Eq("state", "claimed")))

    async def _still_ours(self) -> bool:
        """Read back after a refused write: a retried write that was applied the first time
        is refused the second time, yet the claim is ours."""
        held = await self.table.get(*self.key, consistent=True)
        return (
            held is not None and held.get("owner") == self.owner and held.get("epoch") == self.epoch
        )

    async def renew(self) -> bool:
        try:
            await self.table.update(
                *self.key,
                set_={"lease_until": time.time() + self.lease_s},
                condition=self._ours(),
            )
        except ConditionFailed:
            if await self._still_ours():
                return True
            self.lost.set()
            return False
        return True

    @contextlib.asynccontextmanager
    async def renewing(self, awake: asyncio.Event) -> AsyncIterator[None]:
        """Renew the lease every third of its length; set ``lost`` when a renewal is refused."""

        async def loop() -> None:
            while not self.lost.is_set():
                await asyncio.sleep(max(0.2, self.lease_s / 3))
                await awake.wait()  # a paused process renews nothing
                with contextlib.suppress(BackendError):
                    await self.renew()

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def commit(self, output: str, records: int) -> bool:
        """The fenced commit: succeeds only if nobody took the partition over meanwhile."""
        try:
            await self.table.update(
                *self.key,
                set_={
                    "state": "committed",
                    "output": output,
                    "records": records,
                    "committed_at": time.time(),
                },
                condition=self._ours(),
            )
        except ConditionFailed:
            held = await self.table.get(*self.key, consistent=True)
            if (
                held is not None
                and held.get("state") == "committed"
                and held.get("owner") == self.owner
                and held.get("epoch") == self.epoch
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
        """Give the partition up at once (after a failure) instead of letting the lease lapse."""
        with contextlib.suppress(ConditionFailed):
            await self.table.update(*self.key, set_={"lease_until": 0.0}, condition=self._ours())


@dataclass(frozen=True)
class Refusal:
    committed: bool  # the partition is done: the task message is stale
    retry_in: float  # otherwise: seconds until the holder's lease would lapse


async def claim(
    table: Table, job_id: str, partition: int, owner: str, lease_s: int
) -> Claim | Refusal:
    pk, sk = job_pk(job_id), reduce_sk(partition)
    now = time.time()
    try:
        item = await table.update(
            pk,
            sk,
            set_={"owner": owner, "state": "claimed", "lease_until": now + lease_s},
            add={"epoch": 1},
            condition=AnyOf(
                (Missing("pk"), AllOf((Eq("state", "claimed"), Lt("lease_until", now))))
            ),
        )
    except ConditionFailed:
        # Read back who holds it. All contenders read the same record, so each reaches the
        # same verdict on its own: the holder of the live claim goes on, the rest stand back.
        held = await table.get(pk, sk, consistent=True)
        if held is None:  # released and cleaned up between our write and read: try later
            return Refusal(False, 1.0)
        if held.get("state") == "committed":
            return Refusal(True, 0.0)
        if held.get("owner") == owner:  # our write was applied; only its answer was lost
            return Claim(table, job_id, partition, owner, int(held["epoch"]), lease_s)
        return Refusal(False, max(1.0, float(held.get("lease_until", now)) - now))
    return Claim(table, job_id, partition, owner, int(item["epoch"]), lease_s)
