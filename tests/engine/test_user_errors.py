"""Mistakes in a job's code, reported in terms of the user's code: which method, what it
yielded or returned, what was expected, and the user's own traceback frames only (never
cmr's or msgpack's), in seconds; and what users may yield (list keys, list pairs) working."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import JobCodeError, JobFailed

HEADER = "import cmr\n\n"
WORDS = "def map(self, k, line):\n    for w in line.split():\n        yield w, 1\n"
SUM = "def reduce(self, k, vs):\n    yield k, sum(vs)\n"
ONE = "def reduce(self, k, vs):\n    yield k, 1\n"


def _job(tmp_path: Path, body: str) -> str:
    """A job file whose class J has ``body`` (unindented) as its methods."""
    path = tmp_path / "j.py"
    path.write_text(HEADER + "class J(cmr.Job):\n" + textwrap.indent(body, "    "))
    return str(path)


def _input(tmp_path: Path) -> str:
    src = tmp_path / "in.txt"
    src.write_text("hello world\nfoo bar hello\n")
    return str(src)


async def _reason(embedded: Backend, tmp_path: Path, job: str) -> str:
    out = tmp_path / "out"
    with pytest.raises(JobFailed) as info:
        await run_on(embedded, job, _input(tmp_path), str(out), reducers=2)
    assert not out.exists() or not any(out.iterdir())  # nothing published
    reason = info.value.reason
    # Only the user's frames: none of cmr's, none of msgpack's.
    frames = [line for line in reason.splitlines() if line.strip().startswith('File "')]
    assert not [f for f in frames if "/cmr/" in f or "msgpack" in f], reason
    return reason


# (name, the class body, what the job's error must say)
FAILING = [
    (
        "map yields a 2-char str",
        "def map(self, k, line):\n    yield 'ab'\n" + ONE,
        ["J.map yielded 'ab' (a str)", "j.py line 5", "expected (key, value) pairs"],
    ),
    (
        "map yields a 3-char str",
        "def map(self, k, line):\n    yield 'abc'\n" + ONE,
        ["J.map yielded 'abc' (a str)", "expected (key, value) pairs"],
    ),
    (
        "map yields a 3-tuple",
        "def map(self, k, line):\n    yield k, line, 1\n" + ONE,
        ["J.map yielded a tuple of 3", "expected (key, value) pairs"],
    ),
    (
        "map yields an int",
        "def map(self, k, line):\n    yield 5\n" + ONE,
        ["J.map yielded 5 (an int)"],
    ),
    (
        "map_chunk yields a str",
        "def map_chunk(self, name, data):\n    yield 'xy'\n" + ONE,
        ["J.map_chunk yielded 'xy' (a str)"],
    ),
    (
        "value is not wire data",
        "def map(self, k, line):\n    yield line, object()\n" + ONE,
        ["J.map yielded a value that is not wire data", "(an object)", "j.py line 5"],
    ),
    (
        "key is not wire data",
        "def map(self, k, line):\n    yield {1, 2}, 1\n" + ONE,
        ["J.map yielded a key that is not wire data", "(a set)"],
    ),
    (
        "value is an int out of range",
        "def map(self, k, line):\n    yield line, 2**70\n" + ONE,
        ["J.map yielded a value that is not wire data", "outside the 64-bit range"],
    ),
    (
        "dict key",
        "def map(self, k, line):\n    yield {'a': 1}, 1\n" + ONE,
        ["J.map yielded a dict as a key", "keys must be"],
    ),
    (
        "dict key with a combiner",
        "def map(self, k, line):\n    yield {'a': 1}, 1\n"
        "def combine(self, k, vs):\n    yield k, sum(vs)\n" + SUM,
        ["J.map yielded a key with a dict in it", "keys must be"],
    ),
    (
        "dict inside a tuple key",
        "def map(self, k, line):\n    yield ('a', {'b': 1}), 1\n" + ONE,
        ["J.map yielded a key that cannot be grouped by", "keys must be"],
    ),
    (
        "combine yields bare values",
        WORDS + "def combine(self, k, vs):\n    yield sum(vs)\n" + ONE,
        ["J.combine yielded", "expected (key, value) pairs"],
    ),
    (
        "reduce yields a set",
        WORDS + "def reduce(self, k, vs):\n    yield k, set(vs)\n",
        ["J.reduce yielded", "{1} (a set)", "Job.format cannot write faithfully"],
    ),
    (
        "reduce yields an object in a list",
        WORDS + "def reduce(self, k, vs):\n    yield k, [object()]\n",
        ["J.reduce yielded", "Job.format cannot write faithfully", "an object has no JSON"],
    ),
    (
        "reduce yields a 2-char str",
        WORDS + "def reduce(self, k, vs):\n    yield 'ab'\n",
        ["J.reduce yielded 'ab' (a str)", "expected (key, value) pairs"],
    ),
    (
        "reduce returns an int",
        WORDS + "def reduce(self, k, vs):\n    return sum(vs)\n",
        ["J.reduce returned", "(an int), not an iterable of (key, value) pairs"],
    ),
    (
        "map returns None",
        "def map(self, k, line):\n    [(w, 1) for w in line.split()]\n" + ONE,
        ["J.map returned no iterable of (key, value) pairs"],
    ),
    (
        "map_chunk returns None",
        "def map_chunk(self, name, data):\n    pass\n" + ONE,
        ["J.map_chunk returned None (a NoneType), not an iterable"],
    ),
    *[
        (
            f"partition returns {shown}",
            WORDS + f"def partition(self, key, n):\n    return {expr}\n" + ONE,
            [f"J.partition returned {shown}", "it must return an int from 0 to 1", "2 partitions"],
        )
        for expr, shown in [("n + 5", "7 (an int)"), ("-1", "-1 (an int)"), ("'0'", "'0' (a str)")]
    ],
    (
        "reduce raises",
        WORDS + "def reduce(self, k, vs):\n    raise ValueError('boom')\n",
        ["J.reduce raised ValueError: boom", 'j.py", line 8, in reduce', "ValueError: boom"],
    ),
    (
        "a helper of map raises",
        "def map(self, k, line):\n    yield self.helper(line), 1\n"
        + ONE
        + "def helper(self, line):\n    return 1 / 0\n",
        ["J.map raised ZeroDivisionError", "in map", "in helper", "ZeroDivisionError"],
    ),
    (
        # Past what a reducer takes of one spilled pair: refused where it is made, naming
        # the key, rather than dropped by the reducer and waited for (issue 26 review).
        "map yields a pair past 64 MiB packed",
        "def map(self, k, line):\n    yield 'big', 'x' * (65 * 2**20)\n" + ONE,
        ["J.map yielded a pair for key 'big' (a str)", "j.py line 5", "past the 67,108,864"],
    ),
    (
        "setup raises",
        "def setup(self):\n    raise RuntimeError('no config')\n" + WORDS + ONE,
        ["J.setup raised RuntimeError: no config"],
    ),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in FAILING], ids=[c[0] for c in FAILING]
)
async def test_user_code_mistakes_name_the_method(
    embedded: Backend, tmp_path: Path, body: str, expected: list[str]
) -> None:
    reason = await _reason(embedded, tmp_path, _job(tmp_path, body))
    for text in expected:
        assert text in reason, reason


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("body", "missing"),
    [
        ("def map(self, k, line):\n    yield line, 1\n", "J defines no reduce()"),
        ("def reduce(self, k, vs):\n    yield k, 1\n", "J defines no map()"),
        ("pass\n", "J defines no map() and no reduce()"),
        (WORDS + "lines = 'crlf'\n" + SUM, "J.lines is 'crlf'"),
    ],
)
async def test_a_job_class_that_cannot_run_is_refused_at_submit(
    embedded: Backend, tmp_path: Path, body: str, missing: str
) -> None:
    with pytest.raises(JobCodeError, match=re.escape(missing)) as info:
        await run_on(embedded, _job(tmp_path, body), _input(tmp_path), str(tmp_path / "out"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()  # refused before anything was submitted


LIST_KEYS = "def map(self, k, line):\n    for w in line.split():\n        yield [w, [len(w)]], 1\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("combine", [True, False])
async def test_list_keys_work_with_and_without_a_combiner(
    embedded: Backend, tmp_path: Path, combine: bool
) -> None:
    body = LIST_KEYS
    if combine:
        body += "def combine(self, k, vs):\n    yield k, sum(vs)\n"
    body += "def reduce(self, k, vs):\n    assert type(k) is tuple and type(k[1]) is tuple\n"
    body += "    yield k, sum(vs)\n"
    result = await run_on(
        embedded, _job(tmp_path, body), _input(tmp_path), str(tmp_path / "out"), reducers=1
    )
    text = Path(result.parts[0]).read_text()
    assert text.splitlines() == [
        '["bar", [3]]\t1',
        '["foo", [3]]\t1',
        '["hello", [5]]\t2',
        '["world", [5]]\t1',
    ]


async def test_pairs_yielded_as_lists_are_pairs(embedded: Backend, tmp_path: Path) -> None:
    body = "def map(self, k, line):\n    for w in line.split():\n        yield [w, 1]\n"
    body += "def reduce(self, k, vs):\n    yield [k, sum(vs)]\n"
    result = await run_on(
        embedded, _job(tmp_path, body), _input(tmp_path), str(tmp_path / "out"), reducers=1
    )
    assert Path(result.parts[0]).read_text() == "bar\t1\nfoo\t1\nhello\t2\nworld\t1\n"


async def test_bytes_inside_a_value_are_written_as_text(embedded: Backend, tmp_path: Path) -> None:
    body = "def map(self, k, line):\n    yield 'k', [b'caf\\xc3\\xa9', line]\n"
    body += "def reduce(self, k, vs):\n    yield k, sorted(vs)[0]\n"
    result = await run_on(
        embedded, _job(tmp_path, body), _input(tmp_path), str(tmp_path / "out"), reducers=1
    )
    assert Path(result.parts[0]).read_text() == 'k\t["café", "foo bar hello"]\n'
