"""A combine that is exactly ``yield key, sum(values)`` (cmr.cpu.summing) runs as
int sums added by the engine: recognised by its code (and by nothing that only looks
alike), and giving exactly what calling it gives — the same totals out of a map task, the
same output bytes out of a reduce task — whatever the values (bools, floats, ints past
64 bits), the keys' kinds, the budget or the partitioner."""

from __future__ import annotations

import os
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cmr import wire
from cmr.cpu import summing
from cmr.cpu.mapping import run_map
from cmr.cpu.reducing import run_reduce
from cmr.cpu.specs import REDUCE_MEMORY_MIN, MapSpec, ReduceSpec
from cmr.job import Job, JobRef

from .spooling import spool_files

JOBS = '''
import ast
from collections import Counter

import cmr


class Fast(cmr.Job):
    """Combine and reduce as a word count writes them: the engine adds the ints itself."""

    reducers = 4

    def map(self, key, line):
        for word in line.split():
            yield word, 1

    def combine(self, word, counts):
        yield word, sum(counts)

    def reduce(self, word: str, counts: "Iterator[int]") -> "Iterator[tuple[str, int]]":
        """With a docstring and annotations: the same code."""
        yield (word, sum(counts))


class Slow(Fast):
    """The same sums, written so the engine does not recognise them: it calls them."""

    def combine(self, word, counts):
        yield word, sum(counts, 0)

    def reduce(self, word, counts):
        yield word, sum(counts, 0)


class FastChunk(Fast):
    def map_chunk(self, name, data):
        return Counter(data.decode("utf-8", "replace").split()).items()


class SlowChunk(Slow):
    map_chunk = FastChunk.map_chunk


class FastOdd(Fast):
    """Values of every kind a sum takes: bools, floats, big ints, negative ints."""

    def map(self, key, line):
        for i, word in enumerate(line.split()):
            yield word, (True, 2.5, 2**40, -3, 1, False)[(len(word) + i) % 6]


class SlowOdd(Slow):
    map = FastOdd.map


class FastMixedKeys(Fast):
    """Keys of several kinds in one task and partition: str, int, bytes, tuples, bool."""

    def map(self, key, line):
        for word in line.split():
            yield (word, len(word) % 5, word.encode(), (word, 1), len(word) == 3)[len(word) % 5], 1


class SlowMixedKeys(Slow):
    map = FastMixedKeys.map


class FastOwnPartition(Fast):
    def partition(self, key, n):
        return len(str(key)) % n


class SlowOwnPartition(Slow):
    partition = FastOwnPartition.partition


class FastFormat(Fast):
    def format(self, key, value):
        return 5


class SlowFormat(Slow):
    format = FastFormat.format


class FastLiteral(Fast):
    """Each line a pair, as Python writes it: keys and values of any kind, in any order."""

    def map(self, key, line):
        yield ast.literal_eval(line)


class SlowLiteral(Slow):
    map = FastLiteral.map


class FastLiteralChunk(Fast):
    def map_chunk(self, name, data):
        return dict(ast.literal_eval(data.decode())).items()


class SlowLiteralChunk(Slow):
    map_chunk = FastLiteralChunk.map_chunk


class FastRangeChunk(Fast):
    """Each line "KIND START STOP VALUE": a dict of VALUE under the keys START..STOP-1, as
    str (w), int (i) or float (f: equal to the ints)."""

    def map_chunk(self, name, data):
        counts = {}
        for line in data.decode().splitlines():
            kind, start, stop, value = line.split()
            make = {"w": lambda i: f"w{i}", "i": int, "f": float}[kind]
            counts.update((make(i), int(value)) for i in range(int(start), int(stop)))
        return counts.items()


class SlowRangeChunk(Slow):
    map_chunk = FastRangeChunk.map_chunk


class FastSetFormat(Fast):
    def setup(self):
        self.format = lambda k, v: f"{k},{v}"


class SlowSetFormat(Slow):
    setup = FastSetFormat.setup


class FastHuge(Fast):
    def map(self, key, line):
        for word in line.split():
            yield word, 2**62


class SlowHuge(Slow):
    map = FastHuge.map
'''


def _ref(tmp_path: Path, cls: str) -> JobRef:
    path = tmp_path / "sums.py"
    if not path.exists():
        path.write_text(JOBS)
    return JobRef.parse(f"{path}:{cls}")


def _text(seed: int = 1, lines: int = 6_000) -> bytes:
    rnd = random.Random(seed)
    words = ["".join(rnd.choices("abcdefghijklmnopé中", k=rnd.randint(1, 7))) for _ in range(3_000)]
    return "\n".join(" ".join(rnd.choices(words, k=9)) for _ in range(lines)).encode()


# ------------------------------------------------------------------------ recognition


class Shapes(Job):
    def exact(self, word, counts):  # type: ignore[no-untyped-def]
        yield word, sum(counts)

    def parenthesised(self, k: Any, v: Iterator[int]) -> Iterator[tuple[Any, int]]:
        """Documented and annotated."""
        yield (k, sum(v))

    @staticmethod
    def static(k, v):  # type: ignore[no-untyped-def]
        yield k, sum(v)

    def listed(self, k, v):  # type: ignore[no-untyped-def]
        yield k, sum(list(v))

    def started(self, k, v):  # type: ignore[no-untyped-def]
        yield k, sum(v, 0)

    def swapped(self, k, v):  # type: ignore[no-untyped-def]
        yield v, sum(k)

    def returned(self, k, v):  # type: ignore[no-untyped-def]
        return [(k, sum(v))]

    def twice(self, k, v):  # type: ignore[no-untyped-def]
        yield k, sum(v)
        yield k, sum(v)

    def starred(self, k, *v):  # type: ignore[no-untyped-def]
        yield k, sum(v)

    async def awaited(self, k, v):  # type: ignore[no-untyped-def]
        yield k, sum(v)

    def counted(self, k, v):  # type: ignore[no-untyped-def]
        self.increment_counter("g", "n")
        yield k, sum(v)


def test_the_sum_is_recognised_by_its_code_and_nothing_else() -> None:
    s = Shapes()
    assert [summing.is_sum(f) for f in (s.exact, s.parenthesised, s.static)] == [True] * 3

    def nested(k, v):  # type: ignore[no-untyped-def]
        yield k, sum(v)

    assert summing.is_sum(nested)
    lookalikes = [
        s.listed, s.started, s.swapped, s.returned, s.twice, s.starred, s.awaited, s.counted,
        None, len, sum, print,
    ]  # fmt: skip
    assert [summing.is_sum(f) for f in lookalikes] == [False] * len(lookalikes)
    # The unbound method takes self: three arguments, not the two a step calls it with.
    assert not summing.is_sum(Shapes.exact)


def test_a_sum_that_is_not_the_builtin_is_called() -> None:
    # `sum` of the function's own module, or a closure: the code alone says nothing.
    shadowed: dict[str, Any] = {"sum": lambda values: 42}
    exec("def reduce(k, v):\n    yield k, sum(v)\n", shadowed)
    assert not summing.is_sum(shadowed["reduce"])
    plain: dict[str, Any] = {}
    exec("def reduce(k, v):\n    yield k, sum(v)\n", plain)
    assert summing.is_sum(plain["reduce"])

    def outer(total: Any) -> Any:
        def reduce(k, v):  # type: ignore[no-untyped-def]
            yield k, total(v)

        return reduce

    assert not summing.is_sum(outer(sum))


def test_merge_adds_each_keys_count() -> None:
    totals: dict[Any, int] = {}
    summing.merge(totals, Counter({"a": 1, "b": 2}))
    summing.merge(totals, {"b": 5, "c": 1, 1.0: 7})
    summing.merge(totals, {1: 1, "a": -1})
    assert totals == {"a": 0, "b": 7, "c": 1, 1.0: 8}
    assert [type(k) for k in totals] == [str, str, str, float]  # the first key kept, as dicts do
    assert summing.all_ints([1, 2**70, -3])
    assert not summing.all_ints([1, True])
    assert not summing.all_ints([1, 1.0])
    assert summing.all_ints([])  # every value of none


# ------------------------------------------------------------------- map and reduce tasks


def _map_totals(
    tmp_path: Path, cls: str, chunks: list[bytes]
) -> tuple[dict[int, Counter[Any]], int]:
    """What a map task sends each partition, summed per key (the spool's batches decoded),
    and how many pairs it sent."""
    spec = MapSpec("j", 0, "a", 4, 64 * 1024, str(tmp_path), piece_bytes=20_000)
    result = run_map(_ref(tmp_path, cls), {}, [(f"in{i}", c) for i, c in enumerate(chunks)], spec)
    assert result.error == ""
    data = Path(result.spool).read_bytes()
    os.unlink(result.spool)
    totals: dict[int, Counter[Any]] = defaultdict(Counter)
    sent = 0
    unpacker = msgpack.Unpacker(raw=False, use_list=False)
    unpacker.feed(data)
    for p, _seq, n, body, spilled in unpacker:
        assert not spilled
        batch = wire.decode(body)
        assert isinstance(batch, wire.Batch)
        pairs = list(wire.iter_pairs(batch.pairs))
        assert len(pairs) == n
        sent += n
        for key, value in pairs:
            totals[p][key] += value
    return dict(totals), sent


@pytest.mark.parametrize("kind", ["", "Chunk", "Odd", "MixedKeys", "OwnPartition"])
def test_a_map_task_sends_the_totals_its_combine_would(tmp_path: Path, kind: str) -> None:
    text = _text()
    chunks = [text[: len(text) // 3], text[len(text) // 3 :]]
    chunks = [c[: c.rfind(b"\n")] if c.rfind(b"\n") > 0 else c for c in chunks]
    fast, fast_sent = _map_totals(tmp_path, f"Fast{kind}", chunks)
    slow, slow_sent = _map_totals(tmp_path, f"Slow{kind}", chunks)
    assert fast == slow
    assert fast_sent <= slow_sent  # one pair per key and task, or more when values vary


def test_a_map_task_past_combine_keys_sends_every_count(tmp_path: Path) -> None:
    from cmr.cpu.shuffle import COMBINE_KEYS

    words = [f"w{i}" for i in range(COMBINE_KEYS + 5_000)]
    text = "\n".join(" ".join(words[i : i + 50]) for i in range(0, len(words), 50)).encode()
    fast, sent = _map_totals(tmp_path, "FastChunk", [text, text])
    slow, _ = _map_totals(tmp_path, "SlowChunk", [text, text])
    assert fast == slow
    assert sum(sum(c.values()) for c in fast.values()) == 2 * len(words)
    assert sent > len(words)  # flushed once at least: a key may go twice


def test_a_total_past_64_bits_is_refused_as_calling_combine_refuses_it(tmp_path: Path) -> None:
    errors = []
    for cls in ("FastHuge", "SlowHuge"):
        spec = MapSpec("j", 0, "a", 4, 64 * 1024, str(tmp_path), piece_bytes=20_000)
        result = run_map(_ref(tmp_path, cls), {}, [("in", _text(lines=50))], spec)
        errors.append(result.error.replace(cls, "J"))
    assert errors[0] == errors[1]
    assert "J.map (or J.combine) yielded a value that is not wire data: " in errors[0]
    assert "outside the 64-bit range of wire ints" in errors[0]


def _values(seed: int, kinds: str) -> list[list[tuple[Any, Any]]]:
    """Three spools of pairs: keys of ``kinds``, int values (and some others with "odd")."""
    rnd = random.Random(seed)
    words = [f"k{rnd.randint(0, 9_999)}é" for _ in range(4_000)]
    groups: list[list[tuple[Any, Any]]] = []
    for _ in range(3):
        pairs: list[tuple[Any, Any]] = []
        for w in rnd.choices(words, k=6_000):
            key: Any = w
            if kinds == "int":
                key = int(w[1:-1])
            elif kinds == "bytes":
                key = w.encode()
            elif kinds == "mixed" and rnd.random() < 0.1:
                key = (w, 1)
            value: Any = rnd.randint(-5, 50)
            if kinds == "odd" and rnd.random() < 0.01:
                value = rnd.choice([True, 2.5, 2**40, False])
            pairs.append((key, value))
        groups.append(pairs)
    return groups


@pytest.mark.parametrize("kinds", ["str", "int", "bytes", "mixed", "odd"])
@pytest.mark.parametrize("memory", [64 << 20, REDUCE_MEMORY_MIN], ids=["in memory", "spilled"])
def test_a_reduce_task_writes_what_calling_reduce_writes(
    tmp_path: Path, kinds: str, memory: int
) -> None:
    groups = _values(7, kinds)
    outs = []
    for cls in ("Fast", "Slow"):
        spill = tmp_path / f"spill-{cls}"
        spill.mkdir()
        out = tmp_path / f"out-{cls}"
        spec = ReduceSpec("sums", str(out), memory, str(spill))
        result = run_reduce(_ref(tmp_path, cls), {}, spool_files(tmp_path, groups), spec)
        assert result.error == ""
        assert os.listdir(spill) == []
        outs.append((out.read_bytes(), result.records_out, result.digest))
    assert outs[0] == outs[1]
    lines = outs[0][0].decode().splitlines()
    assert len(lines) == len({k for g in groups for k, _ in g})


@pytest.mark.parametrize(
    ("kind", "keys"),
    [("", [b"\xffa", b"\xffb"]), ("Format", ["a", "b"])],
    ids=["bytes not UTF-8", "format not str"],
)
def test_a_pair_that_cannot_be_written_is_diagnosed_as_calling_reduce_diagnoses_it(
    tmp_path: Path, kind: str, keys: list[Any]
) -> None:
    errors = []
    for cls in (f"Fast{kind}", f"Slow{kind}"):
        spill = tmp_path / f"spill-{cls}"
        spill.mkdir()
        spec = ReduceSpec("sums", str(tmp_path / f"out-{cls}"), 1 << 20, str(spill))
        groups = [[(k, 1) for k in keys] * 3]
        result = run_reduce(_ref(tmp_path, cls), {}, spool_files(tmp_path, groups), spec)
        # The two reduce methods are on different lines of the job file.
        errors.append(re.sub(r"line \d+", "line N", result.error.replace(cls, "J")))
    assert errors[0] == errors[1]
    assert errors[0].startswith(("J.reduce yielded (b'\\xffa'", "J.format returned 5")), errors[0]


def _sent(tmp_path: Path, cls: str, chunks: list[bytes]) -> list[tuple[Any, Any]] | str:
    """The pairs a map task sends, in the order it sends them; or its error."""
    spec = MapSpec("j", 0, "a", 1, 64 * 1024, str(tmp_path))
    result = run_map(_ref(tmp_path, cls), {}, [(f"in{i}", c) for i, c in enumerate(chunks)], spec)
    if result.error:
        return result.error.replace(cls, "J")
    unpacker = msgpack.Unpacker(raw=False, use_list=False)
    unpacker.feed(Path(result.spool).read_bytes())
    os.unlink(result.spool)
    pairs: list[tuple[Any, Any]] = []
    for _p, _seq, _n, body, _spilled in unpacker:
        batch = wire.decode(body)
        assert isinstance(batch, wire.Batch)
        pairs += wire.iter_pairs(batch.pairs)
    return pairs


@pytest.mark.parametrize(
    "lines",
    [
        # An int, then a value of another kind under an equal key: the key that came first
        # is the one sent, and the ints before the float are added before it, as the
        # combine adds them.
        [b"(1, 5)\n(1.0, 2.5)"],
        [b"(True, 1)\n(1, 2.5)"],
        [b"('k', 1)\n('k', 1e16)\n('k', 1)"],
        [b"('a', 2)\n('b', 3)\n('a', True)\n('b', 4)\n('c', 1)"],
        # Two bad pairs: the one the combine's flush would meet first is named.
        [b"('a', {1})\n('b', 1180591620717411303424)"],
        [b"('b', 1180591620717411303424)\n('a', {1})"],
    ],
)
def test_ints_and_other_values_under_one_key_are_sent_as_the_combine_sends_them(
    tmp_path: Path, lines: list[bytes]
) -> None:
    fast, slow = _sent(tmp_path, "FastLiteral", lines), _sent(tmp_path, "SlowLiteral", lines)
    assert fast == slow
    if isinstance(fast, list) and isinstance(slow, list):
        assert [type(k) for k, _ in fast] == [type(k) for k, _ in slow]


def test_a_dict_of_counts_after_one_of_floats_is_combined_with_it(tmp_path: Path) -> None:
    # The second dict's values are no ints: the task goes on the general way, which
    # combines the key's two values, and sends one pair.
    chunks = [b"{'a': 1, 'b': 2}", b"{'a': 0.5}"]
    fast = _sent(tmp_path, "FastLiteralChunk", chunks)
    assert fast == _sent(tmp_path, "SlowLiteralChunk", chunks)
    assert sorted(fast) == [("a", 1.5), ("b", 2)]


@pytest.mark.parametrize("combine", [True, False], ids=["combine", "no combine"])
def test_a_reducers_total_past_64_bits_outlives_a_spill(tmp_path: Path, combine: bool) -> None:
    # Each value fits the wire, their sum does not; the budget is reached after it was
    # made: the totals handed to the general path (which spills) still add up to it.
    groups = [[("a", 2**63 - 1)] * 3 + [(f"key{i}", 1) for i in range(20_000)]]
    outs = []
    for cls in ("Fast", "Slow"):
        spill = tmp_path / f"spill-{cls}"
        spill.mkdir()
        out = tmp_path / f"out-{cls}"
        spec = ReduceSpec("sums", str(out), REDUCE_MEMORY_MIN, str(spill), combine=combine)
        result = run_reduce(_ref(tmp_path, cls), {}, spool_files(tmp_path, groups), spec)
        assert result.error == ""
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0].startswith(f"a\t{3 * (2**63 - 1)}\n".encode())


def test_a_format_set_on_the_instance_writes_the_lines(tmp_path: Path) -> None:
    groups = [[(3, 1), (1, 2), (3, 5)]]
    outs = []
    for cls in ("FastSetFormat", "SlowSetFormat"):
        spill = tmp_path / f"spill-{cls}"
        spill.mkdir()
        out = tmp_path / f"out-{cls}"
        spec = ReduceSpec("sums", str(out), 1 << 20, str(spill))
        assert run_reduce(_ref(tmp_path, cls), {}, spool_files(tmp_path, groups), spec).error == ""
        outs.append(out.read_bytes())
    assert outs == [b"1,2\n3,6\n"] * 2


def test_a_replaced_builtin_sum_is_called() -> None:
    import builtins

    plain: dict[str, Any] = {}
    exec("def reduce(k, v):\n    yield k, sum(v)\n", plain)
    real = builtins.sum
    builtins.sum = lambda values: 3  # type: ignore[assignment]
    try:
        assert not summing.is_sum(plain["reduce"])
    finally:
        builtins.sum = real
    assert summing.is_sum(plain["reduce"])


def test_totals_reaching_combine_keys_mid_dict_go_where_the_general_way_sends_them(
    tmp_path: Path,
) -> None:
    # A dict of counts crossing COMBINE_KEYS: the general way sends the first COMBINE_KEYS
    # keys and holds the rest; a later float under a held key is then added to its count
    # before anything is sent (not to a count sent already, which changes the float sum).
    from cmr.cpu.shuffle import COMBINE_KEYS

    first = "{" + ", ".join(f"'w{i}': 1" for i in range(COMBINE_KEYS + 1)) + "}"
    edge = f"w{COMBINE_KEYS}"
    chunks = [first.encode(), f"{{'{edge}': 1e16}}".encode(), f"{{'{edge}': -1e16}}".encode()]
    fast = _sent(tmp_path, "FastLiteralChunk", chunks)
    slow = _sent(tmp_path, "SlowLiteralChunk", chunks)
    assert isinstance(fast, list) and isinstance(slow, list)
    assert [p for p in fast if p[0] == edge] == [p for p in slow if p[0] == edge] == [(edge, 0.0)]
    assert fast == slow


@pytest.mark.parametrize(
    "chunks",
    [
        # Totals of 150,000 keys, then a dict that overlaps them and fills them mid-way (its
        # 50,000th new key), then one that overlaps the rest held and fills them again,
        # then one of fresh keys that fills them twice over (each sent at the key where
        # the general way sends it, the rest held), then keys sent already.
        ["w 0 150000 1", "w 100000 270000 2", "w 250000 460000 3", "w 460000 900000 4", "w 0 9 7"],
        # Equal keys of other kinds add to those held (1.0 to 1), and count as held.
        ["i 0 150000 1", "f 120000 260000 2\ni 260000 300000 5", "f 0 10 7"],
        # A dict that fills them exactly, then one that starts afresh.
        ["w 0 100000 1", "w 50000 150000 1\nw 150000 250000 1", "w 0 3 9"],
    ],
    ids=["str", "equal keys of other kinds", "exactly full"],
)
def test_dicts_crossing_combine_keys_send_what_the_general_way_sends(
    tmp_path: Path, chunks: list[str]
) -> None:
    fast = _sent(tmp_path, "FastRangeChunk", [c.encode() for c in chunks])
    slow = _sent(tmp_path, "SlowRangeChunk", [c.encode() for c in chunks])
    assert isinstance(fast, list) and isinstance(slow, list)
    assert [(type(k), k, v) for k, v in fast] == [(type(k), k, v) for k, v in slow]
    assert len(fast) > len({k for k, _ in fast})  # a key went twice: totals were sent
