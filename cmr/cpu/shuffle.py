"""A map task's output on its way to the shuffle: pairs partitioned (``partitioner``),
combined as they pile up (``Combiner``, also the reduce side's), buffered per partition and
packed into compressed, tagged batch messages in the task's spool file (``Shuffle``).
"""

from __future__ import annotations

import itertools
import operator
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

from cmr import usercode, wire
from cmr.cpu.specs import MapSpec
from cmr.job import Job
from cmr.partition import RangePartitioner, StablePartitioner

COMBINE_KEYS = 200_000  # distinct keys held before a map task combines and flushes
REDUCE_COMBINE_AT = 64  # values per key held before combining them (map and reduce side)
# After a combine that left a key n values (a combiner that does not shrink, e.g. one that
# drops duplicates), the key is combined again only at COMBINE_GROWTH * n values: each
# combine then costs at most a constant per value added since the last, so combining stays
# linear in the values, whatever the combiner yields.
COMBINE_GROWTH = 2
BLOCK_PARTITIONS = 32  # a block spread over more partitions goes pair by pair
_first = operator.itemgetter(0)  # a pair's key, by C


class Block(list[tuple[Any, Any]]):
    """Records of a step without map, as an input format read them: pairs already."""


def unpackable(pairs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The first pair msgpack cannot pack (a block refused as a whole names it)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    for pair in pairs:
        try:
            pack(pair)
        except (TypeError, ValueError, OverflowError):
            return pair
    return None


def _array_header(n: int) -> int:
    """Bytes of msgpack's header of an array of n items: fixarray, array 16, array 32."""
    return 1 if n < 16 else 3 if n < 1 << 16 else 5


class Shuffle:
    """Per-partition buffers that become compressed, tagged batch messages in a spool file."""

    def __init__(self, spec: MapSpec, out: Any) -> None:
        self.spec = spec
        self.out = out
        self.buffers: list[list[bytes]] = [[] for _ in range(spec.partitions)]
        self.sizes = [0] * spec.partitions
        self.counts = [0] * spec.partitions
        self.batches = [0] * spec.partitions
        self.records = [0] * spec.partitions
        self.packer = msgpack.Packer(use_bin_type=True)
        if spec.compress:
            # Raw bytes per batch, tuned by the compression ratio seen so far.
            self.target = [spec.max_message_bytes * 3] * spec.partitions
        else:
            # A plain body's size is known in advance: its header plus the pairs.
            header = len(
                wire.encode(
                    wire.Batch(spec.job, spec.task, spec.attempt, 2**32, 2**32, 2**32, b""),
                    compress=False,
                )
            )
            room = spec.max_message_bytes - header - 4  # bin 8/16/32 adds up to 4 bytes
            self.target = [room] * spec.partitions
        self.last_pair: Any = None  # what add_pairs was handling when something raised
        # A task that sent fixed-width rows (add_rows): its batches take wire.encode's level
        # for rows from then on (a chunk of it that went the general way too, harmlessly).
        self.rows = False
        # Below this a batch is not worth a message of its own (compressed guesses shrink
        # the target when a body came out too big).
        self.floor = max(1, min(64 * 1024, spec.max_message_bytes // 4))

    def add(self, p: int, key: Any, value: Any) -> None:
        # An out-of-range p is refused before this (a custom partition() is checked); key and
        # value that are not wire data make pack raise, diagnosed by the caller.
        data = self.packer.pack((key, value))
        if len(data) > wire.MAX_DECODED:
            # A reducer takes no spilled batch past this (a bucket writer's could be any
            # size): refused here, at once, rather than lost on the way.
            raise usercode.PairTooBig(
                f"it packs to {len(data):,} bytes, past the {wire.MAX_DECODED:,} one "
                "shuffled pair may take: emit smaller values (big data belongs in the "
                "output store, named by its key)"
            )
        if len(data) > self.spec.max_message_bytes // 2:
            self._emit(p, [data], 1, spilled=True)
            return
        if not self.spec.compress and self.sizes[p] + len(data) > self.target[p]:
            self.flush(p)  # exact packing: this pair would not fit in the plain body
        self._hold(p, data, 1)

    def add_pairs(self, pairs: Iterable[tuple[Any, Any]], part: Callable[[Any, int], int]) -> None:
        """2-tuples, in order, each taken as add() takes it (the same batches, written in
        the same order), with what add() and part() do per pair done inline: a word
        count's map task sends hundreds of thousands of pairs, and the calls were half of
        what it spent past its own map. When something raises, ``last_pair`` is the pair
        it was handling (the caller's diagnosis names it)."""
        n = self.spec.partitions
        pair: Any = None
        try:
            if not self.spec.compress:  # plain bodies, packed to the byte: add() knows how
                for pair in pairs:
                    self.add(part(pair[0], n), pair[0], pair[1])
                return
            pack, big = self.packer.pack, self.spec.max_message_bytes // 2
            buffers, sizes, counts, target = self.buffers, self.sizes, self.counts, self.target
            stable, crc32 = type(part) is StablePartitioner, zlib.crc32
            for pair in pairs:
                key = pair[0]
                # A str key: stable_partition's sum, without its calls; strict UTF-8 (a key
                # with a lone surrogate fails here as pack() would).
                p = crc32(key.encode()) % n if stable and type(key) is str else part(key, n)
                data = pack(pair)
                size = len(data)
                if size > big:  # a pair of its own blob, or one refused: add() knows
                    self.add(p, key, pair[1])
                    continue
                buffers[p].append(data)  # _hold's work (flush() replaces buffers[p])
                sizes[p] += size
                counts[p] += 1
                if sizes[p] >= target[p]:
                    self.flush(p)
        except BaseException:
            self.last_pair = pair
            raise

    def _hold(self, p: int, data: bytes, n: int) -> None:
        """Buffer n packed pairs for partition p; a batch once the target is reached."""
        self.buffers[p].append(data)
        self.sizes[p] += len(data)
        self.counts[p] += n
        if self.sizes[p] >= self.target[p]:
            self.flush(p)

    def add_block(self, pairs: list[tuple[Any, Any]], part: Callable[[Any, int], int]) -> None:
        """Pairs that need no checking (records of a step without map: tuples of wire data
        as an input format reads them), partitioned and packed a partition at a time by C:
        the pairs of one partition, packed as a msgpack array, are its header followed by
        each pair as add() would pack it. Plain bodies, packed exactly, and big pairs go
        one by one."""
        n = self.spec.partitions
        many = getattr(part, "many", None)
        keys = list(map(_first, pairs))
        ps = many(keys, n) if many is not None else list(map(part, keys, itertools.repeat(n)))
        which = set(ps)
        if len(which) > BLOCK_PARTITIONS:  # one pass per partition would cost more
            for p, (key, value) in zip(ps, pairs, strict=True):
                self.add(p, key, value)
            return
        for p in which:
            mine = pairs if len(which) == 1 else list(itertools.compress(pairs, map(p.__eq__, ps)))
            self._add_packed(p, mine)

    def _add_packed(self, p: int, pairs: list[tuple[Any, Any]]) -> None:
        if not self.spec.compress:
            for key, value in pairs:
                self.add(p, key, value)
            return
        packed = self.packer.pack(pairs)
        body = packed[_array_header(len(pairs)) :]
        if len(body) > self.floor and len(pairs) > 1:
            half = len(pairs) // 2  # pieces no bigger than a batch takes in one
            self._add_packed(p, pairs[:half])
            self._add_packed(p, pairs[half:])
            return
        if len(body) > self.spec.max_message_bytes // 2:
            key, value = pairs[0]
            self.add(p, key, value)  # a pair of its own blob
            return
        self._hold(p, body, len(pairs))

    def add_rows(self, p: int, rows: memoryview, n: int, width: int) -> None:
        """n pairs packed as fixed-width rows (cmr.cpu.fixedsort), in pieces of whole rows no
        bigger than a batch takes in one (a row is at most ``floor`` bytes: Cuts.of)."""
        per = max(1, self.floor // width)
        self.rows = True
        for at in range(0, n, per):
            k = min(per, n - at)
            self._hold(p, bytes(rows[at * width : (at + k) * width]), k)

    def flush(self, p: int) -> None:
        if not self.buffers[p]:
            return
        parts, n = self.buffers[p], self.counts[p]
        self.buffers[p], self.sizes[p], self.counts[p] = [], 0, 0
        self._emit(p, parts, n, spilled=False)

    def _emit(self, p: int, parts: list[bytes], n: int, *, spilled: bool) -> None:
        s = self.spec
        if spilled:
            # The loop uploads the stream to a blob and sends a small batch pointing at it.
            self.out.write(self.packer.pack((p, self.batches[p], n, b"".join(parts), True)))
        else:
            raw = b"".join(parts)
            body = wire.encode(
                wire.Batch(s.job, s.task, s.attempt, p, self.batches[p], n, raw),
                compress=s.compress,
                rows=self.rows,
            )
            # Too big for a message, or holding more pairs than a reader accepts from a body
            # this small (values that compress thousands of times): send it in halves.
            too_dense = len(raw) > wire.decoded_limit(len(body), wire.MAX_BATCH_PAIRS)
            if (len(body) > s.max_message_bytes or too_dense) and len(parts) > 1:
                half = len(parts) // 2
                if n == len(parts):  # a pair a part (add's): no need to count them
                    left = half
                else:
                    left = sum(1 for _ in wire.iter_pairs(b"".join(parts[:half])))
                self._emit(p, parts[:half], left, spilled=False)
                self._emit(p, parts[half:], n - left, spilled=False)
                if s.compress:
                    self.target[p] = max(self.floor, self.target[p] // 2)
                return
            if s.compress:
                ratio = len(raw) / max(1, len(body))
                target = int(s.max_message_bytes * ratio * 0.85)
                if ratio > wire.MAX_RATIO / 2:
                    # Data that compresses this well looks like a bomb to a reader past
                    # MAX_RATIO: pack only what any body may decode to.
                    target = wire.DECODED_FLOOR
                self.target[p] = min(wire.MAX_BATCH_PAIRS, target)
            self.out.write(self.packer.pack((p, self.batches[p], n, body, False)))
        self.batches[p] += 1
        self.records[p] += n

    def close(self) -> None:
        for p in range(self.spec.partitions):
            self.flush(p)


class Values(list[Any]):
    """A key's values in a map task's groups once it has more than one (its first is held
    alone, as most keys never get a second: a list per key cost a tenth of a small-files
    task)."""


class Combiner:
    """A job's combine, run on a key's values as they pile up: at REDUCE_COMBINE_AT values,
    then again only once the values doubled since the last combine (COMBINE_GROWTH), so its
    cost is linear in the values however little the combiner shrinks them. What combine
    yields is checked (it is called once per many values, not per pair)."""

    def __init__(self, combine: Callable[[Any, Iterator[Any]], Any], method: str) -> None:
        self.combine = combine
        self.method = method
        self.next_at: dict[Any, int] = {}  # keys whose combine left many values: when next

    def due(self, key: Any, held: int) -> bool:
        """Whether a key now holding ``held`` values (>= REDUCE_COMBINE_AT) is combined now."""
        return held >= self.next_at.get(key, REDUCE_COMBINE_AT)

    def values(self, key: Any, values: list[Any]) -> list[Any]:
        """The key's values, combined; remembers when to combine the key next."""
        out = [v for _, v in self.pairs(key, values)]
        if len(out) * COMBINE_GROWTH > REDUCE_COMBINE_AT:
            self.next_at[key] = len(out) * COMBINE_GROWTH
        else:
            self.next_at.pop(key, None)
        return out

    def pairs(self, key: Any, values: list[Any]) -> Iterator[tuple[Any, Any]]:
        source = self.combine(key, iter(values))
        try:
            pairs = iter(source)
        except TypeError:  # `return sum(values)` instead of `yield key, sum(values)`
            raise usercode.not_pairs(self.method, source) from None
        for pair in pairs:
            if type(pair) is tuple and len(pair) == 2:
                yield pair
            else:
                yield usercode.as_pair(pair, self.method, source)

    def forget(self) -> None:
        """The groups were flushed or spilled: every key starts afresh."""
        self.next_at.clear()

    def flushed(self, groups: dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
        """A map task's groups, combined: each key holds its value alone, or its Values
        (combined if more than one). The runs of keys holding a value alone are passed on
        as the dict's own items, by C (most keys of real text: no yield of ours each); each
        key's combine is called where its pairs come, as they are taken."""
        self.forget()
        items = iter(groups.items())
        grown = itertools.compress(
            itertools.count(),
            map(operator.is_, map(type, groups.values()), itertools.repeat(Values)),
        )
        return itertools.chain.from_iterable(self._runs(items, grown))

    def _runs(
        self, items: Iterator[tuple[Any, Any]], grown: Iterator[int]
    ) -> Iterator[Iterable[tuple[Any, Any]]]:
        """Pieces of ``items``: runs of pairs as they are, and the pairs of each key at a
        position of ``grown`` (holding Values), combined."""
        at = 0
        for i in grown:
            if i > at:
                yield itertools.islice(items, i - at)
            key, values = next(items)
            yield ((key, values[0]),) if len(values) == 1 else self.pairs(key, values)
            at = i + 1
        yield items


def partitioner(
    job: Job, partitions: int, cuts: tuple[Any, ...] | None = None
) -> Callable[[Any, int], int]:
    """The job's partition(); a custom one is checked to return a partition that exists.
    With cut points (a total-order job's plan) the range partitioner: in range, as the plan
    holds fewer cut points than partitions (cmr.plan)."""
    if cuts is not None:
        return RangePartitioner(cuts)
    part = job.partition
    if type(job).partition is Job.partition:
        return StablePartitioner()  # in range by construction
    method = f"{type(job).__name__}.partition"

    def checked(key: Any, n: int) -> int:
        p = part(key, n)
        if type(p) is not int:
            try:
                p = operator.index(p)  # numpy's integers and other int-likes
            except TypeError:
                raise usercode.bad_partition(method, p, key, n) from None
        if not 0 <= p < n:
            raise usercode.bad_partition(method, p, key, n)
        return p

    return checked
