"""Keys within a part come out in their natural order (documented in cmr.Job): numbers, str,
bytes, tuples element by element, booleans, None; the same whether the reducer sorted them in
memory or merged runs it spilled to disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.settings import WorkerSettings
from cmr.usercode import sort_key

# Keys in the documented order, as the map yields them (by the line's number). The tuples'
# msgpack encodings sort otherwise: 1 before -1, ("b",) before ("aa",), (2, "z") before
# (2.5,), and a 1-tuple's header before a 2-tuple's whatever their elements. (No 0 or 1 at
# the top: Python groups them with False and True, as equal keys.)
ORDERED = [
    -(2**40),
    -1,
    2.5,
    3,
    300,
    "",
    "B",
    "a",
    "aa",
    "b",
    b"",
    b"\x00",
    b"a",
    (),
    (-1,),
    (1,),
    (1, "a"),
    (1, "a", 0),
    (1, "b"),
    (2, "z"),
    (2.5,),
    ("aa",),
    ("b",),
    ("b", (1,)),
    ("b", (1, 2)),
    ("b", ("a",)),
    (b"a",),
    ((),),
    ((0,),),
    (False,),
    (None,),
    False,
    True,
    None,
]

JOB = """
import cmr

KEYS = {keys}


class Ordered(cmr.Job):
    def map(self, k, line):
        i = int(line)
        yield KEYS[i % len(KEYS)], i

    def reduce(self, k, vs):
        yield [k], min(vs)
"""


def test_the_order_is_total_over_mixed_types() -> None:
    keys = [*ORDERED, float("nan"), 7, 0.5, (float("nan"), 1), {"a": 1}, ((1, "a"), b"x")]
    ranked = sorted(reversed(keys), key=sort_key)  # never raises
    assert ranked.index(300) < ranked.index(keys[-6]) < ranked.index("")  # NaN after numbers
    assert ranked.index(None) < ranked.index({"a": 1})
    assert [k for k in ranked if k in ORDERED] == ORDERED


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spill", [False, True], ids=["in memory", "spilled and merged"])
async def test_keys_come_out_in_natural_order(
    embedded: Backend, tmp_path: Path, spill: bool
) -> None:
    job = tmp_path / "ordered.py"
    job.write_text(JOB.format(keys=repr(ORDERED)))
    src = tmp_path / "in.txt"
    copies = 400 if spill else 1  # with spilling: enough values to fill several runs
    src.write_text("".join(f"{i}\n" for i in range(len(ORDERED) * copies)))
    settings = WorkerSettings(memory_mb=0) if spill else None
    result = await run_on(
        embedded,
        str(job),
        str(src),
        str(tmp_path / "out"),
        reducers=1,
        worker_settings=settings,
    )
    lines = Path(result.parts[0]).read_text().splitlines()
    # The key of line i is KEYS[i % len(KEYS)]: its smallest line is its index in ORDERED.
    assert [int(line.split("\t")[1]) for line in lines] == list(range(len(ORDERED)))
    if spill:
        assert result.record["reduce_spills"] > 1
    first = json.loads(lines[0].split("\t")[0])
    assert first == [-(2**40)]
