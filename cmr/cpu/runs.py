"""A reducer's spooled pairs read in blocks, held sorted, spilled as sorted runs past the
memory budget and merged back, at most MERGE_FANIN runs open at once (``merge_in_passes``,
which ``cmr.cpu.fixedsort`` shares).
"""

from __future__ import annotations

import heapq
import itertools
import operator
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from cmr import wire
from cmr.cpu.order import PLAIN_KEYS, ValueOrder, sort_key, sorted_keys
from cmr.cpu.shuffle import REDUCE_COMBINE_AT, Combiner
from cmr.errors import WireError

# The sorted-pairs path: a pair's tuple and list slot, and two object headers
# its packed bytes do not show (an int packs to 1 byte and is a 28-byte object).
PAIR_COST = 64 + 2 * 40
PAIR_BLOCK = 4096  # pairs read from a spool at a time (C loops do the rest)
PAIR_SAMPLE = 8  # pairs of a block whose object sizes are measured
MERGE_FANIN = 64  # sorted runs merged at once; more are merged in passes first
BUCKET_SORT_MIN = 1 << 16  # pairs past which str and bytes keys are sorted in buckets
BUCKET_SAMPLE = 4096  # keys sampled for how many prefixes they have
BUCKET_SAMPLE_SHARE = 2  # buckets pay while at most half a sample's prefixes are distinct
_first = operator.itemgetter(0)  # a pair's key, by C
_second = operator.itemgetter(1)  # a pair's value
_FLAT = {str, bytes, int}  # kinds whose object size follows their packed size
_prefix = operator.itemgetter(slice(0, 2))  # a str or bytes key's first two characters


def spool_blocks(
    spools: list[str], memory_bytes: int
) -> Iterator[tuple[list[tuple[Any, Any]], int]]:
    """The spooled pairs in blocks, each with the packed bytes it came from: at most
    PAIR_BLOCK pairs, and about a sixteenth of the memory budget by the bytes per pair of
    the block before (the budget is checked between blocks; a first block is small). Every
    entry is checked to be a (key, value) pair, by C loops over the block."""
    cap = max(4096, memory_bytes // 16)
    count = 16
    for spool in spools:
        with open(spool, "rb") as f:
            unpacker = msgpack.Unpacker(
                f,
                raw=False,
                use_list=False,
                strict_map_key=False,
                max_buffer_size=wire.MAX_DECODED,
            )
            at = 0
            while block := list(itertools.islice(unpacker, count)):
                if set(map(type, block)) != {tuple} or set(map(len, block)) != {2}:
                    raise WireError("a spooled record is not a [key, value] pair")
                now = unpacker.tell()
                yield block, now - at
                per_pair = max(1, (now - at) // len(block))
                count = max(1, min(PAIR_BLOCK, cap // per_pair))
                at = now
            if unpacker.tell() != os.fstat(f.fileno()).st_size:
                # msgpack stops quietly at a record cut short: the pairs in it would be lost
                raise WireError("a spool ends inside a record (was the disk full?)")


def _block_cost(block: list[tuple[Any, Any]], packed: int) -> int:
    """What holding a block of pairs costs, for the memory budget: the larger of its packed
    bytes plus per-pair overheads and its objects' sizes. Those are measured on a sample
    when values are all str, bytes or int (a size that follows the packed one; the keys,
    of a PLAIN_KEYS kind, are: sorted_pairs checked them); on every pair otherwise (a
    tuple of empty maps packs to a byte per map)."""
    if set(map(type, map(_second, block))) <= _FLAT:
        step = max(1, len(block) // PAIR_SAMPLE)
        sample = block[::step]
        sizes = sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in sample)
        sizes = sizes * len(block) // len(sample)
    else:
        sizes = sum(map(sys.getsizeof, itertools.chain.from_iterable(block)))
    return len(block) * PAIR_COST + max(packed, sizes)


def sorted_pairs(
    blocks: Iterator[tuple[list[tuple[Any, Any]], int]],
    memory_bytes: int,
    spill_dir: str,
    runs: list[str],
    combiner: Combiner | None = None,
) -> tuple[list[tuple[Any, Any]], Iterator[tuple[list[tuple[Any, Any]], int]] | None]:
    """Pairs whose keys are all of one plain kind (str, int or bytes), held as a list and
    sorted by key in C (stable: each key's values keep their arrival order), spilling sorted
    runs past the budget: ~5x cheaper per pair than grouping in a dict. With a combiner,
    the held pairs are combined (each key's, once it holds REDUCE_COMBINE_AT values) when
    they reach the budget, and spilled only if that did not halve them: combining bounds
    memory, never the output (a word count's reducer, whose keys hold a few values each,
    never combines). Returns the pairs held, in arrival order (for the caller to sort:
    sort_pairs), and None; or, at the first block whose keys are of another kind or of a
    second kind, the pairs held so far and the blocks left, for the general path to take
    over."""
    pairs: list[tuple[Any, Any]] = []
    kinds: set[type] = set()
    held = 0
    for block, packed in blocks:
        kinds.update(map(type, map(_first, block)))
        if len(kinds) > 1 or not kinds.issubset(PLAIN_KEYS):
            if held >= memory_bytes // 4:
                # Regrouped in a dict, these would be held twice for a while: spilled
                # instead, a run in sort_key order (one plain kind: its own order).
                pairs = sort_pairs(pairs)
                runs.append(write_pairs_run(pairs, spill_dir))
                pairs = []
            return pairs, itertools.chain([(block, packed)], blocks)
        pairs += block
        held += _block_cost(block, packed)
        if held >= memory_bytes:
            pairs = sort_pairs(pairs)
            if combiner is not None:
                fewer = _combined(pairs, combiner)
                if len(fewer) * 2 <= len(pairs):
                    held = held * len(fewer) // len(pairs)
                    pairs = fewer
                    continue
                combiner = None  # combining does not shrink these pairs: no pass again
            runs.append(write_pairs_run(pairs, spill_dir))
            pairs, held = [], 0
    return pairs, None


def sort_pairs(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Pairs whose keys are all of one plain kind, sorted by key, stably (each key's values
    keep their arrival order). Many str or bytes keys are first dealt into buckets by their
    first two characters, and the buckets sorted one by one, in order (a key's prefix
    orders it before every key of a greater prefix): each bucket's keys stay in the CPU's
    caches while it is sorted, where one sort of all of them waits on memory at every
    compare (measured: a word count reducer's 600,000 pairs sorted in ~25% less time)."""
    if (
        len(pairs) < BUCKET_SORT_MIN
        or type(pairs[0][0]) not in (str, bytes)
        or _many_prefixes(pairs)
    ):
        pairs.sort(key=_first)
        return pairs
    buckets: dict[Any, list[tuple[Any, Any]]] = {}
    bucket = buckets.get
    # Each key's prefix cut by C, not by the loop's own bytecode (a few % of the sort).
    for pair, prefix in zip(pairs, map(_prefix, map(_first, pairs)), strict=True):
        held = bucket(prefix)
        if held is None:
            buckets[prefix] = [pair]
        else:
            held.append(pair)
    out: list[tuple[Any, Any]] = []
    for prefix in sorted(buckets):
        held = buckets.pop(prefix)
        held.sort(key=_first)
        out += held
    return out


def _many_prefixes(pairs: list[tuple[Any, Any]]) -> bool:
    """Whether the keys' two-character prefixes are too many for buckets to pay: over one in
    BUCKET_SAMPLE_SHARE of a sample's keys distinct. Keys of a large alphabet (CJK words,
    random bytes) make buckets of a few pairs each: measured up to 6x slower than one sort,
    and ~180 bytes a pair more at the budget's peak. Real text's words: ~1 in 4 distinct in
    a sample of 4,096, hundreds of pairs a bucket over a partition."""
    step = max(1, len(pairs) // BUCKET_SAMPLE)
    sample = pairs[::step]
    prefixes = {pair[0][:2] for pair in sample}
    return len(prefixes) * BUCKET_SAMPLE_SHARE > len(sample)


def _combined(pairs: list[tuple[Any, Any]], combiner: Combiner) -> list[tuple[Any, Any]]:
    """Pairs sorted by key with the values of each key that holds REDUCE_COMBINE_AT of them
    or more replaced by what combine makes of them (its pairs' values, under the key)."""
    out: list[tuple[Any, Any]] = []
    for key, group in itertools.groupby(pairs, _first):
        run = list(group)
        if len(run) < REDUCE_COMBINE_AT:
            out += run
        else:
            out += [(key, v) for _, v in combiner.pairs(key, list(map(_second, run)))]
    return out


def write_pairs_run(pairs: list[tuple[Any, Any]], spill_dir: str) -> str:
    """Sorted pairs as a run: an entry (key, (value,)) per pair, as readers expect."""
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    pack = msgpack.Packer(use_bin_type=True).pack
    with os.fdopen(fd, "wb") as f:
        for key, value in pairs:
            f.write(pack((key, (value,))))
    return path


def write_run(groups: dict[Any, list[Any]], spill_dir: str, order: ValueOrder | None = None) -> str:
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    packer = msgpack.Packer(use_bin_type=True)
    with os.fdopen(fd, "wb") as f:
        for key in sorted_keys(groups):
            if order is None:
                f.write(packer.pack((key, groups[key])))
            else:
                for value in order.sorted(groups[key]):
                    f.write(packer.pack((key, (value,))))
    return path


def _read_run(path: str, read_size: int) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    with open(path, "rb", buffering=0) as f:
        unpacker = msgpack.Unpacker(
            f,
            raw=False,
            use_list=False,
            strict_map_key=False,
            max_buffer_size=wire.MAX_DECODED,
            read_size=read_size,  # msgpack's default is 1 MiB per open run
        )
        yield from unpacker


def merged_entries(
    runs: list[str], read_size: int, order: ValueOrder | None = None, plain: bool = False
) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """The runs' entries merged in key order; ``plain``: every key is of one plain kind,
    compared as it is (the same order as sort_key's)."""
    readers = (_read_run(r, read_size) for r in runs)
    if plain:
        return heapq.merge(*readers, key=_first)
    if order is None:
        return heapq.merge(*readers, key=lambda kv: sort_key(kv[0]))
    by = order.key
    return order.guarded(heapq.merge(*readers, key=lambda kv: (sort_key(kv[0]), by(kv[1][0]))))


def merge_runs(
    runs: list[str],
    spill_dir: str,
    read_size: int,
    order: ValueOrder | None = None,
    plain: bool = False,
) -> str:
    """One sorted run from several, entries kept as they are (a key may repeat: readers
    group adjacent entries), so no key's values are ever gathered in memory here."""
    fd, path = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=spill_dir)
    packer = msgpack.Packer(use_bin_type=True)
    try:
        with os.fdopen(fd, "wb") as f:
            for kv in merged_entries(runs, read_size, order, plain):
                f.write(packer.pack(kv))
    except BaseException:
        os.unlink(path)
        raise
    for r in runs:
        os.unlink(r)
    return path


def merge_in_passes(runs: list[str], merge: Callable[[list[str]], str]) -> None:
    """Merge ``runs`` until at most MERGE_FANIN are left (each open run holds a read
    buffer): each MERGE_FANIN consecutive runs become one, where they were. A merge keeps
    equal keys in run order, so each key's values stay in arrival order, and every run is
    rewritten once a pass. ``merge`` writes its runs as one, removes them and returns the
    new one's path; in place, so every live run is always in ``runs``, which the caller
    removes however the task ends."""
    while len(runs) > MERGE_FANIN:
        i = 0
        while i < len(runs):
            group = runs[i : i + MERGE_FANIN]
            if len(group) > 1:
                runs[i : i + MERGE_FANIN] = [merge(group)]
            i += 1
