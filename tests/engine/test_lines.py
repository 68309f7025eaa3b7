"""Line endings: ``Job.lines = "universal"`` (or a submission's ``JobSpec.lines``) makes
"\\r\\n", "\\n" and a lone "\\r" each end a line, so Windows input gives ``Paris``, not
``Paris\\r``; the default ("lf") keeps lines exactly as split on "\\n"."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgpack
import pytest

from cmr import wire
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cpu.instances import job_instance
from cmr.cpu.mapping import run_map, universal_lines
from cmr.cpu.results import MapResult
from cmr.cpu.specs import MapSpec
from cmr.errors import WireError
from cmr.job import JobRef
from cmr.records import JobSpec

JOB = """
import cmr


class Lines(cmr.Job):
    lines = {lines!r}

    def map(self, key, line):
        yield line, 1

    def reduce(self, key, values):
        yield repr(key), sum(values)
"""

# Two CRLF lines, an empty CRLF line, a lone-CR line ending, an LF line, and a last line
# that ends the file without an ending.
DATA = b"Paris\r\nLondon\r\n\r\nRome\rParis\nParis\r"


# One job id per line-ending choice: instances are kept per job id in a process.
JOB_ID = {"": "20260101-000000-00000000000000aa", "universal": "20260101-000000-00000000000000bb"}


def _job(tmp_path: Path, lines: str) -> Path:
    job = tmp_path / f"lines_{lines}.py"
    job.write_text(JOB.format(lines=lines))
    return job


def _counts(part: str) -> dict[str, int]:
    pairs = (line.rsplit("\t", 1) for line in Path(part).read_text().splitlines())
    return {k: int(v) for k, v in pairs}


@pytest.mark.parametrize("split_bytes", [None, 8])
async def test_universal_lines_end_at_crlf_lf_and_cr(
    embedded: Backend, tmp_path: Path, split_bytes: int | None
) -> None:
    src = tmp_path / "windows.txt"
    src.write_bytes(DATA)
    result = await run_on(
        embedded,
        str(_job(tmp_path, "universal")),
        str(src),
        str(tmp_path / "out"),
        reducers=1,
        split_bytes=split_bytes,
    )
    assert _counts(result.parts[0]) == {"'Paris'": 3, "'London'": 1, "''": 1, "'Rome'": 1}
    assert result.record["records_in"] == 6


async def test_lf_lines_keep_their_carriage_returns(embedded: Backend, tmp_path: Path) -> None:
    src = tmp_path / "windows.txt"
    src.write_bytes(DATA)
    result = await run_on(
        embedded, str(_job(tmp_path, "lf")), str(src), str(tmp_path / "out"), reducers=1
    )
    assert _counts(result.parts[0]) == {
        "'Paris\\r'": 2,
        "'London\\r'": 1,
        "'\\r'": 1,
        "'Rome\\rParis'": 1,
    }
    assert result.record["records_in"] == 5


def _map(tmp_path: Path, job: Path, lines: str) -> tuple[MapResult, dict[str, int]]:
    """One map task of ``job`` over DATA in a pool-less call, as a worker runs it for a job
    whose record says ``lines``."""
    spec = MapSpec(
        JOB_ID[lines],
        0,
        "a1",
        1,
        256 * 1024,
        str(tmp_path),
        compress=False,
        lines=lines,
    )
    result = run_map(JobRef.parse(str(job)), {}, [("windows.txt", DATA)], spec)
    assert result.error == ""
    counts: dict[str, int] = {}
    with open(result.spool, "rb") as f:
        for _, _, _, body, _ in msgpack.Unpacker(f, raw=False, use_list=False):
            batch = wire.decode(body)
            assert isinstance(batch, wire.Batch)
            for key, value in wire.iter_pairs(batch.pairs):
                counts[key] = counts.get(key, 0) + value
    os.unlink(result.spool)
    return result, counts


def test_the_job_records_lines_override_the_class(tmp_path: Path) -> None:
    job = _job(tmp_path, "lf")
    result, counts = _map(tmp_path, job, "universal")
    assert counts == {"Paris": 3, "London": 1, "": 1, "Rome": 1}
    assert result.records_in == 6
    # The job's instance sees the submission's choice too (its own map_chunk may look).
    inst = job_instance(JOB_ID["universal"], JobRef.parse(str(job)), {})
    assert inst.lines == "universal"
    result, counts = _map(tmp_path, job, "")
    assert counts["Paris\r"] == 2
    assert result.records_in == 5


def test_job_records_carry_lines(tmp_path: Path) -> None:
    job = _job(tmp_path, "lf")
    spec = JobSpec(
        "20260101-000000-0123456789abcdef",
        JobRef.parse(str(job)),
        {},
        1,
        1,
        "file:///tmp/out/",
        "file:///tmp/scratch",
        "cmr-",
        60,
        3,
        input_root="file:///tmp/in/",
        lines="universal",
    )
    item = spec.to_item()
    assert JobSpec.from_item(spec.job_id, item) == spec
    old = {k: v for k, v in item.items() if k != "lines"}  # a record from before the field
    assert JobSpec.from_item(spec.job_id, old).lines == ""
    with pytest.raises(WireError, match="lines"):
        JobSpec.from_item(spec.job_id, {**item, "lines": "crlf"})
    with pytest.raises(WireError, match="lines"):
        JobSpec.from_item(spec.job_id, {**item, "lines": 1})


def test_universal_lines_leave_lf_data_as_it_is() -> None:
    data = b"a\nb\n" * 1000
    assert universal_lines(data) is data  # no copy on the common path
    assert universal_lines(b"a\r\nb\rc\n\r\n") == b"a\nb\nc\n\n"


def test_a_spool_dir_is_left_clean(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        _map(Path(d), _job(tmp_path, "universal"), "")
        assert os.listdir(d) == []
