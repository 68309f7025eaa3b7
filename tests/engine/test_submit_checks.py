"""Everything checkable before work starts is checked at submit: the input (links to
directories followed, loops refused, no files, special files), the output (probed, apart
from the input), every numeric option (a range named by its flag), the job class, the
command line and the store's reachability. Each refusal is one line that names the culprit
and what to do, comes at once (the pytest timeouts bound it) and writes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cmr.api import RunOptions, job_ref, run_on
from cmr.backends.base import Backend
from cmr.errors import UsageError
from cmr.places import check_apart
from cmr.settings import AwsSettings
from cmr.submit import submit

from .reference import counts_from_parts

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = str(ROOT / "examples" / "wordcount.py")
INDEX = str(ROOT / "examples" / "invertedindex.py")
pytestmark = pytest.mark.timeout(20)


def words(tmp: Path) -> Path:
    data = tmp / "in"
    (data / "d").mkdir(parents=True)
    (data / "a.txt").write_text("a b\n")
    (data / "d" / "more.txt").write_text("c d\n")
    return data


# ------------------------------------------------------------------------------ the input


async def test_a_link_to_a_directory_inside_is_read_as_a_copy(
    embedded: Backend, tmp_path: Path
) -> None:
    data = words(tmp_path)
    (data / "alias").symlink_to("d", target_is_directory=True)
    await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=1)
    assert counts_from_parts(tmp_path / "out", 1) == {"a": 1, "b": 1, "c": 2, "d": 2}


def _up(data: Path) -> Path:
    (data / "d" / "up").symlink_to("..", target_is_directory=True)
    return data / "d" / "up"


def _cycle(data: Path) -> Path:
    (data / "e").mkdir()
    (data / "d" / "to-e").symlink_to("../e", target_is_directory=True)
    (data / "e" / "to-d").symlink_to("../d", target_is_directory=True)
    return data / "e" / "to-d"  # the walk goes in by d/to-e, then meets e/to-d again


def _self(data: Path) -> Path:
    (data / "d" / "here").symlink_to(".", target_is_directory=True)
    return data / "d" / "here"


@pytest.mark.parametrize("make", [_up, _cycle, _self], ids=["ancestor", "cycle", "itself"])
async def test_a_loop_of_directory_links_is_refused_naming_the_link(
    embedded: Backend, tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    data = words(tmp_path)
    link = make(data)
    with pytest.raises(UsageError, match="a loop, which would be read forever") as caught:
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"))
    message = str(caught.value)
    assert str(link) in message and "\n" not in message and "Remove the link" in message
    assert not (tmp_path / "out").exists()


def _empty_dir(tmp: Path) -> str:
    (tmp / "in").mkdir()
    return str(tmp / "in")


def _only_subdirs(tmp: Path) -> str:
    (tmp / "in" / "a" / "b").mkdir(parents=True)
    return str(tmp / "in")


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "pipe")
    return str(tmp / "pipe")


def _fifo_inside(tmp: Path) -> str:
    words(tmp)
    os.mkfifo(tmp / "in" / "pipe")
    return str(tmp / "in")


def _dangling(tmp: Path) -> str:
    words(tmp)
    (tmp / "in" / "gone.txt").symlink_to("nowhere.txt")
    return str(tmp / "in")


def _not_utf8(tmp: Path) -> str:
    words(tmp)
    (tmp / "in" / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    return str(tmp / "in")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_empty_dir, r"in holds no files: put the input files in it"),
        (_only_subdirs, r"in holds no files"),
        (_fifo, r"pipe is a named pipe, not a file or a directory: give a file"),
        (_fifo_inside, r"pipe is a named pipe, not a regular file: remove it from the input"),
        (_dangling, r"gone.txt is a symbolic link to .*nowhere.txt, which does not exist: fix"),
        (_not_utf8, r"caf\\xe9.txt'.* not valid UTF-8 .*: rename it, or remove it"),
    ],
    ids=["empty-dir", "only-subdirs", "fifo", "fifo-inside", "dangling", "not-utf8"],
)
async def test_an_input_no_task_could_read_is_refused_at_submit(
    embedded: Backend, tmp_path: Path, make: Callable[[Path], str], said: str
) -> None:
    source = make(tmp_path)
    with pytest.raises(UsageError, match=said) as caught:
        await run_on(embedded, WORDCOUNT, source, str(tmp_path / "out"))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the output


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("{in}/out", r"the output .*/in/out lies inside the input .*/in: the next run would"),
        ("{in}/d", r"lies inside the input"),
        ("{tmp}", r"the input .*/in lies inside the output .*: publishing"),
        ("{in}", r"the output .*/in is the input .*/in"),
        ("{in}/../in/", r"is the input"),
        ("{link}/out", r"lies inside the input"),  # by a link to the input
    ],
)
async def test_an_output_that_overlaps_the_input_is_refused(
    embedded: Backend, tmp_path: Path, output: str, said: str
) -> None:
    data = words(tmp_path)
    (tmp_path / "link").symlink_to(data, target_is_directory=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = output.format(**{"in": data, "tmp": tmp_path, "link": tmp_path / "link"})
    with pytest.raises(UsageError, match=said):
        await run_on(embedded, WORDCOUNT, str(data), out, reducers=1)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_s3_places_overlap_by_bucket_and_key() -> None:
    for source, output in [
        ("s3://b/data", "s3://b/data/out/"),
        ("s3://b/data/", "s3://b/"),
        ("s3://b/data/x.txt", "s3://b/data"),
        ("s3://b/data/", "s3://b/data"),
    ]:
        with pytest.raises(UsageError, match=r"inside|is the input"):
            check_apart(source, output)
    for source, output in [
        ("s3://b/data/", "s3://b/data2/"),
        ("s3://b/data/", "s3://c/data/out/"),
        ("s3://b/data/", "/tmp/out"),
        ("in", "s3://b/in/"),
    ]:
        check_apart(source, output)  # apart


async def test_an_output_that_cannot_be_written_is_found_by_trying(
    embedded: Backend, tmp_path: Path
) -> None:
    # /proc takes no new files, even from root, to whom os.access says it is writable.
    data = words(tmp_path)
    with pytest.raises(UsageError, match=r"output /proc/cmr-out: its parent /proc cannot be "):
        await run_on(embedded, WORDCOUNT, str(data), "/proc/cmr-out")
    with pytest.raises(UsageError, match="output /dev/null exists and is not a directory"):
        await run_on(embedded, WORDCOUNT, str(data), "/dev/null")
    (tmp_path / "afile").write_text("x\n")
    with pytest.raises(UsageError, match=r"lies under .*afile, which is a file"):
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "afile" / "out"))
    assert not list(tmp_path.glob(".cmr-probe-*"))  # the probe left nothing


async def test_a_refused_job_makes_no_output_directory(embedded: Backend, tmp_path: Path) -> None:
    # The output is checked first but made last: a bad input leaves no empty directory.
    with pytest.raises(UsageError, match="holds no files"):
        await run_on(embedded, WORDCOUNT, _empty_dir(tmp_path), str(tmp_path / "a" / "out"))
    assert not (tmp_path / "a").exists()


# --------------------------------------------------------------------------- the options


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"reducers": 0}, "--reducers"),
        ({"reducers": 100_000}, "--reducers"),
        ({"visibility_timeout": 0}, "--visibility-timeout"),
        ({"visibility_timeout": 99_999}, "--visibility-timeout"),
        ({"task_timeout": -1}, "--task-timeout"),
        ({"task_timeout": 10**9}, "--task-timeout"),
        ({"max_task_attempts": 0}, "--max-task-attempts"),
        ({"max_task_attempts": 5_000}, "--max-task-attempts"),
        ({"max_task_failures": 0}, "--max-task-attempts"),  # its older name
        ({"workers": -1}, "--workers"),
        ({"workers": 0}, "--workers"),
        ({"workers": 65}, "--workers"),
        ({"lines": "dos"}, "--lines"),
    ],
)
async def test_every_option_out_of_range_is_refused_by_its_flag_with_the_reason(
    embedded: Backend, tmp_path: Path, options: dict[str, Any], flag: str
) -> None:
    data = words(tmp_path)
    with pytest.raises(UsageError) as caught:
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), **options)
    message = str(caught.value)
    assert message.startswith((flag, f"unknown {flag}")), message
    assert str(next(iter(options.values()))) in message and "\n" not in message
    assert not (tmp_path / "out").exists()


async def test_lines_reaches_the_job_record(embedded: Backend, tmp_path: Path) -> None:
    data = words(tmp_path)
    ref = job_ref(WORDCOUNT)
    options = RunOptions(lines="universal").job_options(ref)
    spec = await submit(
        embedded, ref, str(data), str(tmp_path / "out"), options, queue_prefix="t-",
        parallelism=1,
    )  # fmt: skip
    assert spec.lines == "universal"
    assert RunOptions().job_options(ref).lines == ""  # the job class's own


# ----------------------------------------------------------------------- the command line


def _cmr(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=15,
        env={**os.environ, "COLUMNS": "80", **(env or {})},
        check=False,
    )
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr.splitlines()


@pytest.mark.parametrize(
    ("args", "code", "named"),
    [
        (("--param", "foo"), 2, "--param: 'foo' is not KEY=VALUE: write --param NAME=VALUE"),
        (("--param", "=x"), 2, "--param"),
        (("--reducers", "abc"), 2, "'--reducers'"),
        (("--frobnicate",), 2, "No such option: --frobnicate"),
        (("--lines", "dos"), 1, "unknown --lines 'dos': use one of lf, universal"),
        (("--memory-mb", "-5"), 1, "--memory-mb must be between 1 and"),
        (("--memory-mb", "99999999"), 1, "it must fit in this machine's memory"),
        (("--max-task-attempts", "0"), 1, "--max-task-attempts must be between 1 and 1,000"),
        (("--task-timeout", "99999999"), 1, "--task-timeout must be between 1 and"),
    ],
)
def test_a_bad_run_option_is_one_error_line_naming_it(
    tmp_path: Path, args: tuple[str, ...], code: int, named: str
) -> None:
    data = words(tmp_path)
    got, lines = _cmr("run", WORDCOUNT, "-i", str(data), "-o", "out", *args, cwd=tmp_path)
    assert got == code, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("run", WORDCOUNT, "--output", "out"), "Missing option '--input'"),
        (("run", WORDCOUNT, "--input", "in"), "Missing option '--output'"),
        (("runn",), "No such command 'runn'"),
        (("--bogus",), "No such option: --bogus"),
        (("worker", "--map-slots", "x"), "'--map-slots'"),
    ],
)
def test_a_command_line_that_does_not_parse_is_one_line_exit_2(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    got, lines = _cmr(*args, cwd=tmp_path)
    assert got == 2, lines
    assert len(lines) == 1 and named in lines[0] and "--help`)" in lines[0], lines


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--processes", "0"), "--processes must be between 1 and 1,024"),
        (("--map-slots", "5000"), "--map-slots must be between 1 and 1,024"),
        (("--reduce-slots", "-1"), "--reduce-slots"),
        (("--memory-mb", "-1"), "--memory-mb must be between 0 and"),
        (("--idle-exit", "nan"), "--idle-exit"),
    ],
)
def test_a_bad_worker_option_is_refused_by_its_flag(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    got, lines = _cmr("worker", *args, cwd=tmp_path)
    assert got == 1 and len(lines) == 1 and named in lines[0], lines


def test_cmr_alone_still_shows_the_help(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cmr"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert "Usage:" in proc.stdout + proc.stderr and "run" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------ the store


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_endpoint_nothing_answers_is_named_at_once(tmp_path: Path) -> None:
    data = words(tmp_path)
    endpoint = _closed_port()
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    got, lines = _cmr(
        "run", WORDCOUNT, "-i", str(data), "-o", "out", "--store", "aws", cwd=tmp_path, env=env
    )
    assert got == 1 and len(lines) == 1, lines
    assert "cannot reach" in lines[0] and endpoint in lines[0], lines
    assert "scripts/stack.sh start" in lines[0]  # a local endpoint: start the stack
    assert not (tmp_path / "out").exists()


def test_no_credentials_say_how_to_give_them(tmp_path: Path) -> None:
    data = words(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "CMR_STORE"}
    env.update(
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_DEFAULT_REGION="us-east-1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cmr", "run", WORDCOUNT, "-i", str(data), "-o", "out",
         "--store", "aws"],
        cwd=tmp_path, capture_output=True, text=True, timeout=15, env=env, check=False,
    )  # fmt: skip
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert "no usable AWS credentials" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]


@pytest.mark.usefixtures("aws_stack")
async def test_an_empty_prefix_and_overlapping_s3_places_are_refused(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    common: dict[str, Any] = {"workers": 0, "detach": True, "aws": settings, "reducers": 1}
    empty = f"s3://{settings.bucket}/nothing-here/"
    with pytest.raises(UsageError, match=r"nothing-here/ holds no files .*upload the input"):
        await run_on(be, WORDCOUNT, empty, f"s3://{settings.bucket}/out/", **common)
    data = f"s3://{settings.bucket}/data/"
    await be.blobs.put(data + "a.txt", b"a b\n")
    with pytest.raises(UsageError, match="lies inside the input"):
        await run_on(be, WORDCOUNT, data, data + "out/", **common)
    assert [b.url for b in await be.blobs.list(f"s3://{settings.bucket}/")] == [data + "a.txt"]


# ------------------------------------------------------------------------- names, exactly

NAMES = ("fïlé with space.txt", "sub dir/ünï%20cödé.txt")


def _named_input(tmp: Path) -> Path:
    data = tmp / "in"
    for name in NAMES:
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text("word\n")
    return data


def _names_seen(out: Path) -> list[str]:
    [line] = [ln for p in sorted(out.glob("part-*")) for ln in p.read_text().splitlines()]
    key, _, value = line.partition("\t")
    assert key == "word"
    return list(json.loads(value))


async def test_map_gets_the_exact_input_name_on_the_embedded_backend(
    embedded: Backend, tmp_path: Path
) -> None:
    await run_on(embedded, INDEX, str(_named_input(tmp_path)), str(tmp_path / "out"), reducers=1)
    assert _names_seen(tmp_path / "out") == sorted(NAMES)


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_map_gets_the_same_input_name_on_the_aws_backend(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    await run_on(
        be, INDEX, str(_named_input(tmp_path)), str(tmp_path / "out"), reducers=1, workers=1,
        visibility_timeout=10, aws=settings,
    )  # fmt: skip
    assert _names_seen(tmp_path / "out") == sorted(NAMES)
