"""Sorting (issue 14): values reaching reduce sorted (``sort_values``, ``value_order``), in
memory and merged from spilled runs; total order (keys sampled at submit, cut points in the
plan, the range partitioner): the parts read in order are one sorted sequence; forged cut
points refused; what cannot work refused at submit with one line."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cmr import wire
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobCodeError, JobFailed, UsageError, WireError
from cmr.partition import MAX_CUT_BYTES, RangePartitioner
from cmr.plan import Plan
from cmr.sampling import SAMPLE_BYTES, SAMPLE_RANGES, choose_cuts, sample_ranges
from cmr.settings import AwsSettings, WorkerSettings
from cmr.usercode import UserCodeError, sort_key
from cmr.wire import Range

# Values of mixed types, in their natural order (the documented key order).
MIXED: list[Any] = [
    -3,
    0.5,
    2,
    10**12,
    "",
    "B",
    "a",
    b"\x00",
    b"z",
    (1,),
    (1, "a"),
    ("a",),
    False,
    True,
    None,
]


def _job(tmp_path: Path, body: str, name: str = "j.py") -> str:
    path = tmp_path / name
    path.write_text("import cmr\n\n" + textwrap.dedent(body))
    return str(path)


def _lines(tmp_path: Path, n: int, name: str = "in.txt") -> str:
    src = tmp_path / name
    src.write_text("".join(f"{i}\n" for i in range(n)))
    return str(src)


def _parts(result: Any) -> list[list[Any]]:
    """The keys of each part, in order (the jobs below write repr(key) per line)."""
    return [
        [ast.literal_eval(line.split("\t")[0]) for line in Path(p).read_text().splitlines()]
        for p in result.parts
    ]


SECONDARY = """
MIXED = {values!r}

class Secondary(cmr.Job):
    sort_values = True
    {order}

    def map(self, k, line):
        i = int(line)
        # key 0 holds most values (more than a run holds when spilling): sorted on disk
        key = 0 if i % 4 else i % 7
        yield key, MIXED[(i * 7919) % len(MIXED)] if key == 1 and {mixed} else (i * 7919) % 100003

    def reduce(self, k, vs):
        yield k, list(vs)

    def format(self, k, v):
        return repr(k) + "\\t" + repr(v)
"""


def _values(result: Any) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for p in result.parts:
        for line in Path(p).read_text().splitlines():
            k, v = line.split("\t")
            out[ast.literal_eval(k)] = list(ast.literal_eval(v))
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("spill", [False, True], ids=["in memory", "spilled and merged"])
@pytest.mark.parametrize("order", ["natural", "value_order"])
async def test_values_reach_reduce_sorted(
    embedded: Backend, tmp_path: Path, spill: bool, order: str
) -> None:
    method = "def value_order(self, v):\n        return -v" if order == "value_order" else ""
    # Key 1's values are of mixed types in natural order (value_order here takes numbers).
    natural = order == "natural"
    job = _job(tmp_path, SECONDARY.format(values=MIXED, mixed=natural, order=method))
    n = 40_000 if spill else 4_000
    settings = WorkerSettings(memory_mb=0) if spill else None  # 64 KiB: many runs
    result = await run_on(
        embedded, job, _lines(tmp_path, n), str(tmp_path / "out"), reducers=3,
        worker_settings=settings, split_bytes=20_000,
    )  # fmt: skip
    if spill:
        assert result.record["reduce_spills"] > 3
    got = _values(result)
    expected: dict[Any, list[Any]] = {}
    for i in range(n):
        key = 0 if i % 4 else i % 7
        value: Any = (i * 7919) % 100003
        if key == 1 and natural:
            value = MIXED[(i * 7919) % len(MIXED)]
        expected.setdefault(key, []).append(value)
    assert got.keys() == expected.keys()
    for k, vs in expected.items():
        want = sorted(vs, key=(lambda v: -v) if order == "value_order" else sort_key)
        assert got[k] == want, k
    assert len(got[0]) > n // 2  # the hot key: more values than one run holds when spilling


@pytest.mark.parametrize("spill", [False, True], ids=["in memory", "spilled and merged"])
@pytest.mark.parametrize(
    ("order", "said"),
    [
        ("raise ValueError('bad value')", "J.value_order raised ValueError: bad value"),
        ("return v if v % 2 else str(v)", "J.value_order returned sort keys that cannot be"),
    ],
    ids=["raises", "incomparable"],
)
async def test_value_order_mistakes_are_named(
    embedded: Backend, tmp_path: Path, spill: bool, order: str, said: str
) -> None:
    job = _job(
        tmp_path,
        f"""
        class J(cmr.Job):
            sort_values = True

            def value_order(self, v):
                {order}

            def map(self, k, line):
                yield "k", int(line)

            def reduce(self, k, vs):
                yield k, sum(vs)
        """,
    )
    settings = WorkerSettings(memory_mb=0) if spill else None
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded, job, _lines(tmp_path, 20_000 if spill else 100), str(tmp_path / "out"),
            reducers=1, worker_settings=settings, max_task_failures=1,
        )  # fmt: skip
    assert said in info.value.reason.splitlines()[0], info.value.reason
    assert "cmr/cpu/" not in info.value.reason  # the user's frames only


TOTAL = """
KEYS = {keys!r}

class Total(cmr.Job):
    total_order = {flag}
    reducers = {reducers}

    def map(self, k, line):
        i = int(line)
        yield KEYS[(i * 7919) % len(KEYS)], 1

    def reduce(self, k, vs):
        yield k, sum(vs)

    def format(self, k, v):
        return repr(k) + "\\t" + str(v)
"""

KINDS: dict[str, list[Any]] = {
    "str": [f"w{i}" for i in range(3000)] + ["", "Z", "é", "\U0001f600"],
    "int": [i * i - 5000 for i in range(-1500, 1500)] + [-(2**63), 2**64 - 1],
    "bytes": [bytes([i % 251, i // 251]) for i in range(3000)] + [b"", b"\xff" * 3],
    "tuple": [(i % 13, f"x{i}", (i % 3,)) for i in range(3000)] + [(), ("a",), (1.5,)],
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", KINDS)
async def test_total_order_parts_concatenate_sorted(
    embedded: Backend, tmp_path: Path, kind: str
) -> None:
    keys = KINDS[kind]
    job = _job(tmp_path, TOTAL.format(keys=keys, flag=True, reducers=5))
    n = 30_000
    result = await run_on(
        embedded, job, _lines(tmp_path, n), str(tmp_path / "out"), split_bytes=16_000,
        workers=2,
    )  # fmt: skip
    parts = _parts(result)
    assert len(parts) == 5
    assert all(parts), [len(p) for p in parts]  # every part holds keys
    used = {keys[(i * 7919) % len(keys)] for i in range(n)}
    assert [k for p in parts for k in p] == sorted(used, key=sort_key)
    # Balanced, roughly: no part holds more than twice its share.
    assert max(len(p) for p in parts) < 2 * len(used) / 5


async def test_total_order_from_the_submission_and_skewed_keys(
    embedded: Backend, tmp_path: Path
) -> None:
    # Nine lines in ten have one key: the cut points are still distinct keys, every part
    # gets some, and the hot key lies whole in one part.
    keys = ["hot"] * 90 + [f"k{i:03d}" for i in range(10)]
    job = _job(tmp_path, TOTAL.format(keys=keys, flag=False, reducers=4))
    n = 20_000
    result = await run_on(
        embedded, job, _lines(tmp_path, n), str(tmp_path / "out"), total_order=True,
        split_bytes=10_000,
    )  # fmt: skip
    parts = _parts(result)
    assert all(parts)
    assert [k for p in parts for k in p] == sorted(set(keys), key=sort_key)


async def test_total_order_one_key_and_empty_input(embedded: Backend, tmp_path: Path) -> None:
    job = _job(tmp_path, TOTAL.format(keys=["only"], flag=True, reducers=3))
    one = await run_on(embedded, job, _lines(tmp_path, 500), str(tmp_path / "one"))
    assert _parts(one) == [["only"], [], []]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    none = await run_on(embedded, job, str(empty), str(tmp_path / "none"))
    assert _parts(none) == [[], [], []]


async def test_total_order_refuses_a_custom_partition(embedded: Backend, tmp_path: Path) -> None:
    body = """
    class Mine(cmr.Job):
        {flag}
        def map(self, k, line):
            yield line, 1
        def reduce(self, k, vs):
            yield k, 1
        def partition(self, key, n):
            return 0
    """
    src = _lines(tmp_path, 10)
    own = _job(tmp_path, body.format(flag="total_order = True"), "own.py")
    with pytest.raises(UsageError, match=r"Mine defines partition\(\) and asks for total order"):
        await run_on(embedded, own, src, str(tmp_path / "a"))
    asked = _job(tmp_path, body.format(flag=""), "asked.py")
    with pytest.raises(UsageError, match="--total-order"):
        await run_on(embedded, asked, src, str(tmp_path / "b"), total_order=True)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    flags = _job(tmp_path, body.format(flag="sort_values = 1"), "flags.py")
    with pytest.raises(JobCodeError, match=r"Mine.sort_values is 1: it must be True or False"):
        await run_on(embedded, flags, src, str(tmp_path / "c"))


async def test_sampling_reports_the_maps_error_at_submit(embedded: Backend, tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        """
        class Boom(cmr.Job):
            total_order = True
            def map(self, k, line):
                if line == "7":
                    raise ValueError("no sevens")
                yield line, 1
            def reduce(self, k, vs):
                yield k, 1
        """,
    )
    with pytest.raises(UserCodeError) as info:
        await run_on(embedded, job, _lines(tmp_path, 10), str(tmp_path / "out"))
    first = str(info.value).splitlines()[0]
    assert first == (
        "sampling the input's keys for total order (at submit): Boom.map raised ValueError: "
        "no sevens"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_total_order_and_its_one_error_line(tmp_path: Path) -> None:
    job = _job(tmp_path, TOTAL.format(keys=list(range(100)), flag=False, reducers=1))
    src = _lines(tmp_path, 1000)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "cmr", "run", job, "-i", src, "--total-order", "--reducers"]
    ok = subprocess.run(
        [*cmd, "3", "-o", str(tmp_path / "out")], check=False, env=env, capture_output=True
    )
    assert ok.returncode == 0, ok.stderr
    parts = sorted((tmp_path / "out").glob("part-*"))
    keys = [int(line.split("\t")[0]) for p in parts for line in p.read_text().splitlines()]
    assert keys == list(range(100)) and all(p.stat().st_size for p in parts)
    bad = _job(tmp_path, "class B(cmr.Job):\n    def map(self, k, line):\n        yield 1\n"
               "    def reduce(self, k, vs):\n        yield k, 1\n", "bad.py")  # fmt: skip
    cmd[4] = bad
    failed = subprocess.run(
        [*cmd, "2", "-o", str(tmp_path / "o2")], check=False, env=env, capture_output=True
    )
    assert failed.returncode == 1
    errors = [line for line in failed.stderr.decode().splitlines() if "error" in line]
    assert len(errors) == 1, failed.stderr
    assert errors[0].startswith("error: sampling the input's keys for total order")
    assert "B.map yielded 1" in errors[0]


# --- the pieces ---------------------------------------------------------------------------


def test_range_partitioner_follows_sort_key() -> None:
    given: tuple[Any, ...] = ("", 5, (1,), 2.5, b"a", "m")  # not sorted: sort them
    cuts = tuple(sorted(given, key=sort_key))
    part = RangePartitioner(cuts)
    probes = [*MIXED, *cuts, -(10**30), "zz", b"", (0,), (1, 2), float("nan")]
    for key in probes:
        p = part(key, len(cuts) + 1)
        below = [c for c in cuts if sort_key(c) <= sort_key(key)]
        assert p == len(below), key
    strs = RangePartitioner(("b", "d"))
    assert [strs(k, 3) for k in ("a", "b", "c", "d", "e", 1, b"a", None)] == [
        0,
        1,
        1,
        2,
        2,
        0,
        2,
        2,
    ]
    assert RangePartitioner(())("anything", 4) == 0


def test_choose_cuts() -> None:
    assert choose_cuts([], 4) == ()
    assert choose_cuts(["a", "b"], 1) == ()
    assert choose_cuts(["x"] * 50, 4) == ()  # one distinct key: all in part 0
    assert choose_cuts(["c", "a", "b", "a"], 8) == ("b", "c")  # fewer distinct than parts
    even = choose_cuts(list(range(1000)), 4)
    assert even == (250, 500, 750)
    skewed = choose_cuts([5] * 900 + list(range(100)), 4)  # 5 is 90% of the sample
    assert len(skewed) == 3 and sorted(skewed) == list(skewed) and skewed[0] > 0


def test_sample_is_bounded_and_spread() -> None:
    small = [(Range("file:///a", 0, 1000, "a"),), (Range("file:///b", 0, 10, "b"),)]
    assert sample_ranges(small) == [r for t in small for r in t]  # all of a small input
    big = [(Range(f"file:///f{i}", 0, 10**9, f"f{i}"),) for i in range(10)]
    picked = sample_ranges(big)
    assert sum(r.end - r.start for r in picked) <= SAMPLE_RANGES * SAMPLE_BYTES
    assert {r.url for r in picked} == {f"file:///f{i}" for i in range(10)}
    tiny = [(Range(f"file:///t{i}", 0, 100, "t"),) for i in range(100_000)]  # 10 MB of files
    picked = sample_ranges(tiny)
    assert sum(r.end - r.start for r in picked) > SAMPLE_RANGES * SAMPLE_BYTES * 0.9
    assert sum(r.end - r.start for r in picked) <= SAMPLE_RANGES * SAMPLE_BYTES


def _forged(cuts: list[Any]) -> bytes:
    doc = {"tasks": [[["file:///in", 0, 10, "in"]]], "replaced": [], "cuts": cuts}
    return wire.compress(wire.pack(doc))


def test_plan_round_trips_cut_points() -> None:
    cuts = (-1, "a", b"b", (1, "x"), None)
    data = Plan(((Range("file:///in", 0, 10, "in"),),), (), cuts).to_bytes()
    assert Plan.from_bytes(data, Plan.digest(data), 6).cuts == cuts
    plain = Plan(((Range("file:///in", 0, 10, "in"),),)).to_bytes()
    assert Plan.from_bytes(plain, Plan.digest(plain)).cuts is None
    with pytest.raises(UsageError, match="does not sort after"):
        Plan(((Range("file:///in", 0, 10, "in"),),), (), ("b", "a")).to_bytes()


@pytest.mark.parametrize(
    ("cuts", "partitions", "said"),
    [
        ([wire.pack("b"), wire.pack("a")], 4, "cut point 1 does not sort after cut point 0"),
        ([wire.pack("a"), wire.pack("a")], 4, "does not sort after"),
        ([wire.pack(i) for i in range(4)], 4, "it has 4 cut points"),
        ([wire.pack({"a": 1})], 4, "cut point 0 is not a key"),
        ([wire.pack([1, [2]])], 4, ""),  # lists arrive as tuples: a key
        (["a"], 4, "cut point 0 is not a packed key"),
        ([b"\xc1"], 4, "malformed"),  # not msgpack
        ([wire.pack("a") + b"\x00"], 4, "extra bytes"),
        ([wire.pack("x" * MAX_CUT_BYTES)], 4, "malformed"),  # past the bin bound
        ([wire.pack((((((((((((((((((((1,),),),),),),),),),),),),),),),),),),))], 4, "not a key"),
    ],
)
def test_forged_cut_points_are_refused(cuts: list[Any], partitions: int, said: str) -> None:
    data = _forged(cuts)
    if not said:
        assert Plan.from_bytes(data, Plan.digest(data), partitions).cuts == ((1, (2,)),)
        return
    with pytest.raises(WireError, match=said):
        Plan.from_bytes(data, Plan.digest(data), partitions)


# --- on the local stack ---------------------------------------------------------------------


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.timeout(300)
@pytest.mark.slow
async def test_total_order_on_the_local_stack(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    keys = KINDS["tuple"]
    job = _job(tmp_path, TOTAL.format(keys=keys, flag=True, reducers=3))
    n = 20_000
    src = tmp_path / "in"
    src.mkdir()
    for f in range(4):  # several files, staged to S3: sampled across them
        (src / f"f{f}.txt").write_text("".join(f"{i}\n" for i in range(f, n, 4)))
    result = await run_on(
        be, job, str(src), str(tmp_path / "out"), workers=2, visibility_timeout=10,
        aws=settings, split_bytes=8_000,
    )  # fmt: skip
    parts = _parts(result)
    assert len(parts) == 3 and all(parts)
    used = {keys[(i * 7919) % len(keys)] for i in range(n)}
    assert [k for p in parts for k in p] == sorted(used, key=sort_key)
