"""``cmr loadgen`` end to end against the real local stores.

moto's DynamoDB, LocalStack's S3 and SQS (the ``aws_stack`` fixture; skipped when the stack is
down, failed in CI), moto's SimpleDB server (the ``simpledb`` fixture) and Azurite's tables
and blobs (the ``azure_stack`` fixture). Every run names
its target resource uniquely and checks it is gone afterwards; one jam also runs the engine
itself on the local stack (``--backend aws --workers 2``). Small runs: the point is the
commands and their JSON contract against each store, not the stores' numbers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from cmr.cli import app
from cmr.loadgen import report
from cmr.watch import Progress
from tests.stack import (
    AZURITE_CONNECTION_STRING,
    DYNAMODB_URL,
    LOCALSTACK_URL,
    remove_test_resources,
)

# Load runs of seconds each against the local stack's stores: the full suite's (the
# everyday subset keeps the simulated store's, tests/loadgen/test_cli.py).
pytestmark = pytest.mark.slow

ERROR_KEYS = {"throttled", "unavailable", "timeout", "conditional_failed", "other"}
LATENCY_KEYS = {"min", "q1", "median", "q3", "p95", "p99", "p999", "max", "mean", "sd",
                "outliers_pct"}  # fmt: skip
FLAG = {"dynamodb": "--target-table", "s3": "--target-bucket", "sqs": "--target-queue",
        "simpledb": "--target-domain", "azure-table": "--target-table",
        "azure-blob": "--target-container"}  # fmt: skip
AZURE_SERIES = {("get", "plain"), ("put", "plain"), ("put", "conditional")}
# the series each target reports with --consistent-ratio 0.5 --conditional-ratio 0.5
SERIES = {
    "dynamodb": {("get", "eventual"), ("get", "consistent"), ("put", "plain"),
                 ("put", "conditional")},
    "simpledb": {("get", "eventual"), ("get", "consistent"), ("put", "plain"),
                 ("put", "conditional")},
    "s3": {("get", "plain"), ("put", "plain")},
    "sqs": {("get", "plain"), ("put", "plain")},
    "azure-table": AZURE_SERIES,  # one kind of read (always strong); ETag conditions
    "azure-blob": AZURE_SERIES,
}  # fmt: skip


def _name(target: str = "") -> str:
    if target == "azure-table":  # Azure's table names are letters and digits
        return f"lgtest{uuid.uuid4().hex[:10]}"
    return f"lgtest-{uuid.uuid4().hex[:10]}"


def _ok(*args: str) -> str:
    result = CliRunner().invoke(app, ["loadgen", *args, "--no-progress"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _client(service: str, endpoint: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def _exists(target: str, name: str, sdb_url: str | None = None) -> bool:
    """Whether the run's table/bucket/queue/domain is still there."""
    try:
        if target in ("azure-table", "azure-blob"):
            return _azure_exists(target, name)
        if target == "dynamodb":
            return name in _client("dynamodb", DYNAMODB_URL).list_tables()["TableNames"]
        if target == "s3":
            buckets = _client("s3", LOCALSTACK_URL).list_buckets()["Buckets"]
            return name in {b["Name"] for b in buckets}
        if target == "sqs":
            urls = _client("sqs", LOCALSTACK_URL).list_queues(QueueNamePrefix=name)
            return any(u.rsplit("/", 1)[-1] == name for u in urls.get("QueueUrls", []))
        assert sdb_url is not None
        return name in _client("sdb", sdb_url).list_domains().get("DomainNames", [])
    except ClientError:  # pragma: no cover - a store that cannot even list
        return True


def _azure_exists(target: str, name: str) -> bool:
    from azure.data.tables import TableServiceClient
    from azure.storage.blob import BlobServiceClient

    if target == "azure-table":
        with TableServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as tables:
            return name in {t.name for t in tables.list_tables()}
    with BlobServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as blobs:
        return name in {c.name for c in blobs.list_containers()}


def _check_ops(ops: list[dict[str, Any]], total: int | None = None) -> None:
    """The jam contract of one ops list: keys, counts adding up, no unexplained errors."""
    assert ops
    if total is not None:
        assert sum(o["count"] for o in ops) == total
    for o in ops:
        assert {"op", "mode", "count", "ok", "errors", "throughput_ops_s", "latency_ms"} <= set(o)
        assert set(o["errors"]) == ERROR_KEYS
        assert o["ok"] + sum(o["errors"].values()) == o["count"]
        assert o["ok"] > 0 and o["errors"]["other"] == 0, o
        assert o["throughput_ops_s"] > 0
        lat = o["latency_ms"]
        assert set(lat) == LATENCY_KEYS
        assert 0 < lat["min"] <= lat["q1"] <= lat["median"] <= lat["q3"] <= lat["max"]
        assert lat["p95"] <= lat["p99"] <= lat["p999"] <= lat["max"]


def _check_jam(
    data: dict[str, Any], target: str, tasks: int, total: int | None, series: set[Any]
) -> None:
    assert {"target", "tasks", "duration_s", "ops"} <= set(data)
    assert (data["target"], data["tasks"]) == (target, tasks)
    assert data["duration_s"] > 0
    _check_ops(data["ops"], total)
    assert {(o["op"], o["mode"]) for o in data["ops"]} == series
    cpu = data["client_cpu"]
    assert cpu["tasks"] == tasks and cpu["cpu_per_op_us"] > 0


def _check_staleness(data: dict[str, Any], target: str) -> None:
    assert data["target"] == target
    assert {"freshness", "monotonic_read_violations", "read_your_writes_violations"} <= set(data)
    assert set(data["freshness"]) == {"eventual", "consistent"}
    reads = 0
    for bins in data["freshness"].values():
        for b in bins:
            assert {"lag_ms", "reads", "fresh"} <= set(b)
            assert b["lag_ms"][1] - b["lag_ms"][0] == pytest.approx(10)
            assert 0 <= b["fresh"] <= b["reads"]
            reads += b["reads"]
    assert reads > 0
    for key in ("monotonic_read_violations", "read_your_writes_violations"):
        assert set(data[key]) == {"pairs", "violations"}
        assert 0 <= data[key]["violations"] <= data[key]["pairs"]


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, str | None]]:
    """(target, SimpleDB URL or None) with the right endpoints set for the target."""
    target: str = request.param
    if target == "simpledb":
        yield target, request.getfixturevalue("simpledb")
    elif target.startswith("azure-"):
        request.getfixturevalue("azure_stack")
        yield target, None
    else:
        request.getfixturevalue("aws_stack")
        yield target, None


@pytest.mark.parametrize(
    "store", ["dynamodb", "s3", "sqs", "simpledb", "azure-table", "azure-blob"], indirect=True
)
def test_jam_against_each_store(store: tuple[str, str | None], tmp_path: Path) -> None:
    target, sdb_url = store
    name = _name(target)
    out = _ok(
        "jam", "--target", target, "--tasks", "2", "--readers", "4", "--writers", "4",
        "--items", "10", "--ops", "200", "--consistent-ratio", "0.5",
        "--conditional-ratio", "0.5", FLAG[target], name, "--json", str(tmp_path / "jam.json"),
    )  # fmt: skip
    _check_jam(_load(tmp_path / "jam.json"), target, 2, total=200, series=SERIES[target])
    assert "Median (ms)" in out
    assert not _exists(target, name, sdb_url)


@pytest.mark.alone  # its duration is bounded (below), and it is of real time here
def test_jam_with_the_engine_on_the_local_stack(
    aws_stack: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--backend aws --workers 2: two `cmr worker` processes run the load job's tasks, with
    the job's own queues, bucket and table on the local stack."""
    seen: list[Progress] = []
    update = report.LiveStatus.update

    def record(self: report.LiveStatus, progress: Progress) -> None:
        seen.append(progress)
        update(self, progress)

    monkeypatch.setattr(report.LiveStatus, "update", record)
    run, name = uuid.uuid4().hex[:8], _name()
    bucket, table, prefix = f"cmr-lgt-{run}", f"cmr-lgt-{run}", f"cmr-lgt-{run}-"
    try:
        _ok(
            "jam", "--target", "dynamodb", "--tasks", "2", "--readers", "4", "--writers", "4",
            "--items", "10", "--duration", "2", "--backend", "aws", "--workers", "2",
            "--bucket", bucket, "--table", table, "--queue-prefix", prefix,
            "--target-table", name, "--json", str(tmp_path / "jam.json"),
        )  # fmt: skip
        data = _load(tmp_path / "jam.json")
        plain = {("get", "eventual"), ("put", "plain")}
        _check_jam(data, "dynamodb", 2, total=None, series=plain)
        assert 1.5 < data["duration_s"] < 10
        assert not _exists("dynamodb", name)
        # the engine's progress reached the live line while the job ran
        assert seen and (seen[-1].maps_done, seen[-1].maps) == (2, 2)
    finally:
        remove_test_resources(bucket, table, prefix)


@pytest.mark.parametrize(
    "store", ["dynamodb", "simpledb", "azure-table", "azure-blob"], indirect=True
)
def test_staleness_against_keyed_stores(store: tuple[str, str | None], tmp_path: Path) -> None:
    target, sdb_url = store
    name = _name(target)
    _ok(
        "staleness", "--target", target, "--duration", "2", "--write-interval-ms", "200",
        "--readers", "4", FLAG[target], name, "--json", str(tmp_path / "stale.json"),
    )  # fmt: skip
    data = _load(tmp_path / "stale.json")
    _check_staleness(data, target)
    if target == "dynamodb":
        # a consistent read of DynamoDB always sees the latest completed write
        consistent = [b for b in data["freshness"]["consistent"] if b["reads"]]
        assert consistent and all(b["fresh"] == b["reads"] for b in consistent)
    if target.startswith("azure-"):
        # seed 004 on Azure: every read fresh, and no monotonic-read or read-your-writes
        # violation (its one kind of read is reported as eventual)
        assert data["stale_fraction"] == 0.0
        for key in ("monotonic_read_violations", "read_your_writes_violations"):
            assert data[key]["pairs"] > 0 and data[key]["violations"] == 0
    # moto ignores ConsistentRead: only the JSON contract is checked for simpledb
    assert not _exists(target, name, sdb_url)


def test_cpq_against_dynamodb(aws_stack: dict[str, str], tmp_path: Path) -> None:
    name = _name()
    out = _ok(
        "cpq", "--target", "dynamodb", "--p", "0,1", "--duration", "1.5",
        "--write-interval-ms", "200", "--target-table", name, "--json", str(tmp_path / "cpq.json"),
    )  # fmt: skip
    data = _load(tmp_path / "cpq.json")
    assert {"target", "points"} <= set(data)
    by_p = {p["p"]: p for p in data["points"]}
    assert set(by_p) == {0.0, 1.0}
    for p in data["points"]:
        assert {"p", "stale_fraction", "read_p95_ms", "write_p95_ms", "reads"} <= set(p)
        assert p["reads"] > 0 and 0 <= p["stale"] <= p["reads"]
        assert p["read_p95_ms"] > 0 and p["write_p95_ms"] > 0
    assert by_p[1.0]["stale_fraction"] == 0
    assert "stale fraction" in out
    assert not _exists("dynamodb", name)


def test_sweep_against_dynamodb(aws_stack: dict[str, str], tmp_path: Path) -> None:
    name = _name()
    out = _ok(
        "sweep", "--target", "dynamodb", "--concurrency", "1,4", "--ops", "100",
        "--target-table", name, "--json", str(tmp_path / "sweep.json"),
    )  # fmt: skip
    data = _load(tmp_path / "sweep.json")
    assert {"target", "items", "points"} <= set(data)
    assert [p["concurrency"] for p in data["points"]] == [1, 4]
    for p in data["points"]:
        assert {"concurrency", "total_s", "throughput_ops_s", "ops"} <= set(p)
        _check_ops(p["ops"], total=100)
        assert p["throughput_ops_s"] == pytest.approx(sum(o["ok"] for o in p["ops"]) / p["total_s"])
    assert "concurrency" in out
    assert not _exists("dynamodb", name)


def test_the_live_line_shows_tasks_done_while_the_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_load forwards the engine's progress to the CLI's live line (sim: no stack needed)."""
    lines: list[str] = []
    update = report.LiveStatus.update

    def record(self: report.LiveStatus, progress: Progress) -> None:
        update(self, progress)
        lines.append(self.line().plain)

    monkeypatch.setattr(report.LiveStatus, "update", record)
    result = CliRunner().invoke(
        app,
        ["loadgen", "jam", "--target", "sim", "--tasks", "2", "--readers", "2", "--writers",
         "2", "--duration", "3", "--progress", "--json", str(tmp_path / "jam.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert any("load tasks 0/2 done" in line for line in lines), lines
    # Live ops/s and errors from the tasks' own reports, before any task has finished.
    assert any(
        "load tasks 0/2 done" in line
        and "ops/s" in line
        and "errors" in line
        and "reported when the job ends" not in line
        for line in lines
    ), lines
    assert "load tasks 2/2 done" in lines[-1]
    assert all("jam sim: running" in line and " s · " in line for line in lines)
