"""Hostile input and hostile shuffle batches (issue 26): what a line, a row, a compressed
file or a forged batch can make a worker or a submitter do. Each either fails with a short
error naming the file and place, or ends with exact output; memory is measured on real
processes (a fresh interpreter runs the job: its own peak and its pool's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
import zstandard

from cmr import formats, wire
from cmr.api import cpu_pool, run_on
from cmr.backends.base import Backend
from cmr.backends.faults import FaultPlan
from cmr.errors import JobFailed, UsageError
from cmr.lifecycle import load_spec
from cmr.runtime import Runtime
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = str(ROOT / "examples" / "wordcount.py")
COUNT = """
import cmr


class Count(cmr.Job):
    def map(self, key, value):
        yield "records", 1

    def reduce(self, key, values):
        yield key, sum(values)
"""
# A job run in a fresh interpreter on the embedded backend: its error and peak RSS (its own
# VmHWM, and its pool's, in MiB) as JSON on stdout.
RUNNER = """
import asyncio, json, os, resource, sys
from cmr.api import open_backend, run_on
from cmr.errors import CmrError
from cmr.settings import AwsSettings, WorkerSettings

from tests.procs import vm_hwm_mib  # this process's own peak (ru_maxrss: its parent's)

async def main(job, root, out, fmt, total_order):
    error = ""
    async with open_backend("embedded", AwsSettings()) as be:
        try:
            await run_on(be, job, root, out, input_format=fmt, total_order=total_order,
                         reducers=4, max_task_failures=1,
                         worker_settings=WorkerSettings(memory_mb=16))
        except CmrError as exc:
            error = f"{type(exc).__name__}: {exc}"
    pool = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"error": error, "self": vm_hwm_mib(os.getpid()), "pool": pool}))

asyncio.run(main(*sys.argv[1:5], sys.argv[5] == "1"))
"""
# A worker of --memory-mb 16 holds records of 32 MiB: what one decodes to stays near that.
PEAK_MIB = 256


def run_alone(
    tmp: Path, fmt: str, data: bytes, name: str = "x.dat", total_order: bool = False
) -> dict[str, Any]:
    root = tmp / "in"
    root.mkdir()
    (root / name).write_bytes(data)
    (tmp / "count.py").write_text(COUNT)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            RUNNER,
            str(tmp / "count.py"),
            str(root),
            str(tmp / "out"),
            fmt,
            "1" if total_order else "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---- (a) a line or a row that amplifies ------------------------------------------------


async def test_deeply_nested_json_fails_naming_the_file_and_line(
    embedded: Backend, tmp_path: Path
) -> None:
    """A JSON line nested 100,000 deep: the decoder's RecursionError used to be the task's
    whole error (no file, no line); it is an InputError naming both."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "deep.json").write_bytes(b"1\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    (tmp_path / "count.py").write_text(COUNT)
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded,
            str(tmp_path / "count.py"),
            str(root),
            str(tmp_path / "out"),
            input_format="jsonlines",
            max_task_failures=1,
        )
    assert "InputError: input deep.json: line 2 nests JSON arrays or objects deeper" in str(
        info.value
    )


def test_a_json_line_of_empty_arrays_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    """One 24 MB line of ``[],`` (8 M empty lists, within the 32 MiB a record may be)
    decoded to ~675 MiB of lists in the pool process; it is refused from its counts."""
    data = b"[" + b"[]," * 8_000_000 + b"[]]\n"
    r = run_alone(tmp_path, "jsonlines", data)
    assert "InputError: input x.dat: line 1 holds too many JSON values" in r["error"], r
    assert "raise --memory-mb" in r["error"]
    assert r["pool"] < PEAK_MIB and r["self"] < PEAK_MIB, r


@pytest.mark.parametrize("where", ["header", "row"])
def test_a_wide_csv_row_is_refused_as_it_is_read(tmp_path: Path, where: str) -> None:
    """A row (or the header) of 4 M two-byte fields: 12 MB that the csv module made 346 MiB
    of str objects of, before the field count was checked; refused as its lines arrive."""
    wide = b"ab," * 4_000_000 + b"ab\n"
    data = wide + b"1\n" if where == "header" else b"a\n" + wide
    r = run_alone(tmp_path, "csv", data)
    row = 1 if where == "header" else 2
    assert f"InputError: input x.dat: row {row} (at line {row}) is past 33,554,432" in r["error"]
    assert r["pool"] < PEAK_MIB and r["self"] < PEAK_MIB, r


def test_a_csv_line_without_end_is_read_no_further_than_a_record() -> None:
    """A line with no newline was read whole (a str of its length) before the csv module's
    field limit saw it; the reader stops past max_record."""
    chunk = formats.Chunk("x.csv", b"h\n" + b"a" * 5_000_000, max_record=1_000_000)
    with pytest.raises(formats.InputError, match=r"row 2 .* is past 1,000,000 bytes"):
        list(formats.records(formats.parse_input("csv"), chunk, 1 << 20))


def test_json_and_csv_records_within_the_bound_read_as_before() -> None:
    """The bound counts commas and brackets only for long lines; ordinary ones decode."""
    lines = b'{"a": [1, 2, {"b": "x,y"}]}\n' * 1000 + b"[" * 500 + b"]" * 500 + b"\n"
    got = list(formats.records(formats.parse_input("jsonlines"), formats.Chunk("j", lines), 99))
    assert len(got) == 1001 and got[0][1] == {"a": [1, 2, {"b": "x,y"}]}
    text = b"a,b\n" + b'1,"x\ny,z"\n' * 2 + b"3,4\n"
    got = list(formats.records(formats.parse_input("csv"), formats.Chunk("c", text), 99))
    assert [v for _, v in got] == [{"a": "1", "b": "x\ny,z"}] * 2 + [{"a": "3", "b": "4"}]


# ---- (b) total-order sampling over hostile input ---------------------------------------


SAMPLER = """
import asyncio, json, os, sys
from pathlib import Path
from cmr import sampling
from cmr.api import job_ref, open_backend
from cmr.settings import AwsSettings
from cmr.wire import Range

from tests.procs import vm_hwm_mib  # this process's own peak (ru_maxrss: its parent's)

async def main(job, path):
    size = Path(path).stat().st_size
    async with open_backend("embedded", AwsSettings()) as be:
        ranges = [[Range("file://" + path, 0, size, "big.zst")]]
        cuts = await sampling.cut_points(be.blobs, job_ref(job), {}, "", ranges, 4, 600)
    print(json.dumps({"cuts": list(cuts), "peak": vm_hwm_mib(os.getpid())}))

asyncio.run(main(*sys.argv[1:3]))
"""


def test_total_order_samples_only_the_start_of_a_compressed_input(tmp_path: Path) -> None:
    """A 0.2 MB zstd file of 256 MiB of lines: the submitter's sample decoded all of it and
    held it (and ran the map over it) before choosing the cuts; it reads the first MiB. The
    sampler runs alone in a fresh interpreter, its peak RSS measured."""
    lines = b"".join(b"%07d" % i + b"x" * 1016 + b"\n" for i in range(1024))
    (tmp_path / "big.zst").write_bytes(zstandard.ZstdCompressor().compress(lines * 256))
    (tmp_path / "words.py").write_text(WORDS)
    out = subprocess.run(
        [sys.executable, "-c", SAMPLER, str(tmp_path / "words.py"), str(tmp_path / "big.zst")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(r["cuts"]) == 3 and r["cuts"] == sorted(r["cuts"]), r
    assert r["peak"] < 128, r


WORDS = """
import cmr


class Words(cmr.Job):
    def map(self, key, line):
        yield line[:7], 1

    def reduce(self, key, values):
        yield key, sum(values)
"""


async def test_total_order_over_wide_json_lines_within_a_tasks_bound_runs(
    embedded: Backend, tmp_path: Path
) -> None:
    """Lines of 300,000 JSON numbers (3.6 MB, past the sample's bound once each value is
    costed, well within a map task's at the default memory): the sample takes the records
    it can, the job runs (the sampler's bound refused it at submit, issue 26's review)."""
    root = tmp_path / "in"
    root.mkdir()
    line = b'{"id":%d,"v":[' + b",".join([b"1.5"] * 300_000) + b"]}\n"
    (root / "wide.jsonl").write_bytes(b"".join(line % i for i in range(3)))
    (tmp_path / "count.py").write_text(COUNT)
    out = tmp_path / "out"
    await run_on(
        embedded,
        str(tmp_path / "count.py"),
        str(root),
        str(out),
        input_format="jsonlines",
        total_order=True,
        reducers=2,
    )
    text = b"".join(p.read_bytes() for p in sorted(out.glob("part-*")))
    assert text == b"records\t3\n"


def test_sampled_keys_of_every_kind_give_ordered_cuts() -> None:
    """Keys a hostile input can make a map yield: NaN, mixed types, huge ints and strings,
    all equal: the cut points are distinct and strictly increasing (sort_key order)."""
    from cmr import sampling
    from cmr.partition import RangePartitioner
    from cmr.usercode import sort_key

    keys = sampling._Keys()
    for k in [float("nan"), 1, "a" * 10_000, b"b", (1, "x"), None, 2**100, True, 1.5] * 50:
        keys.add(k)
    cuts = sampling.choose_cuts(keys.kept, 8)
    assert [sort_key(c) for c in cuts] == sorted({sort_key(c) for c in cuts})
    part = RangePartitioner(cuts)
    ps = [part(k, 8) for k in sorted(keys.kept, key=sort_key)]
    assert ps == sorted(ps)
    assert sampling.choose_cuts(["same"] * 1000, 8) == ()  # all equal: one part, no cut


# ---- (c) fixed records of the wrong layout ---------------------------------------------


async def test_fixed_records_of_the_wrong_layout_fail_clearly(
    embedded: Backend, tmp_path: Path
) -> None:
    """A file that is not whole records is refused at submit; a compressed one whose
    decoded bytes are not fails its task naming the file; a layout past the record is
    refused when named (these held before issue 26: the tests back the threat model)."""
    (tmp_path / "count.py").write_text(COUNT)
    root = tmp_path / "plain"
    root.mkdir()
    (root / "short.bin").write_bytes(b"k" * 1005)
    with pytest.raises(UsageError, match=r"short\.bin holds 1,005 bytes, not a whole number"):
        await run_on(
            embedded, str(tmp_path / "count.py"), str(root), str(tmp_path / "out-plain"),
            input_format="fixed:10:2",
        )  # fmt: skip
    root = tmp_path / "zst"
    root.mkdir()
    (root / "short.zst").write_bytes(zstandard.ZstdCompressor().compress(b"k" * 1005))
    with pytest.raises(JobFailed) as info:
        await run_on(
            embedded, str(tmp_path / "count.py"), str(root), str(tmp_path / "out-zst"),
            input_format="fixed:10:2", max_task_failures=1,
        )  # fmt: skip
    assert "input short.zst: its 1,005 decompressed bytes are not whole 10-byte records" in str(
        info.value
    )
    for bad in ("fixed:10:11", "fixed:16777217:1", "fixed:0:0", "fixed:10"):
        with pytest.raises(formats.FormatError, match="fixed needs"):
            formats.parse_input(bad)


# ---- (d) forged shuffle batches from a queue reader and writer -------------------------


@in_virtual_time
async def test_forged_batches_with_a_real_attempt_never_reach_the_output(
    pool: Executor, tmp_path: Path, data: Path
) -> None:
    """Someone who reads the partition queues knows a running attempt's id; they send, in
    its name, batches with a seq it never sent: one before its commit (held, then cut out
    of its spool once the commit says how many it sent), one after (refused at once), and
    one pointing its spill at a blob outside the job. Counted, the first used to stand in
    for a real batch, and its pairs were reduced into the output."""
    sent: list[str] = []

    async def forge(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step not in ("map.partly_sent", "map.committed") or context["task"] != 0:
            return
        if step == "map.committed" and not context["won"]:
            return
        spec, _ = await load_spec(rt.backend, context["job"])
        _, _, part_qs = spec.queues()
        for p, q in enumerate(part_qs):
            seq = 1000 + len(sent)
            pairs = wire.pack(["FORGED", 1_000_000])
            forged = [
                wire.Batch(spec.job_id, 0, context["attempt"], p, seq, 1, pairs),
                wire.Batch(
                    spec.job_id, 0, context["attempt"], p, seq + 1, 1, b"", "file:///etc/passwd"
                ),
            ]
            await rt.backend.queues.send(q, [wire.encode(b) for b in forged])
        sent.append(step)

    out = tmp_path / "out"
    result = await chaos_run(
        WORDCOUNT,
        data,
        out,
        seed=0,
        pool=pool,
        plan=FaultPlan(seed=0),
        hooks=[forge, forge],
        workers=2,
        reducers=2,
        clientless=True,
        timeout_s=120,
    )
    assert sorted(sent) == ["map.committed", "map.partly_sent"]
    assert result.record["state"] == "succeeded", result.record.get("error")
    assert diff_outputs(sequential(WORDCOUNT, data, 2), read_output(out, 2)) == []
    assert result.record.get("messages_rejected", 0) >= 4
    assert result.leftovers == []


@pytest.fixture
def pool() -> Iterator[Executor]:
    with cpu_pool(2) as p:
        yield p


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "words"
    root.mkdir()
    for i in range(4):
        (root / f"f{i}.txt").write_text(
            textwrap.dedent(
                f"""\
                the quick brown fox {i}
                jumps over the lazy dog {i}
                """
            )
            * 200
        )
    return root
