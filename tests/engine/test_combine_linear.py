"""combine runs in linear time in the values, whatever it yields: a combiner that does not
shrink a key's values (here: one that drops duplicates of 2,000 distinct values) used to be
re-run over the whole list for every value added past 64, quadratic in the values. The
timeouts are generous bounds (seconds where the quadratic code took minutes), not
measurements."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgpack
import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cpu.reducing import run_reduce
from cmr.cpu.specs import ReduceSpec
from cmr.job import JobRef

VALUES = 400_000
DISTINCT = 2_000

DEDUP = """
import cmr


class Distinct(cmr.Job):
    def map_chunk(self, name, data):
        for line in data.split(b"\\n"):
            yield "k", int(line) % {distinct}

    def combine(self, key, values):
        for v in set(values):
            yield key, v

    def reduce(self, key, values):
        yield key, len(set(values))
"""


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "distinct.py"
    job.write_text(DEDUP.format(distinct=DISTINCT))
    return job


@pytest.mark.timeout(60)
async def test_a_deduplicating_combiner_in_the_map_is_linear(
    embedded: Backend, tmp_path: Path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{i}\n" for i in range(VALUES)))
    result = await run_on(
        embedded, str(_job(tmp_path)), str(src), str(tmp_path / "out"), reducers=1
    )
    assert Path(result.parts[0]).read_text() == f"k\t{DISTINCT}\n"
    assert result.record["records_in"] == VALUES


@pytest.mark.timeout(60)
def test_a_deduplicating_combiner_in_the_reduce_is_linear(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    packer = msgpack.Packer(use_bin_type=True)
    with open(spool, "wb") as f:
        f.write(b"".join(packer.pack(("k", i % DISTINCT)) for i in range(VALUES)))
    out = tmp_path / "part"
    ref = JobRef.parse(str(_job(tmp_path)))
    with tempfile.TemporaryDirectory(dir=tmp_path) as spill:
        result = run_reduce(
            ref, {}, [str(spool)], ReduceSpec("combine-linear", str(out), 512 << 20, spill)
        )
        assert os.listdir(spill) == []
    assert result.error == ""
    assert out.read_text() == f"k\t{DISTINCT}\n"
