"""The many-keys path (a word count of real text: hundreds of thousands of distinct words a
map task): the shuffle takes a task's pairs in one call (Shuffle.add_pairs), a map_chunk's
lone dict of counts goes to it ungrouped, a map task holds a key's first value alone, the
reducer of a combiner job sorts its pairs (combining only past its budget; many str or
bytes keys sorted in buckets of their first two characters), and the text lines of str
keys are made inline; a dict of counts that is not a task's last source (a split ending a
sliver into the next file) goes into the groups by C; the groups are flushed as runs of
the dict's own items around the keys that grew Values; the output loop groups held pairs
itself. Each must give exactly what the general path gives: the same
batches in the same spool, the same output bytes, the same diagnosis of a pair that cannot
go."""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cmr import wire
from cmr.cpu.instances import job_instance, job_step
from cmr.cpu.mapping import run_map
from cmr.cpu.reducing import run_reduce, write_output
from cmr.cpu.results import ReduceResult
from cmr.cpu.runs import BUCKET_SORT_MIN, _many_prefixes, sort_pairs
from cmr.cpu.shuffle import COMBINE_KEYS, Combiner, Shuffle, Values, partitioner
from cmr.cpu.specs import REDUCE_MEMORY_MIN, MapSpec, ReduceSpec
from cmr.job import Job, JobRef
from cmr.partition import StablePartitioner, stable_partition

from .spooling import spool_files

JOBS = """
from collections import Counter

import cmr


class Items(cmr.Job):
    reducers = 4

    def map_chunk(self, name, data):
        return Counter(data.decode("utf-8", "replace").split()).items()

    def combine(self, word, counts):
        self.increment_counter("test", "combined")
        yield word, sum(counts)

    def reduce(self, word, counts):
        yield word, sum(counts)


class Listed(Items):
    # The same pairs as a list: the general path (grouped in a dict, then combined).
    def map_chunk(self, name, data):
        return list(super().map_chunk(name, data))


class Mod3(Items):
    def partition(self, key, n):
        return len(str(key)) % 3 % n


class Distinct(Items):
    # A combiner that does not shrink: each distinct value stays.
    def combine(self, word, values):
        for v in sorted(set(values)):
            yield word, v

    def reduce(self, word, values):
        yield word, len(set(values))


class Odd(Items):
    # Pairs Job.format writes for the output loop (bool, float, int keys) between lines
    # it makes itself, and a key with no line at all.
    def reduce(self, word, counts):
        values = list(counts)
        if word.startswith("a"):
            return
        yield word, sum(values)
        if len(values) > 1:
            yield word, len(values) > 2
            yield len(values), word
            yield word, 0.5
"""

BAD = """
import cmr


class Bad(cmr.Job):
    def map_chunk(self, name, data):
        return {PAIRS}

    def combine(self, word, counts):
        yield word, sum(counts)

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


def _ref(tmp_path: Path, cls: str, code: str = JOBS, name: str = "jobs.py") -> JobRef:
    path = tmp_path / name
    if not path.exists():
        path.write_text(code)
    return JobRef.parse(f"{path}:{cls}")


def _words(n: int, seed: int = 5) -> list[str]:
    """Word-like keys, some of them not ASCII."""
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzäöüßé中文ありがとう"
    return ["".join(rnd.choices(letters, k=rnd.randint(1, 12))) for _ in range(n)]


def _distinct_words(n: int, seed: int = 5) -> list[str]:
    """n distinct word-like keys, some of them not ASCII."""
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzäöüßé中文ありがとう"
    words: dict[str, None] = {}
    while len(words) < n:
        words["".join(rnd.choices(letters, k=rnd.randint(1, 12)))] = None
    return list(words)


# ------------------------------------------------------------------------- the shuffle


@pytest.mark.parametrize("compress", [True, False], ids=["zstd bodies", "plain bodies"])
@pytest.mark.parametrize("job", ["Items", "Mod3"], ids=["stable partition", "own partition"])
def test_add_pairs_writes_the_batches_add_writes(tmp_path: Path, compress: bool, job: str) -> None:
    # Small messages: many batches, bodies split in halves, pairs spilled on their own.
    pairs: list[tuple[Any, Any]] = [(w, i) for i, w in enumerate(_words(40_000))]
    pairs += [(7, "int key"), (b"bytes key", 1.5), ("big", "x" * 9_000), (("t", 1), None)]
    random.Random(1).shuffle(pairs)
    spec = MapSpec("j", 0, "a", 5, 16 * 1024, str(tmp_path), compress=compress)
    inst = job_instance("many-keys", _ref(tmp_path, job), {})
    part = partitioner(inst, spec.partitions)
    one, many = io.BytesIO(), io.BytesIO()
    by_pair, at_once = Shuffle(spec, one), Shuffle(spec, many)
    for key, value in pairs:
        by_pair.add(part(key, spec.partitions), key, value)
    at_once.add_pairs(iter(pairs), part)
    by_pair.close()
    at_once.close()
    assert many.getvalue() == one.getvalue()
    assert (at_once.batches, at_once.records) == (by_pair.batches, by_pair.records)
    assert sum(at_once.records) == len(pairs)


def test_add_pairs_names_the_pair_that_cannot_go(tmp_path: Path) -> None:
    spec = MapSpec("j", 0, "a", 3, 256 * 1024, str(tmp_path))
    shuffle = Shuffle(spec, io.BytesIO())
    pairs = [("a", 1), ("b", 2), ("c", {1, 2}), ("d", 4)]
    with pytest.raises(TypeError):
        shuffle.add_pairs(pairs, StablePartitioner())
    assert shuffle.last_pair == ("c", {1, 2})


def test_stable_partitions_of_many_keys_are_each_keys(tmp_path: Path) -> None:
    keys = [*_words(5_000), "lone\udcff", b"b", 3, -4, ("t", 1), 2.5, None]
    for n in (1, 2, 4, 7, 64):
        assert [StablePartitioner()(k, n) for k in keys] == [stable_partition(k, n) for k in keys]


# --------------------------------------------------------------------------- map tasks


def _spool(tmp_path: Path, ref: JobRef, chunks: list[bytes], piece: int) -> tuple[bytes, Any]:
    spec = MapSpec("j", 0, "a", 4, 64 * 1024, str(tmp_path), piece_bytes=piece)
    given: list[tuple[str, Any]] = [(f"in{i}", c) for i, c in enumerate(chunks)]
    result = run_map(ref, {}, given, spec)
    assert result.error == ""
    data = Path(result.spool).read_bytes()
    os.unlink(result.spool)
    return data, result


@pytest.mark.parametrize(
    "shape",
    ["one piece", "one piece past COMBINE_KEYS", "several pieces", "several files"],
)
def test_a_dict_of_counts_gives_the_spool_grouping_gives(tmp_path: Path, shape: str) -> None:
    rnd = random.Random(3)
    words = _words(250_000 if "COMBINE_KEYS" in shape else 20_000)
    text = "\n".join(" ".join(rnd.choices(words, k=8)) for _ in range(40_000)).encode()
    if "COMBINE_KEYS" in shape:  # every word once at least: past the keys a task holds
        text += ("\n" + " ".join(words)).encode()
    chunks = [text[i : i + 50_000] for i in range(0, len(text), 50_000)]
    chunks = [c for c in chunks if c]
    if shape != "several files":
        chunks = [text]
    piece = 100_000 if shape == "several pieces" else 64 << 20
    items, ran = _spool(tmp_path, _ref(tmp_path, "Items"), chunks, piece)
    listed, _ = _spool(tmp_path, _ref(tmp_path, "Listed"), chunks, piece)
    assert items == listed
    want = Counter(text.decode("utf-8", "replace").split())
    assert sum(ran.records) >= len(want)
    if shape.startswith("one piece"):  # its keys are distinct: nothing to combine
        assert sum(ran.records) == len(want)
        assert ran.counters == {}


def _sent(spool: bytes) -> list[tuple[Any, Any]]:
    """The pairs a map task's spool holds, in order."""
    pairs: list[tuple[Any, Any]] = []
    for _, _, _, body, spilled in msgpack.Unpacker(io.BytesIO(spool), raw=False):
        assert not spilled
        batch = wire.decode(body)
        assert isinstance(batch, wire.Batch)
        pairs += wire.iter_pairs(batch.pairs)
    return pairs


def test_a_split_that_ends_a_sliver_into_the_next_file(tmp_path: Path) -> None:
    # A plan's split may take the first bytes of the next file: the dict of the big file's
    # counts is not the task's only source, so it is grouped with the sliver's, as the
    # general path groups them: each word is sent once, as many pairs as distinct words.
    rnd = random.Random(6)
    words = _words(5_000)
    big = "\n".join(" ".join(rnd.choices(words, k=9)) for _ in range(20_000)).encode()
    sliver = f"{words[0]} {words[1]} unseen\n".encode()
    spool, _ = _spool(tmp_path, _ref(tmp_path, "Items"), [big, sliver], 64 << 20)
    grouped, _ = _spool(tmp_path, _ref(tmp_path, "Listed"), [big, sliver], 64 << 20)
    sent, want = _sent(spool), Counter((big + b"\n" + sliver).decode().split())
    assert len(sent) == len(want) == len(_sent(grouped))
    assert Counter(dict(sent)) == want
    assert sorted(sent) == sorted(_sent(grouped))


def test_a_map_task_combines_as_a_dict_of_lists_would(tmp_path: Path) -> None:
    # The spool of many small files, against the plain algorithm: every key's values in a
    # list, in arrival order, combined when the task ends; then sent pair by pair.
    rnd = random.Random(4)
    words = _words(3_000)
    files = [" ".join(rnd.choices(words, k=rnd.randint(1, 400))).encode() for _ in range(300)]
    ref = _ref(tmp_path, "Items")
    got, _ = _spool(tmp_path, ref, files, 64 << 20)
    inst = job_instance("many-keys", ref, {}).for_task()
    step, _ = job_step(inst, 0)
    assert step.map_chunk is not None and step.combine is not None
    groups: dict[Any, list[Any]] = {}
    for i, data in enumerate(files):
        for key, value in step.map_chunk(f"in{i}", data):
            groups.setdefault(key, []).append(value)
    want = io.BytesIO()
    spec = MapSpec("j", 0, "a", 4, 64 * 1024, str(tmp_path))
    shuffle = Shuffle(spec, want)
    for key, values in groups.items():
        for k, v in step.combine(key, iter(values)) if len(values) > 1 else [(key, values[0])]:
            shuffle.add(stable_partition(k, 4), k, v)
    shuffle.close()
    assert got == want.getvalue()


@pytest.mark.parametrize("pairs", ["{'a': 1, 'b': {1, 2}}", "{'a': 1, 'b': 2**70}"])
def test_a_bad_value_in_a_dict_of_counts_is_named_as_before(tmp_path: Path, pairs: str) -> None:
    (tmp_path / "items").mkdir()
    (tmp_path / "listed").mkdir()
    items = _ref(tmp_path / "items", "Bad", BAD.replace("{PAIRS}", f"{pairs}.items()"))
    listed = _ref(tmp_path / "listed", "Bad", BAD.replace("{PAIRS}", f"list({pairs}.items())"))
    spec = MapSpec("j", 0, "a", 4, 64 * 1024, str(tmp_path), piece_bytes=1 << 20)
    errors = [run_map(ref, {}, [("in", b"x")], spec).error for ref in (items, listed)]
    assert errors[0].startswith("Bad.map_chunk (or Bad.combine) yielded"), errors[0]
    assert errors[0] == errors[1]


# ------------------------------------------------------------------------------ reduce


def _reduce(
    tmp_path: Path, cls: str, groups: list[list[tuple[Any, Any]]], memory: int
) -> tuple[ReduceResult, list[str]]:
    spill = tmp_path / f"spill-{cls}-{memory}"
    spill.mkdir()
    out = tmp_path / f"out-{cls}-{memory}"
    spec = ReduceSpec("many-keys", str(out), memory, str(spill))
    result = run_reduce(_ref(tmp_path, cls), {}, spool_files(tmp_path, groups), spec)
    assert os.listdir(spill) == []  # runs removed however the task ended
    assert result.error == ""
    return result, out.read_text().splitlines()


def test_a_combiner_jobs_reducer_sorts_keys_of_few_values(tmp_path: Path) -> None:
    words = _words(30_000)
    groups = [[(w, i % 7 + 1) for i, w in enumerate(words[k::3])] for k in range(3)]
    groups += [[(w, 1) for w in words[::5]]]
    want: Counter[str] = Counter()
    for g in groups:
        for w, n in g:
            want[w] += n
    result, lines = _reduce(tmp_path, "Items", groups, 64 << 20)
    assert lines == [f"{w}\t{want[w]}" for w in sorted(want)]
    assert result.counters == {}  # a key of few values is never combined at reduce


def test_keys_of_many_values_are_sorted_uncombined_while_they_fit(tmp_path: Path) -> None:
    # 400 values a key, well within the budget: sorted as pairs, combine never called.
    groups = [[(f"w{i % 50}", 1) for i in range(20_000)]]
    result, lines = _reduce(tmp_path, "Items", groups, 64 << 20)
    assert lines == [f"w{i}\t400" for i in sorted(range(50), key=str)]
    assert result.counters == {}


@pytest.mark.parametrize("kind", [str, bytes])
def test_many_pairs_sort_as_one_stable_sort_would(kind: type) -> None:
    # Past BUCKET_SORT_MIN the keys are sorted in buckets of their first two characters:
    # the same order as one stable sort, keys of 0, 1 and 2 characters and prefixes of
    # one another included, each key's values in arrival order.
    rnd = random.Random(8)
    text = [*_words(30_000), "", "a", "ab", "abc", "b", "\udcff", "\udcffx", "\x00", "é", "中"]
    words: list[Any] = text
    if kind is bytes:
        words = [w.encode("utf-8", "surrogatepass") for w in text]
    pairs: list[tuple[Any, Any]] = [(rnd.choice(words), i) for i in range(BUCKET_SORT_MIN + 5_000)]
    pairs += [(w, -1) for w in words]  # every key at least once
    want = sorted(pairs, key=lambda kv: kv[0])
    assert sort_pairs(list(pairs)) == want
    small = pairs[:1_000]
    assert sort_pairs(list(small)) == sorted(small, key=lambda kv: kv[0])


def test_keys_of_a_large_alphabet_sort_as_one_stable_sort_would() -> None:
    # Words of 3,000 CJK characters have nearly as many two-character prefixes as keys: one
    # sort, not a bucket of a few pairs each (sort_pairs samples the prefixes first).
    rnd = random.Random(9)
    keys = [
        "".join(chr(0x4E00 + rnd.randrange(3_000)) for _ in range(rnd.randint(1, 4)))
        for _ in range(20_000)
    ]
    pairs: list[tuple[Any, Any]] = [(rnd.choice(keys), i) for i in range(BUCKET_SORT_MIN + 5_000)]
    assert _many_prefixes(pairs)
    assert sort_pairs(list(pairs)) == sorted(pairs, key=lambda kv: kv[0])
    latin = [(k.encode("unicode_escape").decode()[:4] + k, v) for k, v in pairs]
    assert not _many_prefixes(latin)  # "\\u4e.." keys: a handful of prefixes, bucketed
    assert sort_pairs(list(latin)) == sorted(latin, key=lambda kv: kv[0])


def test_past_its_budget_a_reducer_combines_before_it_spills(tmp_path: Path) -> None:
    # One key's 60,000 values pass the smallest budget many times over: combined in
    # memory whenever the held pairs reach it, with no run spilled.
    groups = [[("hot", 1)] * 30_000 + [(f"k{i}", 1) for i in range(100)], [("hot", 2)] * 30_000]
    result, lines = _reduce(tmp_path, "Items", groups, REDUCE_MEMORY_MIN)
    assert lines == ["hot\t90000", *sorted(f"k{i}\t1" for i in range(100))]
    assert result.spills == 0


def test_past_its_budget_a_combiner_that_does_not_shrink_spills(tmp_path: Path) -> None:
    groups = [[(f"k{i % 3}", i) for i in range(30_000)], [(f"k{i % 3}", -i) for i in range(9)]]
    result, lines = _reduce(tmp_path, "Distinct", groups, REDUCE_MEMORY_MIN)
    assert lines == ["k0\t10002", "k1\t10003", "k2\t10003"]  # 0 is in both spools
    assert result.spills > 0


class Level(enum.IntEnum):
    HIGH = 3


class Word(str):
    pass


def test_text_lines_are_what_format_makes(tmp_path: Path) -> None:
    pairs: list[tuple[Any, Any]] = [
        ("a", 1), ("b", -2**63), ("c", 10**30), ("d", "text value"), ("e", True),
        ("f", None), ("g", 2.5), ("h", b"bytes"), ("i", ("t", 1)), ("j", Level.HIGH),
        (Word("k"), 1), (3, 4), (b"l", 5), ("m\tn", "o\np"), ("", ""), ("ä中", 0),
    ]  # fmt: skip
    keyed = ((k, iter([v])) for k, v in pairs)
    inst = job_instance("many-keys", _ref(tmp_path, "Items"), {}).for_task()
    step, name = job_step(inst, 0)
    out = io.BytesIO()
    result = ReduceResult()

    def passed(key: Any, values: Any) -> Any:
        for v in values:
            yield key, v

    write_output(inst, keyed, out, result, "text", dataclasses.replace(step, reduce=passed), name)
    want = b"".join(Job.format(inst, k, v).encode() + b"\n" for k, v in pairs)
    assert out.getvalue() == want
    assert result.records_out == len(pairs)


def test_a_key_that_text_cannot_hold_is_named_where_reduce_yielded_it(tmp_path: Path) -> None:
    job = tmp_path / "sur.py"
    job.write_text(
        "import cmr\n\n\nclass J(cmr.Job):\n    def map(self, key, line):\n        yield line, 1\n"
        "\n    def reduce(self, key, values):\n        yield key + '\\udcff', sum(values)\n"
    )
    spill = tmp_path / "spill"
    spill.mkdir()
    spools = spool_files(tmp_path, [[("a", 1), ("b", 2)]])
    spec = ReduceSpec("sur", str(tmp_path / "out"), 1 << 20, str(spill))
    result = run_reduce(JobRef.parse(str(job)), {}, spools, spec)
    assert result.error.startswith(
        f"J.reduce yielded ('a\\udcff' (a str), 1 (an int)), at {job} line 9, which "
        "Job.format cannot write faithfully"
    ), result.error


# ------------------------------------------- a dict of counts before a sliver; flushing


@pytest.mark.parametrize(
    "distinct",
    [5_000, COMBINE_KEYS, COMBINE_KEYS + 30_000],
    ids=["fewer than a flush", "one flush exactly", "a flush and more"],
)
def test_a_dict_of_counts_before_a_sliver_gives_the_pair_by_pair_spool(
    tmp_path: Path, distinct: int
) -> None:
    rnd = random.Random(2)
    words = _distinct_words(distinct)
    big = " ".join(words) + "\n" + " ".join(rnd.choices(words, k=20_000))
    # The sliver repeats words of both sides of a flush, and brings new ones.
    sliver = f"{words[0]} {words[-1]} {words[distinct // 2]} unseen {words[-1]}\n"
    chunks = [big.encode(), sliver.encode()]
    items, ran = _spool(tmp_path, _ref(tmp_path, "Items"), chunks, 64 << 20)
    listed, by_pair = _spool(tmp_path, _ref(tmp_path, "Listed"), chunks, 64 << 20)
    assert items == listed
    assert (ran.batches, ran.records, ran.counters) == (
        by_pair.batches,
        by_pair.records,
        by_pair.counters,
    )
    # A word of the sliver whose first value was flushed is sent again; one still held is
    # combined with it; "unseen" is one more.
    flushed = distinct // COMBINE_KEYS * COMBINE_KEYS
    resent = sum(1 for i in {0, distinct - 1, distinct // 2} if i < flushed)
    assert sum(ran.records) == distinct + resent + 1


def _pair_by_pair(combiner: Combiner, groups: dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """What flushing the groups yields, key by key (the algorithm flushed() must match)."""
    for key, values in groups.items():
        if type(values) is not Values:
            yield key, values
        elif len(values) == 1:
            yield key, values[0]
        else:
            yield from combiner.pairs(key, values)


def test_flushed_groups_are_the_pairs_key_by_key_in_order() -> None:
    calls: list[Any] = []

    def combine(key: Any, values: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        got = list(values)
        calls.append(key)
        if key == "none":
            return  # a combine that yields nothing
        yield key, sum(got)
        if key == "two":
            yield f"{key}-more", len(got)

    combiner = Combiner(combine, "J.combine")
    groups: dict[Any, Any] = {
        "first": Values((1, 2)),
        "a": 1,
        "b": 2,
        "one": Values((7,)),
        "two": Values((1, 1, 1)),
        "none": Values(()),
        "c": 3,
        "last": Values((4, 5)),
    }
    want = list(_pair_by_pair(combiner, groups))
    calls.clear()
    assert list(combiner.flushed(groups)) == want
    assert calls == ["first", "two", "none", "last"]
    assert list(combiner.flushed({"x": 1, "y": (2,)})) == [("x", 1), ("y", (2,))]
    assert list(combiner.flushed({})) == []


def test_flushed_groups_call_combine_only_as_far_as_they_are_taken() -> None:
    calls: list[Any] = []

    def combine(key: Any, values: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        calls.append(key)
        yield key, sum(values)

    combiner = Combiner(combine, "J.combine")
    groups: dict[Any, Any] = {"a": 1, "b": Values((1, 2)), "c": 3, "d": Values((3, 4))}
    pairs = combiner.flushed(groups)
    assert [next(pairs), next(pairs)] == [("a", 1), ("b", 3)]
    assert calls == ["b"]  # a pair that fails to go stops the flush before d's combine


# ------------------------------------------------------------------------- the shuffle


def test_a_key_with_a_lone_surrogate_fails_as_add_fails(tmp_path: Path) -> None:
    spec = MapSpec("j", 0, "a", 4, 256 * 1024, str(tmp_path))
    key = "lone\udcff"
    with pytest.raises(UnicodeEncodeError) as by_pair:
        Shuffle(spec, io.BytesIO()).add(stable_partition(key, 4), key, 1)
    shuffle = Shuffle(spec, io.BytesIO())
    with pytest.raises(UnicodeEncodeError) as at_once:
        shuffle.add_pairs([("ok", 1), (key, 1)], StablePartitioner())
    assert type(at_once.value) is type(by_pair.value)
    assert str(at_once.value) == str(by_pair.value)
    assert shuffle.last_pair == (key, 1)


# ------------------------------------------------------------------------------ reduce


def test_the_output_loop_groups_held_pairs_as_keyed_groups_would(tmp_path: Path) -> None:
    rnd = random.Random(4)
    words = _distinct_words(3_000)
    groups = [[(w, rnd.randint(1, 3)) for w in rnd.sample(words, 1_500)] for _ in range(3)]
    by_key: dict[str, list[int]] = {}
    for g in groups:
        for w, n in g:
            by_key.setdefault(w, []).append(n)
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out"
    spec = ReduceSpec("odd", str(out), 64 << 20, str(spill))
    result = run_reduce(_ref(tmp_path, "Odd"), {}, spool_files(tmp_path, groups), spec)
    assert result.error == ""
    job = Job()
    want: list[str] = []
    for w in sorted(by_key):
        values = by_key[w]
        if w.startswith("a"):
            continue
        want.append(job.format(w, sum(values)))
        if len(values) > 1:
            want += [job.format(w, len(values) > 2), job.format(len(values), w)]
            want.append(job.format(w, 0.5))
    assert out.read_text().splitlines() == want
    assert result.records_out == len(want)
