"""cmr.testing.sequential, the harness users test their own jobs with: for a job using each
feature (input formats, compressed input, line endings, sort_values and value_order, key
order, side files, hooks, counters, pipelines and --step/--from-step, total order, output
formats) its output is the output of a real run on the embedded backend, part by part and
byte for byte; and chaos_run reports no difference where there is none."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from cmr import api
from cmr.errors import UsageError
from cmr.testing import chaos_run, diff_outputs, read_output, sequential
from cmr.virtualtime import in_virtual_time

JOBS = '''
import json

import cmr
from cmr import Step


class Cities(cmr.Job):
    input_format = "csv"
    reducers = 2

    def map(self, source, row):
        yield row["city"], int(row["n"])

    def reduce(self, key, values):
        yield key, sum(values)


class Joined(cmr.Job):
    sort_values = True

    def map(self, source, line):
        key, _, value = line.partition(" ")
        if key:
            yield key, value

    def reduce(self, key, values):
        yield key, ",".join(values)


class Secondary(Joined):
    def value_order(self, value):
        return (-len(value), value)


class Records(cmr.Job):
    """Every record as it was read (dicts as JSON), in natural order within its key."""

    output_format = "pairs"
    sort_values = True

    def map(self, key, value):
        yield key, value if isinstance(value, (str, bytes, int)) else json.dumps(value)

    def reduce(self, key, values):
        for v in values:
            yield key, v


class UniversalRecords(Records):
    lines = "universal"


class Counts(cmr.Job):
    def map(self, source, line):
        for w in line.split():
            yield w, 1

    def reduce(self, key, values):
        yield key, sum(values)


class TotalCounts(Counts):
    total_order = True


class RawOut(cmr.Job):
    output_format = "raw"
    sort_values = True

    def map(self, source, line):
        yield line.encode(), b"\\xfe" + line.encode() + b"\\n"

    def reduce(self, key, values):
        for v in values:
            yield key, v


class BytesLines(Counts):
    def format(self, key, value):
        return b"\\xff" + key.encode() + b"=" + str(value).encode()


class Mixed(cmr.Job):
    """Keys of every kind, to show their order within a part."""

    def map(self, source, line):
        for t in line.split():
            kind, rest = t[0], t[1:]
            if kind == "i":
                yield int(rest), 1
            elif kind == "f":
                yield float(rest), 1
            elif kind == "b":
                yield rest.encode(), 1
            elif kind == "l":
                yield [rest, len(rest)], 1
            elif kind == "T":
                yield True, 1
            elif kind == "F":
                yield False, 1
            elif kind == "N":
                yield None, 1
            else:
                yield rest, 1

    def reduce(self, key, values):
        yield key, sum(values)


class Hooks(cmr.Job):
    def map_init(self):
        self.lines = 0

    def map(self, source, line):
        self.lines += 1
        yield line[:1], 1

    def map_final(self):
        yield "(lines)", self.lines

    def reduce_init(self):
        self.keys = 0

    def reduce(self, key, values):
        self.keys += 1
        yield key, sum(values)

    def reduce_final(self):
        yield "(keys here)", self.keys

    def steps(self):
        return [Step(map=self.map, reduce=self.reduce, map_init=self.map_init,
                     map_final=self.map_final, reduce_init=self.reduce_init,
                     reduce_final=self.reduce_final)]


class Parity(Counts):
    def partition(self, key, partitions):
        return len(key) % partitions


class Side(cmr.Job):
    files = ["stop.txt"]

    def setup(self):
        with open(self.file("stop.txt")) as f:
            self.stop = set(f.read().split())
        with open(self.file("extra.txt")) as f:
            self.tag = f.read().strip()

    def map(self, source, line):
        for w in line.split():
            if w not in self.stop:
                yield w, self.tag

    def reduce(self, key, values):
        yield key, len(list(values))


class Counted(Counts):
    def setup(self):
        self.increment_counter("setup", "runs")  # counted by no task

    def map(self, source, line):
        self.increment_counter("map", "lines")
        for w in line.split():
            self.increment_counter("map", "words")
            yield w, 1

    def reduce(self, key, values):
        self.increment_counter("reduce", "keys")
        yield key, sum(values)


class Pipeline(cmr.Job):
    """Counts, then words by count (longest first, a secondary sort), then sorted by count."""

    output_format = "jsonlines"

    def count(self, source, line):
        for w in line.split():
            yield w, 1

    def total(self, key, values):
        yield key, sum(values)

    def by_count(self, word, n):
        yield n, word

    def words(self, n, words):
        yield n, " ".join(words)

    def steps(self):
        return [
            Step(map=self.count, reduce=self.total, reducers=3),
            Step(map=self.by_count, reduce=self.words, reducers=2, sort_values=True,
                 value_order=lambda w: (-len(w), w)),
            Step(reducers=1),
        ]


class Sorter(cmr.Job):
    """TeraSort's step: fixed records, no map, no reduce, raw output."""

    input_format = "fixed:10:3"
    output_format = "raw"

    def steps(self):
        return [Step()]
'''

REDUCERS = 3


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("harness_jobs")
    (root / "stop.txt").write_text("the a of\n")
    (root / "extra.txt").write_text("tagged\n")
    path = root / "harness_jobs.py"
    path.write_text(JOBS)
    return path


@pytest.fixture(scope="module")
def pool() -> Iterator[Executor]:
    with api.cpu_pool(2) as p:
        yield p


def job(jobs: Path, name: str) -> str:
    return f"{jobs}:{name}"


def write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "of", "river"]


def text(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return "".join(
        " ".join(rng.choices(WORDS, k=rng.randint(0, 9))) + "\n" for _ in range(n)
    ).encode()


def csv_bytes(rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue().encode()


def cities() -> bytes:
    rows = [["city", "n", "note"]]
    rows += [[c, str(i), f"a\nquoted, {i}"] for i, c in enumerate(["Paris", "Oslo", "Lima"] * 40)]
    return csv_bytes(rows)


VALUES = ["z", "yy", "x", "www", "v", "uu"]


def unsorted_values(n: int, seed: int) -> bytes:
    """Lines "key value" whose values come in no order (and some of equal length)."""
    rng = random.Random(seed)
    return "".join(
        f"{rng.choice('abcde')} {rng.choice(VALUES)}{rng.randint(0, 9)}\n" for _ in range(n)
    ).encode()


async def compare(
    job: str, data: Path | list[str], tmp: Path, reducers: int | None = REDUCERS, **options: Any
) -> tuple[list[str], api.RunResult]:
    """sequential's parts, asserted equal to a real run's (many map tasks, two workers)."""
    expected = sequential(job, data, reducers, **options)
    out = tmp / f"out-{len(list(tmp.glob('out-*')))}"
    given = str(data) if isinstance(data, Path) else data
    result = await api.run_async(
        job, given, str(out), workers=2, reducers=reducers, split_bytes=1024, **options
    )
    got = read_output(out, len(expected))
    assert diff_outputs(expected, got) == []
    assert got == expected  # byte for byte, in order
    assert len(result.parts) <= len(expected)  # and no part beyond those compared
    return expected, result


# --- the reproductions: they failed before sequential honoured the job's features ---------


@in_virtual_time
async def test_a_csv_job_is_read_as_csv(jobs: Path, tmp_path: Path) -> None:
    # Before: `TypeError: string indices must be integers` (map was handed CSV lines).
    data = write(tmp_path / "in", {"a.csv": cities(), "b.csv": cities()})
    expected, _ = await compare(job(jobs, "Cities"), data, tmp_path, reducers=None)
    sums = {c: 2 * sum(range(k, 120, 3)) for k, c in enumerate(["Paris", "Oslo", "Lima"])}
    assert sorted("".join(expected).splitlines()) == sorted(f"{c}\t{n}" for c, n in sums.items())


@in_virtual_time
async def test_sort_values_reach_reduce_sorted(jobs: Path, tmp_path: Path) -> None:
    # Before: values in input order, where a run sorts them: a false difference.
    data = write(tmp_path / "in", {"a": unsorted_values(200, 1), "b/c": unsorted_values(90, 2)})
    expected, _ = await compare(job(jobs, "Joined"), data, tmp_path)
    for line in "".join(expected).splitlines():
        values = line.split("\t")[1].split(",")
        assert values == sorted(values)


@in_virtual_time
async def test_value_order_is_a_secondary_sort(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": unsorted_values(300, 3)})
    expected, _ = await compare(job(jobs, "Secondary"), data, tmp_path)
    for line in "".join(expected).splitlines():
        values = line.split("\t")[1].split(",")
        assert values == sorted(values, key=lambda v: (-len(v), v))


@in_virtual_time
async def test_chaos_finds_no_difference_for_sorted_values(
    jobs: Path, tmp_path: Path, pool: Executor
) -> None:
    data = write(tmp_path / "in", {"a": unsorted_values(400, 4), "b": unsorted_values(300, 5)})
    expected = sequential(job(jobs, "Secondary"), data, REDUCERS)
    await chaos_run(
        job(jobs, "Secondary"), data, tmp_path / "out", seed=11, pool=pool, reducers=REDUCERS
    )
    assert diff_outputs(expected, read_output(tmp_path / "out", REDUCERS)) == []


@in_virtual_time
async def test_chaos_finds_no_difference_for_a_csv_job(
    jobs: Path, tmp_path: Path, pool: Executor
) -> None:
    data = write(tmp_path / "in", {"a.csv": cities(), "d/b.csv": cities(), "c.csv": cities()})
    expected = sequential(job(jobs, "Cities"), data, 2)
    await chaos_run(job(jobs, "Cities"), data, tmp_path / "out", seed=12, pool=pool, reducers=2)
    assert diff_outputs(expected, read_output(tmp_path / "out", 2)) == []


# --- input: every format, compressed, line endings, an output as input ----------------------


def jsonlines(n: int) -> bytes:
    rows = [json.dumps({"i": i, "l": [i, "x", None]} if i % 3 else f"s{i} é") for i in range(n)]
    return ("\n".join(rows) + "\n\n").encode()


def fixed(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    keys = rng.sample(range(1 << 24), n)  # distinct keys: ties have no order to compare
    return b"".join(k.to_bytes(3, "big") + rng.randbytes(7) for k in keys)


def pairs(n: int) -> bytes:
    pack = msgpack.Packer(use_bin_type=True).pack
    return b"".join(pack((f"k{i % 7}", [i, f"v{i}"])) for i in range(n))


INPUTS: dict[str, dict[str, bytes]] = {
    "lines": {"a.txt": b"x y\n\nz \xff\n" * 30, "sub/b.txt": b"last line, no newline"},
    "jsonlines": {"a.jsonl": jsonlines(120), "d/b.jsonl": jsonlines(4)},
    "csv": {"a.csv": cities(), "b.csv": csv_bytes([["h"], ["1"]])},
    "fixed:10:3": {"r1": fixed(300, 1), "r2": fixed(7, 2), "empty": b""},
    "whole": {"w1.bin": random.Random(3).randbytes(3000), "w2 name": b"", "w3": b"\x00\n\r"},
    "pairs": {"p1": pairs(200), "p2": pairs(3)},
}
COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "bz2": bz2.compress,
    "zstd": zstandard.compress,
}


@pytest.mark.parametrize("fmt", sorted(INPUTS))
@in_virtual_time
async def test_each_input_format(jobs: Path, tmp_path: Path, fmt: str) -> None:
    data = write(tmp_path / "in", INPUTS[fmt])
    await compare(job(jobs, "Records"), data, tmp_path, input_format=fmt)


@pytest.mark.parametrize(
    ("codec", "fmt"),
    [("gzip", f) for f in ("lines", "csv", "fixed:10:3", "jsonlines")]
    + [("bz2", "lines"), ("zstd", "jsonlines")],
)
@in_virtual_time
async def test_compressed_input(jobs: Path, tmp_path: Path, codec: str, fmt: str) -> None:
    plain = INPUTS[fmt]
    files = {f"{n}.z": COMPRESS[codec](d) for n, d in plain.items()}
    files["plain"] = next(iter(plain.values()))  # beside them, one not compressed
    data = write(tmp_path / "in", files)
    await compare(job(jobs, "Records"), data, tmp_path, input_format=fmt)


@in_virtual_time
@pytest.mark.slow
async def test_line_endings(jobs: Path, tmp_path: Path) -> None:
    data = write(
        tmp_path / "in",
        {
            "crlf": b"a b\r\nc\r\n\r\nd" * 40,
            "cr": b"e\rf\r\rg\n" * 30,
            "gz": gzip.compress(b"h\r\ni\r"),
        },
    )
    lf, _ = await compare(job(jobs, "Records"), data, tmp_path)
    universal, _ = await compare(job(jobs, "Records"), data, tmp_path, lines="universal")
    assert lf != universal  # the option is honoured, not ignored
    by_class, _ = await compare(job(jobs, "UniversalRecords"), data, tmp_path)
    assert by_class == universal
    assert sequential(job(jobs, "UniversalRecords"), data, REDUCERS, lines="lf") == lf


@in_virtual_time
async def test_an_output_read_as_pairs_input(jobs: Path, tmp_path: Path) -> None:
    # A cmr output as input: only the parts its manifest lists, and never the manifest.
    data = write(tmp_path / "in", {"a": text(200, 1)})
    out = tmp_path / "first"
    await api.run_async(job(jobs, "Records"), str(data), str(out), reducers=2, workers=1)
    (out / "part-00009").write_bytes(b"\x00 a leftover no manifest lists")
    await compare(job(jobs, "Records"), out, tmp_path, input_format="pairs")


@in_virtual_time
async def test_several_inputs_globs_and_hidden_files(jobs: Path, tmp_path: Path) -> None:
    # Names below the inputs' common directory; _ and . files are not input; a file named
    # twice is read twice.
    write(tmp_path / "A", {"x.txt": text(40, 1), "_tmp": b"no", ".x.crc": b"no"})
    write(tmp_path / "B", {"y.txt": text(30, 2), "z.log": text(20, 3), "s/_SUCCESS": b""})
    given = [str(tmp_path / "A"), str(tmp_path / "B" / "*.txt"), str(tmp_path / "B" / "z.log")]
    expected, _ = await compare(job(jobs, "Records"), [*given, given[-1]], tmp_path)
    part_bytes = "".join(expected).encode("utf-8", "surrogateescape")
    seen = {k for k, _ in msgpack.Unpacker(io.BytesIO(part_bytes))}
    assert seen == {"A/x.txt", "B/y.txt", "B/z.log"}


MR_BY_FILE = """
from mrjob.compat import jobconf_from_env
from mrjob.job import MRJob


class MRByFile(MRJob):
    def configure_args(self):
        super().configure_args()
        self.add_passthru_arg("--min", type=int, default=1)

    def mapper(self, _, line):
        if len(line) >= self.options.min:
            yield jobconf_from_env("mapreduce.map.input.file"), 1

    def reducer(self, uri, counts):
        yield uri, sum(counts)
"""


@pytest.mark.filterwarnings("ignore:'pipes' is deprecated:DeprecationWarning")  # mrjob's
@pytest.mark.slow
def test_an_mrjob_job_as_cmr_run_runs_it(tmp_path: Path) -> None:
    pytest.importorskip("mrjob")
    job_file = tmp_path / "mr_by_file.py"
    job_file.write_text(MR_BY_FILE)
    data = write(tmp_path / "in", {"a.txt": text(60, 4), "d/b.txt": text(30, 5)})
    argv = ["--min", "12"]
    expected = sequential(str(job_file), data, 2, args=argv)
    done = subprocess.run(
        [sys.executable, "-m", "cmr", "run", str(job_file), "-i", str(data), "-o", "out",
         "--reducers", "2", "--", *argv],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},  # this tree's cmr
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert read_output(tmp_path / "out", 2) == expected
    assert (data / "d" / "b.txt").as_uri() in "".join(expected)


@in_virtual_time
async def test_empty_input_runs_no_map_task(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"empty": b""})
    expected, _ = await compare(job(jobs, "Hooks"), data, tmp_path)
    assert expected == ["(keys here)\t0\n"] * REDUCERS


# --- keys, values, hooks, partitions, side files, counters -------------------------------


@in_virtual_time
async def test_key_order_of_every_kind(jobs: Path, tmp_path: Path) -> None:
    tokens = ["i3", "i-1", "f2.5", "f-0.5", "snan", "sB", "sa", "b\x01", "bz", "la", "lb"]
    tokens += ["T", "F", "N", "i10", "f1e300", "s"]
    rng = random.Random(7)
    lines = "".join(" ".join(rng.choices(tokens, k=6)) + "\n" for _ in range(300))
    data = write(tmp_path / "in", {"a": lines.encode()})
    await compare(job(jobs, "Mixed"), data, tmp_path, reducers=2)


@in_virtual_time
async def test_hooks_and_a_custom_partition(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(300, 2), "b": text(100, 3)})
    await compare(job(jobs, "Hooks"), data, tmp_path)
    await compare(job(jobs, "Parity"), data, tmp_path)


@in_virtual_time
async def test_side_files(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(200, 4)})
    extra = [f"{jobs.parent / 'extra.txt'}#extra.txt"]
    expected, _ = await compare(job(jobs, "Side"), data, tmp_path, files=extra)
    assert "tagged" not in "".join(expected) and "\nthe\t" not in "\n" + "".join(expected)
    with pytest.raises(LookupError, match=r"extra\.txt"):
        sequential(job(jobs, "Side"), data, REDUCERS)


@in_virtual_time
async def test_counters(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(300, 5), "b": text(50, 6)})
    counted: dict[str, dict[str, int]] = {}
    expected = sequential(job(jobs, "Counted"), data, REDUCERS, counted=counted)
    _, result = await compare(job(jobs, "Counted"), data, tmp_path)
    assert counted == result.counters
    assert counted["map"]["lines"] == 350 and "setup" not in counted
    assert sequential(job(jobs, "Counted"), data, REDUCERS) == expected


# --- pipelines, total order, output formats --------------------------------------------


@in_virtual_time
@pytest.mark.slow
async def test_a_pipeline_and_its_steps(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(300, 7), "b": text(80, 8)})
    whole, _ = await compare(job(jobs, "Pipeline"), data, tmp_path, reducers=None)
    assert len(whole) == 1  # the last step's own reducers
    # --step 1 writes pairs (the job goes on); --from-step 2 reads them, as a run does.
    await compare(job(jobs, "Pipeline"), data, tmp_path, reducers=None, step=1)
    first = tmp_path / "first"
    await api.run_async(job(jobs, "Pipeline"), str(data), str(first), workers=1, step=1)
    rest, _ = await compare(job(jobs, "Pipeline"), first, tmp_path, reducers=None, from_step=2)
    assert rest == whole
    await compare(job(jobs, "Pipeline"), data, tmp_path, reducers=2)  # --reducers wins


@in_virtual_time
@pytest.mark.slow
async def test_total_order(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(400, 9), "b": text(300, 10)})
    parts, _ = await compare(job(jobs, "TotalCounts"), data, tmp_path)
    keys = [line.split("\t")[0] for line in "".join(parts).splitlines()]
    assert keys == sorted(keys) and all(parts)
    by_option, _ = await compare(job(jobs, "Counts"), data, tmp_path, total_order=True)
    assert by_option == parts
    records = write(tmp_path / "fixed", {"r1": fixed(500, 3), "r2": fixed(200, 4)})
    sorted_parts, _ = await compare(job(jobs, "Sorter"), records, tmp_path, total_order=True)
    joined = "".join(sorted_parts).encode("utf-8", "surrogateescape")
    keys_b = [joined[i : i + 3] for i in range(0, len(joined), 10)]
    assert len(keys_b) == 700 and keys_b == sorted(keys_b)


def test_total_order_past_the_sample_is_refused(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": b"word\n" * (1 << 20)})
    with pytest.raises(UsageError, match="sequential: total order over"):
        sequential(job(jobs, "TotalCounts"), data, REDUCERS)


@pytest.mark.parametrize("fmt", ["text", "jsonlines", "pairs"])
@in_virtual_time
async def test_output_formats(jobs: Path, tmp_path: Path, fmt: str) -> None:
    data = write(tmp_path / "in", {"a": text(200, 11)})
    await compare(job(jobs, "Counts"), data, tmp_path, output_format=fmt)


@in_virtual_time
@pytest.mark.slow
async def test_raw_output_and_bytes_lines(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": text(200, 12)})
    raw, _ = await compare(job(jobs, "RawOut"), data, tmp_path)
    assert "\udcfe" in "".join(raw)  # bytes that are not UTF-8, kept to the byte
    await compare(job(jobs, "BytesLines"), data, tmp_path)
    records = write(tmp_path / "fixed", {"r1": fixed(300, 5)})
    await compare(job(jobs, "Sorter"), records, tmp_path)


def test_what_cmr_run_refuses_sequential_refuses(jobs: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "in", {"a": b"x\n"})
    with pytest.raises(UsageError, match="--lines"):
        sequential(job(jobs, "Counts"), data, REDUCERS, lines="crlf")
    with pytest.raises(UsageError, match="--input-format"):
        sequential(job(jobs, "Counts"), data, REDUCERS, input_format="xml")
    with pytest.raises(UsageError, match="total order applies to one-step jobs"):
        sequential(job(jobs, "Pipeline"), data, None, total_order=True)
    with pytest.raises(UsageError, match="does not exist"):
        sequential(job(jobs, "Counts"), tmp_path / "nowhere", REDUCERS)
