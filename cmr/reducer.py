"""A reduce task: claim the partition, drain its queue, reduce the winners' pairs, commit.

Draining applies the two other duplicate rules of the seeds:

* method 2 (one reader per queue, tag and remember): every batch carries a tag
  (task, attempt, seq); a repeated tag — a parallel receive, a visibility timeout that
  lapsed, or a stranger's exact copy — is dropped;
* method 1 (filter by commit records): only batches of each task's winning attempt are
  kept; the reducer knows it has everything when the winners' per-partition batch counts
  are met.

The batches a reducer keeps are never deleted from the partition queue: if this worker dies,
the next owner must find them again. It keeps them invisible while it waits for the rest
(renewing their leases, one receipt per message), so it never receives its partition over
again; if it dies they reappear within two leases. Other copies of a batch it keeps (a
retried send, a stranger's exact copy) it holds as well, uncounted: another reader may delete
the copy it counted. Batches it will never need (of losing attempts, strangers') it
deletes. The whole queue is deleted when the job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from cmr import bulk, clock, failures, finalize, sidefiles, tracking, wire
from cmr import digest as digests
from cmr.aio import TaskGroup, first_error
from cmr.backends.base import Received
from cmr.claim import Claim, Refusal, claim
from cmr.cpu.reducing import run_reduce
from cmr.cpu.results import ReduceResult
from cmr.cpu.specs import ReduceSpec
from cmr.errors import BackendError, BlobMissing, QueueGone, TaskError, WireError
from cmr.lease import in_background, message_lease
from cmr.lifecycle import reduce_output_url, spill_url
from cmr.poolpipe import PoolFailed, PoolPipe
from cmr.records import MAX_VISIBILITY_S, JobSpec, MapCommit, job_pk, map_sk, task_of
from cmr.runtime import Runtime, WorkerCrashed
from cmr.timelimit import task_limit

CONFLICT_CHECK_S = 2.0  # silence, with batches missing, before we ask who else reads
# Attempts of one task whose batches a reducer holds before it knows the task's winner: a
# task has a few (retries, a duplicate), while a stranger who can send to the queue can make
# up any number, each a spool file. Past this, a batch is left to come back later.
MAX_PENDING_ATTEMPTS = 8
MAX_REFUSALS_KEPT = 64  # refused batches' reasons kept to name in a failure
# Other messages with a tag we hold (a sender's retried send, a stranger's exact copy) held
# per tag, never deleted: past this many, a flood, deleted (see Drain.accept).
MAX_REPEATS_HELD = 4
# A drain gives up when every map has committed and no missing batch has arrived for this
# many of the longest times a batch can stay invisible (a holder renews its batches for 2
# leases; one that dies or lets go gives them back within that): the batches the commit
# records name do not exist (a table writer raised a count or renamed a winner, or a
# bucket writer spoiled a spilled batch), and waiting longer would never end the job.
MISSING_GIVE_UP_LEASES = 6


class Drain:
    """What one reducer has received of its partition so far."""

    def __init__(self, spec: JobSpec, partition: int, workdir: str) -> None:
        self.spec = spec
        self.partition = partition
        self.workdir = workdir
        self.winners: dict[int, MapCommit] = {}
        self.seqs: dict[tuple[int, str], set[int]] = {}
        self.held: dict[str, str] = {}  # message id -> latest receipt, of batches we keep
        self.of_attempt: dict[tuple[int, str], list[str]] = {}  # message ids we keep, by attempt
        # (seq, message id, bytes) of each batch in its attempt's spool, in spool order: a
        # seq its winner never sent (a stranger's) is cut out of the spool (learn_winner).
        self.spans: dict[tuple[int, str], list[tuple[int, str, int]]] = {}
        self.unneeded: list[str] = []  # receipts of messages no reader will ever need
        self.refused: dict[tuple[int, str, int], str] = {}  # tag -> why its batch was refused
        self.spooled = 0  # bytes of pairs kept
        # Kept as batches and winners arrive, so that no turn of the drain scans every map
        # task (a job of thousands of maps made each of those scans quadratic):
        self.attempts: dict[int, set[str]] = {}  # task -> attempts whose batches we hold
        self.unknown: set[int] = set()  # tasks whose batches we hold, winner not yet known
        self._missing = 0  # batches the known winners sent here that we do not hold
        self._first_unknown = 0  # no task below this one lacks a known winner
        self.repeats: Counter[tuple[int, str, int]] = Counter()  # tag -> its copies held
        self.forged: set[str] = set()  # map# records past the job's tasks: ignored
        self.stats: Counter[str] = Counter()
        # Set once we hand our batches back (_let_go): from then on we hold, never keep nor
        # delete, what a receive still under way brings, and hand it back on our way out.
        self.let_go = False
        self.due: list[int] = []  # blob shuffle: tasks whose winner's part is still to read

    def _unneeded(self, mid: str) -> None:
        """A message we hold that no reader will need: deleted, unless we let go meanwhile
        (the renewal loop may, while the drain waits on the table): then it is handed back."""
        receipt = self.held.pop(mid, None)
        if receipt is not None:
            self.unneeded.append(receipt)

    def spool(self, task: int, attempt: str) -> str:
        return os.path.join(self.workdir, f"{task}-{attempt}")

    def complete(self) -> bool:
        return len(self.winners) >= self.spec.maps and self._missing == 0

    def expecting_commits(self) -> bool:
        """Batches arrived from a task whose winner we do not know yet: its commit record is
        written right after its last send, so the table is worth asking again soon."""
        return bool(self.unknown)

    def missing(self) -> int:
        return self._missing

    def first_unknown(self) -> int:
        """The lowest task whose winner we do not know: the table is asked only from its
        commit record on (tasks commit roughly in order, so each poll reads few records)."""
        while self._first_unknown in self.winners:
            self._first_unknown += 1
        return self._first_unknown

    def learn_winner(self, task: int, commit: MapCommit) -> None:
        blob = self.spec.shuffle == "blob"
        if commit.batches.get(self.partition) and bool(commit.parts) != blob:
            raise TaskError(
                f"map task {task}'s commit record says its output went through "
                f"{'queues' if blob else 'the blob store'}, yet the job's shuffle is "
                f"{self.spec.shuffle!r}: the table was written by someone else"
            )
        self.winners[task] = commit
        self.unknown.discard(task)
        if blob:  # nothing comes by queue: the winner's part is read from its object
            if self.partition in commit.parts:
                self.due.append(task)
                self._missing += commit.batches[self.partition]
            return
        self._drop_unsent(task, commit)
        for attempt in self.attempts.pop(task, set()) - {commit.attempt}:
            # A losing or crashed attempt: its batches never count, for anyone.
            self.stats["batches_filtered"] += len(self.seqs.pop((task, attempt)))
            self.spans.pop((task, attempt), None)
            for mid in self.of_attempt.pop((task, attempt), []):
                self._unneeded(mid)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spool(task, attempt))
        held = len(self.seqs.get((task, commit.attempt), ()))
        if held:
            self.attempts[task] = {commit.attempt}
        # _drop_unsent left only seqs below the count: what is missing is the difference.
        self._missing += commit.batches.get(self.partition, 0) - held

    def _drop_unsent(self, task: int, commit: MapCommit) -> None:
        """Cut the batches of the winner's tag with a seq it never sent (received before the
        winner was known) out of its spool: only a stranger sends them."""
        tag = (task, commit.attempt)
        count = commit.batches.get(self.partition, 0)
        spans = self.spans.get(tag, [])
        if all(seq < count for seq, _, _ in spans):
            return
        path, kept = self.spool(*tag), []
        with open(path, "rb") as src, open(path + ".kept", "wb") as dst:
            for seq, mid, size in spans:
                if seq < count:
                    dst.write(src.read(size))  # a batch: at most MAX_DECODED
                    kept.append((seq, mid, size))
                    continue
                src.seek(size, os.SEEK_CUR)
                self.seqs[tag].discard(seq)
                self.of_attempt[tag].remove(mid)
                self._unneeded(mid)
                self.spooled -= size
                self.stats["messages_rejected"] += 1
        os.replace(path + ".kept", path)
        self.spans[tag] = kept

    def _reject(
        self, rt: Runtime, m: Received, what: str, tag: tuple[int, str, int] | None = None
    ) -> None:
        self.stats["messages_rejected"] += 1
        self.unneeded.append(m.receipt)
        if tag is not None and len(self.refused) < MAX_REFUSALS_KEPT:
            self.refused[tag] = what  # named if this batch turns out to be one we miss
        rt.log.warning(f"rejected {what}", job=self.spec.job_id, partition=self.partition)

    def missing_text(self) -> str:
        """Which batches are missing (a few), and why we refused any of them: the reason a
        drain that gives up fails with."""
        p, gaps = self.partition, []
        for t, w in sorted(self.winners.items()):
            got = self.seqs.get((t, w.attempt), set())
            gaps += [(t, w.attempt, q) for q in range(w.batches.get(p, 0)) if q not in got]
        shown = []
        for tag in gaps[:3]:
            why = self.refused.get(tag)
            shown.append(f"map task {tag[0]} seq {tag[2]}" + (f" (refused: {why})" if why else ""))
        more = f" and {len(gaps) - 3} more" if len(gaps) > 3 else ""
        return wire.bounded(", ".join(shown) + more)

    async def accept(self, rt: Runtime, m: Received) -> None:
        if self.let_go:
            # A batch we gave back may be one of these: its seq looks held, yet the next
            # owner needs this very message; deleted as a repeat, it would be lost.
            self.held[m.message_id] = m.receipt
            return
        if m.message_id in self.held:
            # The same message again (its lease lapsed, or a parallel receive): note its
            # newest receipt, which is the one that renews and releases it.
            self.held[m.message_id] = m.receipt
            self.stats["batches_dropped"] += 1
            return
        try:
            batch = await wire.decode_async(m.body)
            if (
                not isinstance(batch, wire.Batch)
                or batch.job != self.spec.job_id
                or batch.partition != self.partition
                or batch.task >= self.spec.maps
            ):
                raise WireError("not a batch of this job's partition")
        except Exception as exc:  # whatever a stranger's bytes make the decoder raise
            self.stats["messages_rejected"] += 1
            self.unneeded.append(m.receipt)
            rt.log.warning(
                "rejected a message in a partition queue",
                job=self.spec.job_id,
                partition=self.partition,
                reason=str(exc)[:200],
            )
            return
        winner = self.winners.get(batch.task)
        if winner is not None and winner.attempt != batch.attempt:
            self.stats["batches_filtered"] += 1
            self.unneeded.append(m.receipt)
            return
        if winner is not None and batch.seq >= winner.batches.get(self.partition, 0):
            # The winner sent seqs 0..count-1 here: this one is a stranger's. Counted, it
            # would stand in for a real batch still on its way.
            self._reject(rt, m, "a batch its attempt never sent (seq past its count)")
            return
        tag = (batch.task, batch.attempt)
        pending = len(self.attempts.get(batch.task, ()))
        if winner is None and tag not in self.seqs and pending >= MAX_PENDING_ATTEMPTS:
            # Neither held nor deleted: it comes back once the winner is known.
            self.stats["batches_deferred"] += 1
            return
        if batch.seq in self.seqs.get(tag, ()):
            # Another message with a tag we hold: counted once, yet held (renewed, handed
            # back with ours), not deleted. A reader that has not yet seen that it lost the
            # claim may receive our copy and delete it as *its* repeat, while we delete its
            # copy as ours: both gone, the tag would live on only in the spool of an owner
            # that may itself lose the claim, and the next owner would wait for it in vain
            # (tests/engine/test_reduce_let_go.py). Its attempt losing makes it unneeded.
            self.stats["batches_dropped"] += 1
            if self.repeats[batch.tag] >= MAX_REPEATS_HELD:
                self.unneeded.append(m.receipt)  # a flood of copies: delete the rest
                return
            self.repeats[batch.tag] += 1
            self.held[m.message_id] = m.receipt
            self.of_attempt.setdefault(tag, []).append(m.message_id)
            return
        pairs = batch.pairs
        if batch.spilled:
            try:
                pairs = await _spilled_pairs(rt, self.spec, batch)
            except BlobMissing:
                return  # its attempt lost and was cleaned up; a winner's spill is never deleted
            except _Refused as refused:
                self._reject(rt, m, str(refused), tag=batch.tag if refused.tagged else None)
                return
        # Only a batch kept makes its attempt known: a refused one takes no pending place.
        self.seqs.setdefault(tag, set()).add(batch.seq)
        self.attempts.setdefault(batch.task, set()).add(batch.attempt)
        if winner is None:
            self.unknown.add(batch.task)
        else:
            self._missing -= 1  # a seq of the winner's below its count, not held before
        self.held[m.message_id] = m.receipt
        self.of_attempt.setdefault((batch.task, batch.attempt), []).append(m.message_id)
        self.spans.setdefault(tag, []).append((batch.seq, m.message_id, len(pairs)))
        self.spooled += len(pairs)
        with open(self.spool(batch.task, batch.attempt), "ab") as f:
            f.write(pairs)

    async def delete_unneeded(self, rt: Runtime, queue: str) -> None:
        if self.unneeded:
            receipts, self.unneeded = self.unneeded, []
            with contextlib.suppress(BackendError):
                await rt.backend.queues.delete_messages(queue, receipts)

    async def read_due(self, rt: Runtime) -> None:
        """Read this partition's part of each newly known winner's shuffle object (a few at
        once) into the winner's spool."""
        due, self.due = self.due, []
        gate = asyncio.Semaphore(bulk.READ_CONCURRENCY)

        async def spilled(batch: wire.Batch) -> bytes:
            what = f"map task {batch.task}'s spilled value ({batch.spilled[:200]})"
            try:
                return await _spilled_pairs(rt, self.spec, batch)
            except BlobMissing:
                raise TaskError(f"{what} is gone, though its batch names it") from None
            except _Refused as refused:
                raise TaskError(f"{what}: {refused}") from None

        async def read(task: int) -> None:
            commit = self.winners[task]
            async with gate:
                path = self.spool(task, commit.attempt)
                n = await bulk.read_part(rt, self.spec, self.partition, task, commit, path, spilled)
                self.spooled += n  # after the await: parts read side by side all count
            self._missing -= commit.batches[self.partition]
            self.stats["shuffle_parts_read"] += 1

        try:
            async with TaskGroup() as tg:
                for task in due:
                    tg.create_task(read(task))
        except BaseExceptionGroup as group:
            raise first_error(group) from None

    def winner_spools(self) -> list[str]:
        paths = [self.spool(t, w.attempt) for t, w in sorted(self.winners.items())]
        return [p for p in paths if os.path.exists(p)]


class _Refused(Exception):
    """A spilled batch refused; ``tagged``: it may be one a winner really sent (its reason is
    worth naming if that batch never comes)."""

    def __init__(self, why: str, *, tagged: bool = True) -> None:
        super().__init__(why)
        self.tagged = tagged


async def _spilled_pairs(rt: Runtime, spec: JobSpec, batch: wire.Batch) -> bytes:
    """The pairs of a batch spilled to a blob, checked against the batch: _Refused if not
    what its sender wrote; BlobMissing if gone."""
    own = spill_url(
        spec.scratch, spec.job_id, batch.task, batch.attempt, batch.partition, batch.seq
    )
    if batch.spilled != own:
        raise _Refused("a spilled batch naming another blob", tagged=False)
    # One pair past what a spool reader takes is refused unread (a blob replaced by a
    # bucket writer may be any size).
    pairs = await rt.backend.blobs.get_range(batch.spilled, 0, wire.MAX_DECODED + 1)
    if len(pairs) > wire.MAX_DECODED:
        raise _Refused(f"a spilled batch past {wire.MAX_DECODED:,} bytes")
    if await digests.hex_async(pairs) != batch.digest:
        raise _Refused(
            "a spilled batch whose blob is not what its sender wrote (its digest differs: "
            "the bucket was written by someone else, or the sender ran an older cmr, whose "
            f"digests were sha256: {digests.MIXED_VERSIONS})"
        )
    return pairs


async def run_reduce_task(rt: Runtime, spec: JobSpec, msg: Received, task: wire.ReduceTask) -> None:
    reduce_q = spec.queues()[1]
    queues = rt.backend.queues
    p = task.partition
    async with message_lease(queues, reduce_q, msg.receipt, spec.visibility_s, rt.awake):
        got = await claim(
            rt.backend.table, spec.job_id, p, rt.worker_id, spec.visibility_s, rt.awake
        )
        if isinstance(got, Refusal) and got.contended:
            await rt.add_stats(spec.job_id, Counter(reduce_conflicts=1))
        if isinstance(got, Refusal) and got.committed:
            # A partition committed by someone who may have died before counting it or
            # finishing the job: finishing it is everyone's duty. Only then is the message
            # no longer needed.
            await finalize.count_commit(rt, spec)
            await finalize.finalize(rt, spec)
            await queues.delete_messages(reduce_q, [msg.receipt])
            return
    if isinstance(got, Refusal):
        # Someone holds a live claim: hide our copy for a lease, so the task comes back
        # only if the holder dies.
        await queues.change_visibility(
            reduce_q, [msg.receipt], min(spec.visibility_s, int(got.retry_in) + 1)
        )
        return
    if not await failures.reduce_claimed(rt, spec, p, got.epoch):
        await got.release()
        return  # started too often: the job was failed
    await run_claimed(rt, spec, got, msg)


async def run_claimed(rt: Runtime, spec: JobSpec, got: Claim, msg: Received | None) -> None:
    """Reduce the partition we hold and commit it. ``msg`` None: a straggler's backup that
    took the claim over (:mod:`cmr.backup`); it holds no task message, so it renews, deletes
    and fails none (its failure only releases the claim: the task message, still held by the
    attempt it replaced, brings the task back if nobody commits)."""
    _, reduce_q, part_qs = spec.queues()
    p = got.partition
    row = tracking.Tracked(rt.backend, spec.job_id, "r", p, got.token, rt.worker_id)
    if not await row.start(backup=msg is None):
        await got.forget()  # the job ended: our claim must not linger
        return
    workdir = tempfile.mkdtemp(prefix=f"reduce-{p}-", dir=rt.spool_dir)
    drain = Drain(spec, p, workdir)
    queue = part_qs[p] if part_qs else ""  # "": the blob shuffle, no partition queue
    try:
        outcome, error = await _run_claimed(rt, spec, got, drain, msg, queue, reduce_q)
        await row.end(outcome, error)
    except QueueGone:
        await got.forget()  # the job ended while we held the partition
        rt.log.info(
            "the job ended while we held a partition; our claim on it is forgotten",
            job=spec.job_id,
            partition=p,
        )
        with contextlib.suppress(BackendError):
            await row.end("released")
        raise
    except WorkerCrashed:
        raise  # a dead worker releases nothing: its leases lapse
    except Exception as exc:
        # A failure (counted by the caller): the next owner need not wait for our lease or
        # for our batches to reappear.
        with contextlib.suppress(BackendError):
            await got.release()
            await _let_go(rt, drain, queue, lost=False)
            await row.end("failed", failures.describe(exc))
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        await rt.add_stats(spec.job_id, drain.stats)


async def _run_claimed(
    rt: Runtime,
    spec: JobSpec,
    got: Claim,
    drain: Drain,
    msg: Received | None,
    queue: str,
    reduce_q: str,
) -> tuple[str, str]:
    """How the attempt ended (committed, lost: the claim was taken over, or failed) and the
    reduce's error if it failed."""
    leased: contextlib.AbstractAsyncContextManager[Any] = (
        message_lease(rt.backend.queues, reduce_q, msg.receipt, spec.visibility_s, rt.awake)
        if msg is not None
        else contextlib.nullcontext()
    )
    async with (
        leased,
        got.renewing(rt.awake),
        _holding(rt, drain, queue, spec.visibility_s, got),
    ):
        await _drain(rt, spec, got, drain, queue)
        if got.lost.is_set():
            await _let_go(rt, drain, queue, lost=True)
            return "lost", ""
        return await _reduce_and_commit(rt, spec, got, drain, msg, queue)


@contextlib.asynccontextmanager
async def _holding(
    rt: Runtime, drain: Drain, queue: str, lease_s: int, owner: Claim
) -> AsyncIterator[None]:
    """Keep the batches we hold invisible while we work, each by its newest receipt, and
    only while we own the partition: once the claim is lost (a new owner may be draining,
    and gives up on batches that never come), they go back at once, even while our reduce
    still runs (its commit will be refused)."""
    keep_s = min(MAX_VISIBILITY_S, 2 * lease_s)
    if not queue:  # the blob shuffle: we hold no message
        yield
        return

    async def renew() -> None:
        while True:
            await asyncio.sleep(lease_s)
            await rt.awake.wait()  # a paused process renews nothing: its batches reappear
            if owner.lost.is_set():
                # Counted where the loss is met (after the drain, or by the refused commit).
                await _let_go(rt, drain, queue, lost=False)
                return
            await drain.delete_unneeded(rt, queue)
            receipts = list(drain.held.values())
            with contextlib.suppress(BackendError):
                await rt.backend.queues.change_visibility(queue, receipts, keep_s)

    async with in_background(renew()):
        yield


async def _drain(rt: Runtime, spec: JobSpec, owner: Claim, drain: Drain, queue: str) -> None:
    table, queues = rt.backend.table, rt.backend.queues
    pk = job_pk(spec.job_id)
    poll_max = rt.settings.idle_wait_s  # while no commit is expected, ask at most this rarely
    poll_fast = 0.25  # while commits arrive
    if not queue:
        # The blob shuffle: commits are all there is to wait for, and no message announces
        # one, so the table is asked often (a query; no queue is polled at all); with many
        # reducers, less often (bulk.poll_intervals).
        poll_fast, most = bulk.poll_intervals(spec.partitions)
        # A small job's reducer polls at least as often as its worker's idle wait; a large
        # job's as its share of the job's polls allows.
        poll_max = min(poll_max, most) if spec.partitions <= bulk.POLL_PARTITIONS else most
    next_poll, poll_every = 0.0, poll_fast
    stalled_since: float | None = None
    stepped = False
    # Progress: the batches still missing; when it last fell, every map having committed.
    missing_before, progress_at = -1, clock.monotonic()
    give_up_s = MISSING_GIVE_UP_LEASES * spec.visibility_s
    turned_at = clock.monotonic()

    async def draining() -> None:
        """The step of the first data received (a batch, or a part read), once."""
        nonlocal stepped
        if not stepped:
            stepped = True
            await rt.step(
                "reduce.draining",
                job=spec.job_id,
                partition=drain.partition,
                owner=owner.owner,
                token=owner.token,
            )

    while not drain.complete() and not owner.lost.is_set():
        await rt.awake.wait()
        if clock.monotonic() - turned_at > spec.visibility_s:
            # We were paused (or starved) past a lease: batches held elsewhere may only now
            # be due back, so the wait for them starts again.
            progress_at = clock.monotonic()
        turned_at = clock.monotonic()
        if len(drain.winners) < spec.maps and clock.monotonic() >= next_poll:
            known = len(drain.winners)
            start = map_sk(drain.first_unknown())
            learned: list[tuple[int, MapCommit]] = []
            # Eventually consistent, at half a strong read's price: a commit record is
            # written once and never changed, so a stale answer can only lack the newest
            # ones, which a later poll finds. (At 1,280 reducers, their polls and page reads
            # came to ~2,700 read units a second on the job's one partition key, where
            # DynamoDB serves 3,000 before it splits it: benchmarks/cloudsort.py.)
            for item in await table.query(pk, prefix="map#", start=start, consistent=False):
                t = task_of(item["sk"])
                if not 0 <= t < spec.maps:
                    # No map task of this job writes it: a table writer's. Counted among
                    # the winners, it would stand in for a real task still running, and the
                    # partition would be reduced without that task's pairs.
                    if item["sk"] not in drain.forged:
                        drain.forged.add(item["sk"])
                        rt.log.warning(
                            "ignored a map commit record of no task of this job",
                            job=spec.job_id,
                            record=str(item["sk"])[:40],
                        )
                    continue
                if t not in drain.winners:
                    learned.append((t, MapCommit.from_item(item)))
            for t, commit in await bulk.unpaged(rt, spec, drain.partition, learned):
                drain.learn_winner(t, commit)
            if drain.due:
                await drain.read_due(rt)
                await draining()
            # Poll the table often while commits arrive, back off while they do not.
            poll_every = poll_fast if len(drain.winners) > known else min(poll_max, poll_every * 2)
            next_poll = clock.monotonic() + poll_every
            if drain.complete():
                break
        if not queue:
            await asyncio.sleep(max(0.0, next_poll - clock.monotonic()))
            continue
        wait_s = rt.settings.poll_s
        if len(drain.winners) < spec.maps and not drain.expecting_commits():
            # Waiting for map output: a batch ends a long poll at once, and until the
            # backed-off table poll there is nothing else to ask, so wait on the queue.
            wait_s = max(wait_s, min(poll_max, next_poll - clock.monotonic()))
        got = await queues.receive(
            queue, max_messages=10, wait_s=wait_s, visibility_s=spec.visibility_s
        )
        for m in got:
            await drain.accept(rt, m)
        if len(drain.unneeded) >= 10:
            await drain.delete_unneeded(rt, queue)
        if not got and drain.expecting_commits():
            # Nothing in flight for us, yet tasks whose batches we hold have not been seen to
            # commit: their commits, which no message announces, are what we wait for. Ask
            # the table now instead of at the backed-off time.
            next_poll = 0.0
        if got:
            await draining()
        # One pass over the winners, and only once all are known (it costs what
        # drain.complete() does, every turn).
        missing = drain.missing() if len(drain.winners) >= spec.maps else -1
        if missing < 0 or missing != missing_before:
            missing_before, progress_at = missing, clock.monotonic()
        elif clock.monotonic() - progress_at > give_up_s:
            raise TaskError(
                f"partition {drain.partition}: every map task committed, yet "
                f"{missing} of the batches their commits name never arrived in "
                f"{give_up_s} s ({drain.missing_text()}): the commit records and the queue "
                "disagree (the table or the bucket was written by someone else)"
            )
        if got or len(drain.winners) < spec.maps:
            stalled_since = None
        elif stalled_since is None:
            stalled_since = clock.monotonic()
        elif clock.monotonic() - stalled_since > CONFLICT_CHECK_S:
            # Every map committed, yet batches are missing and none arrive: another reader
            # holds part of this queue (the seeds' cue for a conflict). Ask the store who
            # owns the partition; if it is not us any more we let go at once.
            stalled_since = None
            drain.stats["conflict_checks"] += 1
            if await owner.renew():
                rt.log.info(
                    "batches held elsewhere; waiting for their leases to lapse",
                    job=spec.job_id,
                    partition=drain.partition,
                    missing=drain.missing(),
                )
    await drain.delete_unneeded(rt, queue)


async def _let_go(rt: Runtime, drain: Drain, queue: str, *, lost: bool) -> None:
    """Hand back every batch we hold at once, so the next owner is not stalled for a
    whole visibility timeout (we lost the claim, paused past our lease, or failed)."""
    if lost:
        rt.log.warning(
            "lost the claim on a partition; releasing its messages",
            job=drain.spec.job_id,
            partition=drain.partition,
        )
        drain.stats["leases_lost"] += 1
    drain.let_go = True
    receipts, drain.held = list(drain.held.values()), {}
    if receipts:
        with contextlib.suppress(BackendError):
            await rt.backend.queues.change_visibility(queue, receipts, 0)


async def _reduce_streamed(
    rt: Runtime,
    reduce: Callable[[str, Callable[[], float] | None], Coroutine[Any, Any, ReduceResult]],
    drain: Drain,
    url: str,
) -> tuple[ReduceResult, int]:
    """The reduce run in the pool, its output uploaded to ``url`` as it is written; (its
    result, the bytes stored). Nothing is stored when the reduce fails; an upload that
    fails passes on its error at once, the pipe closed under the pool process, whose next
    write then fails (EPIPE): its outcome is nobody's."""
    pipe = PoolPipe(drain.workdir)
    try:
        call = asyncio.ensure_future(reduce(pipe.path, pipe.stalled))
        try:
            nbytes = await rt.backend.blobs.upload_stream(
                url, pipe.chunks(call, lambda r: not r.error), size_hint=drain.spooled
            )
        except PoolFailed:
            return await call, 0  # its error, or its exception raised here
        except BaseException:
            pipe.close()  # the pool's next write fails: it stops, and its outcome is nobody's
            call.cancel()
            raise
        return await call, nbytes
    finally:
        pipe.close()


async def _reduce_and_commit(
    rt: Runtime, spec: JobSpec, owner: Claim, drain: Drain, msg: Received | None, queue: str
) -> tuple[str, str]:
    reduce_q = spec.queues()[1]
    limit = task_limit(spec.task_timeout_s, drain.spooled)
    url = reduce_output_url(spec.scratch, spec.job_id, drain.partition, owner.epoch, owner.token)
    files_dir = await sidefiles.fetch(rt, spec)

    def reduce(
        out_path: str, stalled: Callable[[], float] | None = None
    ) -> Coroutine[Any, Any, ReduceResult]:
        return rt.cpu(
            run_reduce,
            spec.ref,
            spec.params,
            drain.winner_spools(),
            ReduceSpec.of(
                spec,
                rt.settings,
                out_path=out_path,
                spill_dir=drain.workdir,
                limit_s=limit,
                what=f"reduce of partition {drain.partition}",
                files_dir=files_dir,
            ),
            limit_s=limit,
            stalled=stalled,
        )

    if rt.backend.capabilities.local_files:
        out_path = os.path.join(drain.workdir, "output")
        result = await reduce(out_path)
        if not result.error:
            nbytes = os.path.getsize(out_path)
            await rt.backend.blobs.upload_file(out_path, url, frozen=True)
            # The store may share the file (frozen): its name here is gone before anything
            # could write through it.
            os.unlink(out_path)
    else:
        # Streamed to the store as the pool writes it (cmr.poolpipe): the output never
        # touches this disk.
        result, nbytes = await _reduce_streamed(rt, reduce, drain, url)
    drain.stats["reduce_spills"] += result.spills
    if result.error:
        await owner.release()
        await _let_go(rt, drain, queue, lost=False)
        if msg is not None:
            await failures.task_failed(
                rt, spec, failures.TaskRef.reduce(drain.partition), result.error, reduce_q, msg
            )
        return "failed", result.error
    await rt.step("reduce.output_written", job=spec.job_id, partition=drain.partition, output=url)
    if result.status:
        rt.log.info("reduce task status", job=spec.job_id, status=result.status)
    # The digest, hashed as the pool wrote the file, goes into the commit next to its size:
    # the next step of a pipeline reads only the bytes this commit names.
    if not await owner.commit(
        url, result.records_out, nbytes, result.counters, digest=result.digest
    ):
        drain.stats["leases_lost"] += 1
        rt.log.warning(
            "partition was taken over before our commit; output discarded",
            job=spec.job_id,
            partition=drain.partition,
        )
        # The new owner (a straggler's backup, say) needs the batches we still hold: at
        # once, not when our last renewal of them lapses (up to two leases).
        await _let_go(rt, drain, queue, lost=False)
        await rt.backend.blobs.delete([url])
        return "lost", ""
    await rt.step("reduce.committed", job=spec.job_id, partition=drain.partition, output=url)
    await rt.add_stats(spec.job_id, drain.stats)
    drain.stats.clear()
    await rt.flush_stats()  # the job that ends now shows this worker's counters at once
    # Finishing the job is everyone's duty; the last committer is simply the first to see
    # it due (finalize.count_commit). Our message goes only after: if we die first, its next
    # receiver counts our commit and finalizes.
    if await finalize.count_commit(rt, spec):
        await finalize.finalize(rt, spec)
    if msg is not None:
        await rt.backend.queues.delete_messages(reduce_q, [msg.receipt])
    return "committed", ""
