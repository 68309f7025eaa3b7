"""The CLI's shared options: one store URL, worker settings as JSON, lazy sub-apps."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cmr.cli.options import StoreFlags
from cmr.errors import UsageError
from cmr.settings import AwsSettings, BackendName, Store, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text",
    [
        "embedded",
        "aws",
        "aws://",
        "aws://b",
        "aws://b/t",
        "aws://b/t?prefix=p-&region=r&profile=n",
        "azure",
        "azure://acct",
        "azure://acct/data-1/Jobs1?prefix=wc-",
        "azure:///data-1/jobs",
    ],
)
def test_a_store_url_reads_back_as_the_same_store(text: str) -> None:
    store = Store.parse(text)
    assert Store.parse(store.url) == store


def test_a_store_url_names_every_part_and_defaults_the_rest() -> None:
    store = Store.parse("aws://b/t?prefix=p-&region=eu-west-1")
    assert store.backend == BackendName.aws
    assert store.aws == AwsSettings(bucket="b", table="t", queue_prefix="p-", region="eu-west-1")
    assert Store.parse("aws").aws == AwsSettings()
    assert Store.parse("embedded").backend == BackendName.embedded


@pytest.mark.parametrize("text", ["s3://b/t", "embedded://x", "aws://b/t?bucket=c", "nope"])
def test_a_store_url_cmr_cannot_read_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="store"):
        Store.parse(text)


def test_the_old_flags_override_their_part_of_the_store() -> None:
    flags = StoreFlags(store=Store.parse("aws://b/t?prefix=p-"), table="other")
    store = flags.resolve(BackendName.embedded, create=False)
    assert store.backend == BackendName.aws
    assert (store.aws.bucket, store.aws.table, store.aws.queue_prefix) == ("b", "other", "p-")
    assert store.aws.create is False
    assert StoreFlags().resolve(BackendName.aws).aws == AwsSettings()
    assert StoreFlags(bucket="x").resolve(BackendName.embedded).backend == BackendName.embedded
    assert StoreFlags(backend=BackendName.aws).resolve(BackendName.embedded).aws.bucket == (
        AwsSettings().bucket
    )


def test_worker_settings_travel_as_json_and_come_back_checked() -> None:
    ws = WorkerSettings(map_slots=3, memory_mb=7, idle_exit_s=2.5, message_bytes=4096)
    assert WorkerSettings.from_json(ws.to_json()) == ws
    assert WorkerSettings.from_json("{}") == WorkerSettings()
    for bad in ('{"memory_mb": "7"}', '{"memory_mb": true}', '{"visibility_s": 60}', "[]", "{"):
        with pytest.raises(UsageError, match="worker settings"):
            WorkerSettings.from_json(bad)


def test_cmr_run_imports_neither_the_sdk_nor_the_other_sub_apps() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cmr", "run", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert "run" in proc.stdout
    for heavy in ("boto3", "botocore", "aioboto3", "cmr.fleet", "cmr.cli.loadgen"):
        assert heavy not in modules


def _cmr(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow
def test_brackets_in_errors_and_paths_are_printed_as_they_are(tmp_path: Path) -> None:
    """Rich markup used to eat `words[i]` from a failed job's traceback and crash on `[/x]`
    (a MarkupError traceback instead of the one `error:` line)."""
    job = tmp_path / "brackets.py"
    job.write_text(
        "import cmr\n"
        "class Brackets(cmr.Job):\n"
        "    def map(self, key, line):\n"
        "        words = line.split()\n"
        "        raise ValueError(f'bad [/x] [bold]input[/bold] {words[0]}')\n"
        "        yield words[0], 1\n"
        "    def reduce(self, key, values):\n"
        "        yield key, sum(values)\n"
    )
    src = tmp_path / "in.txt"
    src.write_text("hello world\n")
    ok = tmp_path / "o[/x]k"
    wc = ROOT / "examples" / "wordcount.py"
    got = _cmr("run", str(wc), "-i", str(src), "-o", str(ok), cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "o[/x]k" in got.stderr
    assert (ok / "_SUCCESS").exists()

    got = _cmr(
        "run",
        str(job),
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--max-task-attempts",
        "1",
        cwd=tmp_path,
    )
    assert got.returncode == 1, got.stderr
    assert "MarkupError" not in got.stderr
    assert "bad [/x] [bold]input[/bold] hello" in got.stderr
    assert "words[0]" in got.stderr  # the traceback's source line, brackets kept


def test_worker_settings_out_of_range_are_refused_with_the_field_named() -> None:
    for bad, field_ in [
        ('{"map_slots": 0}', "map_slots"),
        ('{"processes": 0}', "processes"),
        ('{"reduce_slots": -1}', "reduce_slots"),
        ('{"memory_mb": -5}', "memory_mb"),
        ('{"poll_s": -1}', "poll_s"),
        ('{"idle_exit_s": -1}', "idle_exit_s"),
        ('{"janitor_s": 0}', "janitor_s"),
    ]:
        with pytest.raises(UsageError, match=field_):
            WorkerSettings.from_json(bad)
    with pytest.raises(UsageError, match="is not of type int"):
        WorkerSettings.from_json('{"map_slots": "2"}')
    assert WorkerSettings(memory_mb=0, idle_exit_s=0).memory_mb == 0  # spill all; exit at once


def test_an_azure_store_url_names_account_container_table_and_prefix() -> None:
    store = Store.parse("azure://acct/data-1/Jobs1?prefix=wc-")
    assert store.backend == BackendName.azure
    assert store.aws == AwsSettings(
        bucket="data-1", table="Jobs1", queue_prefix="wc-", account="acct"
    )
    assert Store.parse("azure").aws == AwsSettings()  # the account: the connection string's


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("azure://acct/Data/t1x", "container 'Data' is not a name Azure allows"),
        ("azure://acct/a--b/t1x", "container 'a--b'"),
        ("azure://acct/data/t-1", "table 't-1' is not a name Azure allows"),
        ("azure://acct/data/1tx", "table '1tx'"),
        ("azure://acct/data/t1x?prefix=Wc_", "prefix 'Wc_'"),
        ("azure://acct/data/t1x?prefix=" + "p" * 21, "longer than 20 characters"),
        ("azure://Acct/data/t1x", "account 'Acct' is not an Azure storage account"),
        ("azure://acct/data/t1x?region=x", "unknown setting 'region'"),
        ("azure://acct/data/t1x/more", "no more parts after TABLE"),
    ],
)
def test_an_azure_store_that_azure_would_refuse_is_refused_first(text: str, says: str) -> None:
    """Azure answers a bad name with a 400 that names no rule; the store URL names it."""
    with pytest.raises(UsageError, match=re.escape(says)):
        Store.parse(text)


@pytest.mark.parametrize(
    "text", ["aws:b", "aws://b/t?prefix=a&prefix=b", "aws://b/t?profile=", "aws://b/t?region="]
)
def test_a_store_url_that_says_something_odd_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="store"):
        Store.parse(text)


def test_a_bad_store_from_the_environment_says_where_it_came_from(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "CMR_STORE": "bogus"}
    got = _cmr("status", cwd=tmp_path, env=env)
    assert got.returncode == 1
    assert "store 'bogus'" in got.stderr and "$CMR_STORE" in got.stderr
    assert "Traceback" not in got.stderr
