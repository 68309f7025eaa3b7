"""The CLI's shared options: one store URL, worker settings as JSON, lazy sub-apps."""

from __future__ import annotations

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
    ["embedded", "aws", "aws://", "aws://b", "aws://b/t", "aws://b/t?prefix=p-&region=r&profile=n"],
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
