"""Several inputs, globs, and Hadoop's hidden files (cmr.inputs): every input given is read
(the second --input once silently replaced the first), a glob reads its matches, and a
directory's files whose names start with ``_`` or ``.`` are not input (a TeraGen output's
``_SUCCESS`` and ``.crc`` files once failed terasort)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmr.adapters import job_args
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import UsageError, WireError
from cmr.jobload import load_job
from cmr.records import JobSpec
from cmr.settings import AwsSettings

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = str(ROOT / "examples" / "wordcount.py")
INDEX = str(ROOT / "examples" / "invertedindex.py")
TERASORT = str(ROOT / "examples" / "terasort.py")
pytestmark = pytest.mark.timeout(60)

# An mrjob job that counts lines by the URI Hadoop gives map for the file they come from.
BY_FILE = """\
from mrjob.compat import jobconf_from_env
from mrjob.job import MRJob


class MRLinesByFile(MRJob):
    def mapper(self, _, line):
        yield jobconf_from_env("mapreduce.map.input.file"), 1

    def reducer(self, uri, counts):
        yield uri, sum(counts)


if __name__ == "__main__":
    MRLinesByFile.run()
"""


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def cmr(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", "run", *argv],
        capture_output=True,
        text=True,
        cwd=tmp,
        # This tree's cmr, whichever one the venv installed.
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=50,
        check=False,
    )


def pairs(out: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for part in sorted(out.glob("part-*")):
        for line in part.read_text().splitlines():
            key, _, value = line.partition("\t")
            found[json.loads(key) if key.startswith('"') else key] = json.loads(value)
    return found


def two_dirs(tmp: Path) -> None:
    write(tmp / "A" / "x.txt", "apple apple\n")
    write(tmp / "B" / "x.txt", "banana\n")


# ------------------------------------------------------------------------- several inputs


def test_every_input_given_is_read_not_only_the_last(tmp_path: Path) -> None:
    two_dirs(tmp_path)
    done = cmr(tmp_path, WORDCOUNT, "-i", "A", "-i", "B", "-o", "out")
    assert done.returncode == 0, done.stderr
    assert pairs(tmp_path / "out") == {"apple": 2, "banana": 1}


async def test_the_api_takes_a_list_of_inputs(embedded: Backend, tmp_path: Path) -> None:
    two_dirs(tmp_path)
    write(tmp_path / "c.txt", "cherry\n")
    inputs = [str(tmp_path / "A"), str(tmp_path / "B"), str(tmp_path / "c.txt")]
    await run_on(embedded, WORDCOUNT, inputs, str(tmp_path / "out"), reducers=1)
    assert pairs(tmp_path / "out") == {"apple": 2, "banana": 1, "cherry": 1}


async def test_same_relative_names_stay_apart_below_the_common_directory(
    embedded: Backend, tmp_path: Path
) -> None:
    write(tmp_path / "logs" / "a" / "part-0", "one\n")
    write(tmp_path / "logs" / "b" / "part-0", "one\n")
    inputs = [str(tmp_path / "logs" / "a"), str(tmp_path / "logs" / "b")]
    await run_on(embedded, INDEX, inputs, str(tmp_path / "out"), reducers=1)
    assert pairs(tmp_path / "out") == {"one": ["a/part-0", "b/part-0"]}


async def test_one_input_keeps_its_names(embedded: Backend, tmp_path: Path) -> None:
    write(tmp_path / "in" / "d" / "x.txt", "one\n")
    write(tmp_path / "f.txt", "two\n")
    await run_on(embedded, INDEX, str(tmp_path / "in"), str(tmp_path / "o1"), reducers=1)
    await run_on(embedded, INDEX, [str(tmp_path / "f.txt")], str(tmp_path / "o2"), reducers=1)
    assert pairs(tmp_path / "o1") == {"one": ["d/x.txt"]}
    assert pairs(tmp_path / "o2") == {"two": ["f.txt"]}


async def test_a_file_given_twice_is_read_twice_as_hadoop_does(
    embedded: Backend, tmp_path: Path
) -> None:
    f = str(write(tmp_path / "w.txt", "kiwi\n"))
    await run_on(embedded, WORDCOUNT, [f, f], str(tmp_path / "out"), reducers=1)
    assert pairs(tmp_path / "out") == {"kiwi": 2}


@pytest.mark.slow
def test_the_output_inside_any_input_is_refused(tmp_path: Path) -> None:
    two_dirs(tmp_path)
    done = cmr(tmp_path, WORDCOUNT, "-i", "A", "-i", "B", "-o", "A/out")
    assert done.returncode == 1
    assert "the output A/out lies inside the input A" in done.stderr
    assert not (tmp_path / "A" / "out").exists()
    done = cmr(tmp_path, WORDCOUNT, "-i", "A/x.txt", "-i", "B", "-o", "A")
    assert "the input A/x.txt lies inside the output A" in done.stderr


@pytest.mark.slow
def test_mrjob_gets_each_files_own_uri_with_several_inputs(tmp_path: Path) -> None:
    two_dirs(tmp_path)
    write(tmp_path / "c.txt", "cherry\n")
    job = write(tmp_path / "by_file.py", BY_FILE)
    done = cmr(tmp_path, str(job), "-i", "A", "-i", "B", "-i", "c.txt", "-o", "out")
    assert done.returncode == 0, done.stderr
    base = f"file://{tmp_path}"
    assert pairs(tmp_path / "out") == {
        f"{base}/A/x.txt": 1,
        f"{base}/B/x.txt": 1,
        f"{base}/c.txt": 1,
    }


@pytest.mark.slow
def test_mrjob_gets_its_one_files_uri(tmp_path: Path) -> None:
    write(tmp_path / "c.txt", "cherry\n")
    job = write(tmp_path / "by_file.py", BY_FILE)
    done = cmr(tmp_path, str(job), "-i", "c.txt", "-o", "out")
    assert done.returncode == 0, done.stderr
    assert pairs(tmp_path / "out") == {f"file://{tmp_path}/c.txt": 1}


# ------------------------------------------------------------------------------------ globs


@pytest.mark.slow
def test_a_glob_reads_its_matches(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "2026-11-01.txt", "nov\n")
    write(tmp_path / "logs" / "2026-11-02.txt", "nov\n")
    write(tmp_path / "logs" / "2026-12-01.txt", "dec\n")
    done = cmr(tmp_path, WORDCOUNT, "-i", "logs/2026-11-*", "-o", "out")
    assert done.returncode == 0, done.stderr
    assert pairs(tmp_path / "out") == {"nov": 2}
    done = cmr(tmp_path, WORDCOUNT, "-i", "logs/2026-1[2]-0?.txt", "-o", "out2")
    assert pairs(tmp_path / "out2") == {"dec": 1}


def test_a_glob_that_matches_nothing_is_an_error_naming_it(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "a.txt", "x\n")
    done = cmr(tmp_path, WORDCOUNT, "-i", "logs", "-i", "logs/2027-*", "-o", "out")
    assert done.returncode == 1
    assert "input pattern logs/2027-* matches no files" in done.stderr
    assert not (tmp_path / "out").exists()


async def test_a_glob_of_directories_names_files_below_their_common_directory(
    embedded: Backend, tmp_path: Path
) -> None:
    write(tmp_path / "runs" / "r1" / "part-0", "one\n")
    write(tmp_path / "runs" / "r2" / "part-0", "one\n")
    await run_on(embedded, INDEX, str(tmp_path / "runs" / "r*"), str(tmp_path / "o"), reducers=1)
    assert pairs(tmp_path / "o") == {"one": ["r1/part-0", "r2/part-0"]}


def test_an_output_a_glob_would_match_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "a.txt", "x\n")
    done = cmr(tmp_path, WORDCOUNT, "-i", "logs/*", "-o", "logs/out")
    assert done.returncode == 1
    assert "lies inside the input logs/*" in done.stderr


# ----------------------------------------------------------------------------- hidden files


def teragen(where: Path, records: int = 30) -> None:
    """What Hadoop's TeraGen leaves: records, an empty _SUCCESS, and checksum files."""
    rows = b"".join(b"%010d" % (records - i) + b"x" * 88 + b"\r\n" for i in range(records))
    write(where / "part-m-00000", rows)
    write(where / "_SUCCESS", b"")
    write(where / ".part-m-00000.crc", b"crc12345" * 2)
    write(where / "._SUCCESS.crc", b"crc12345")


@pytest.mark.slow
def test_terasort_reads_a_teragen_directory(tmp_path: Path) -> None:
    teragen(tmp_path / "teragen")
    done = cmr(tmp_path, TERASORT, "-i", "teragen", "-o", "sorted")
    assert done.returncode == 0, done.stderr
    data = b"".join(p.read_bytes() for p in sorted((tmp_path / "sorted").glob("part-*")))
    assert len(data) == 30 * 100


async def test_hidden_files_and_directories_below_an_input_are_not_read(
    embedded: Backend, tmp_path: Path
) -> None:
    write(tmp_path / "in" / "a.txt", "seen\n")
    write(tmp_path / "in" / "d" / "b.txt", "seen\n")
    for hidden in ("_SUCCESS", ".a.txt.crc", "_logs/history", ".git/HEAD", "d/_tmp", "d/.x"):
        write(tmp_path / "in" / hidden, "hidden\n")
    await run_on(embedded, WORDCOUNT, str(tmp_path / "in"), str(tmp_path / "out"), reducers=1)
    assert pairs(tmp_path / "out") == {"seen": 2}


async def test_a_hidden_file_named_outright_is_read(embedded: Backend, tmp_path: Path) -> None:
    f = write(tmp_path / "in" / "_notes.txt", "named\n")
    await run_on(embedded, WORDCOUNT, str(f), str(tmp_path / "out"), reducers=1)
    assert pairs(tmp_path / "out") == {"named": 1}


async def test_a_glob_skips_hidden_matches_unless_it_asks_for_them(
    embedded: Backend, tmp_path: Path
) -> None:
    write(tmp_path / "in" / "part-0", "part\n")
    write(tmp_path / "in" / "_SUCCESS", "marker\n")
    write(tmp_path / "in" / ".part-0.crc", "crc\n")
    await run_on(embedded, WORDCOUNT, str(tmp_path / "in" / "*"), str(tmp_path / "o1"))
    assert pairs(tmp_path / "o1") == {"part": 1}
    await run_on(embedded, WORDCOUNT, str(tmp_path / "in" / "_*"), str(tmp_path / "o2"))
    assert pairs(tmp_path / "o2") == {"marker": 1}


def test_a_directory_of_hidden_files_only_says_so(tmp_path: Path) -> None:
    write(tmp_path / "in" / "_SUCCESS", "")
    done = cmr(tmp_path, WORDCOUNT, "-i", "in", "-o", "out")
    assert done.returncode == 1
    assert "holds no files but hidden ones" in done.stderr


@pytest.mark.slow
def test_a_cmr_output_read_as_input_is_read_as_its_manifest_says(tmp_path: Path) -> None:
    write(tmp_path / "in" / "w.txt", "fig fig\n")
    assert cmr(tmp_path, WORDCOUNT, "-i", "in", "-o", "out").returncode == 0
    write(tmp_path / "out" / "part-09999", "leftover of an older run\n")
    done = cmr(tmp_path, INDEX, "-i", "out", "-i", "in", "-o", "index")
    assert done.returncode == 0, done.stderr
    index = pairs(tmp_path / "index")
    assert "leftover" not in index  # a part the manifest does not list
    sources = index["fig"]
    assert isinstance(sources, list)
    first, *rest = sources
    assert first == "in/w.txt"
    assert rest and all(s.startswith("out/part-") and s != "out/part-09999" for s in rest)


# ------------------------------------------------------------------------------- the record


def _spec(**fields: object) -> JobSpec:
    item: dict[str, object] = {
        "job": "wordcount.py", "digest": "0" * 64, "params": {}, "maps": 1, "partitions": 1,
        "output": "s3://b/out/", "scratch": "s3://b/scratch/", "queue_prefix": "cmr-",
        "visibility_s": 60, "max_task_failures": 3, "input_root": "s3://b/a/",
    }  # fmt: skip
    item.update(fields)
    return JobSpec.from_item("20261126-000000-0123456789abcdef", item)


def test_the_record_names_every_root_and_glob_and_owns_only_their_files() -> None:
    spec = _spec(
        input_roots=["s3://b/a/", "s3://b/c.txt", "file:///data/in/"],
        input_globs=["s3://b/logs/2026-11-*", "file:///data/runs/r*"],
    )
    assert JobSpec.from_item(spec.job_id, spec.to_item()) == spec
    owned = (
        "s3://b/a/x", "s3://b/c.txt", "file:///data/in/x", "s3://b/logs/2026-11-01",
        "s3://b/logs/2026-11-02/part-0", "file:///data/runs/r1/part-0",
    )  # fmt: skip
    not_owned = (
        "s3://b/ab", "s3://b/c.txt2", "s3://b/logs/2026-12-01", "s3://b/logs/2026-1/x",
        "file:///data/runs/x", "file:///data/runs/r1/../../secret", "file:///etc/passwd",
        "file:///data/in/../secret",
    )  # fmt: skip
    assert all(spec.owns_input(u) for u in owned)
    assert not any(spec.owns_input(u) for u in not_owned)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input_roots", "s3://b/a/"),
        ("input_roots", ["ftp://x/"]),
        ("input_globs", ["file:///a/../b*"]),
        ("input_globs", ["s3://b/x"] * 257),
    ],
)
def test_the_record_refuses_roots_that_are_not_urls(field: str, value: object) -> None:
    with pytest.raises(WireError, match=field):
        _spec(**{field: value})


async def test_more_inputs_than_a_record_holds_are_refused_but_a_glob_is_one(
    embedded: Backend, tmp_path: Path
) -> None:
    files = [str(write(tmp_path / "in" / f"{i:03d}.txt", "x\n")) for i in range(257)]
    with pytest.raises(UsageError, match="257 inputs given"):
        await run_on(embedded, WORDCOUNT, files, str(tmp_path / "o1"))
    assert not (tmp_path / "o1").exists()
    await run_on(embedded, WORDCOUNT, str(tmp_path / "in" / "*.txt"), str(tmp_path / "o2"))
    assert pairs(tmp_path / "o2") == {"x": 257}


def test_no_input_is_refused() -> None:
    from cmr.submit import input_list

    with pytest.raises(UsageError, match="no --input given"):
        input_list([])
    with pytest.raises(UsageError, match="is empty"):
        input_list(["a", " "])


# ----------------------------------------------------------------------- S3 (the local stack)


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:'pipes' is deprecated:DeprecationWarning")  # mrjob's
@pytest.mark.slow
async def test_s3_inputs_globs_and_hidden_keys(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    b = f"s3://{settings.bucket}"
    for key, text in {
        "logs/2026-11-01/part-0": "nov\n",
        "logs/2026-11-01/_SUCCESS": "hidden\n",
        "logs/2026-11-02/part-0": "nov\n",
        "logs/2026-11-02/.part-0.crc": "hidden\n",
        "logs/2026-11-02/_temporary/0/part-9": "hidden\n",
        "logs/2026-12-01/part-0": "dec\n",
        "other/part-0": "other\n",
    }.items():
        await be.blobs.put(f"{b}/{key}", text.encode())
    write(tmp_path / "by_file.py", BY_FILE)
    job = load_job(str(tmp_path / "by_file.py"))
    params, _ = job_args(job, [])
    result = await run_on(
        be, job, [f"{b}/logs/2026-11-*", f"{b}/other"],
        str(tmp_path / "out"), reducers=1, workers=1, visibility_timeout=10, aws=settings,
        params=params,
    )  # fmt: skip
    assert pairs(tmp_path / "out") == {
        f"{b}/logs/2026-11-01/part-0": 1,
        f"{b}/logs/2026-11-02/part-0": 1,
        f"{b}/other/part-0": 1,
    }
    assert result.record["input"] == f"{b}/logs/2026-11-*, {b}/other"  # what `cmr status` shows
    with pytest.raises(UsageError, match=r"input pattern s3://\S+/logs/2027-\* matches no"):
        await run_on(
            be, WORDCOUNT, [f"{b}/logs/2027-*"], str(tmp_path / "o2"), workers=1, aws=settings
        )


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_local_inputs_staged_for_aws_keep_apart_and_skip_hidden(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    write(tmp_path / "logs" / "a" / "part-0", "one\n")
    write(tmp_path / "logs" / "b" / "part-0", "one\n")
    write(tmp_path / "logs" / "b" / "_SUCCESS", "hidden\n")
    f = str(write(tmp_path / "logs" / "c.txt", "one\n"))
    inputs = [str(tmp_path / "logs" / "a"), str(tmp_path / "logs" / "b"), f, f]
    await run_on(
        be, INDEX, inputs, str(tmp_path / "out"), reducers=1, workers=1, visibility_timeout=10,
        aws=settings,
    )  # fmt: skip
    assert pairs(tmp_path / "out") == {"one": ["a/part-0", "b/part-0", "c.txt"]}


@pytest.mark.slow
def test_split_mb_sets_the_map_tasks_and_refuses_nonsense(tmp_path: Path) -> None:
    """`cmr run --split-mb`: 3,000 bytes of TeraGen rows in splits of 0.001 MB (a record
    each, at least: thirty map tasks) sort as one would; 0 is refused before anything is
    submitted."""
    teragen(tmp_path / "teragen")
    done = cmr(tmp_path, TERASORT, "-i", "teragen", "-o", "sorted", "--split-mb", "0.001")
    assert done.returncode == 0, done.stderr
    data = b"".join(p.read_bytes() for p in sorted((tmp_path / "sorted").glob("part-*")))
    assert len(data) == 30 * 100
    keys = [data[i : i + 10] for i in range(0, len(data), 100)]
    assert keys == sorted(keys)
    refused = cmr(tmp_path, TERASORT, "-i", "teragen", "-o", "other", "--split-mb", "0")
    assert refused.returncode == 2 and "--split-mb" in refused.stderr
    assert not (tmp_path / "other").exists()
