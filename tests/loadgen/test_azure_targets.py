"""The Azure targets against Azurite (the ``azure_stack`` fixture), and their errors through
the real SDK.

Each target reads, writes and conditions as its module says (counted by Azure's operation
names, so "the same call" is checked, not assumed); seed 004's checks (freshness, monotonic
reads, read-your-writes) run against both and find what seed 004 found on Azure: every
read fresh. A run deletes only what it created. Errors Azurite never sends (503 ServerBusy,
a 500, silence) come from a scripted HTTP server named by the connection string, as a user
would name any other endpoint.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from typer.testing import CliRunner

from cmr.cli import app
from cmr.errors import UsageError
from cmr.loadgen.driver import run_task
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.summary import staleness_report
from cmr.loadgen.targets import OpFailed, Target, cleanup, make_target, prepare
from cmr.loadgen.targets.azure_table import partition
from tests.loadgen.conftest import Answer, ScriptedServer
from tests.stack import AZURITE_ACCOUNT, AZURITE_KEY

AZURE_TARGETS = ["azure-table", "azure-blob"]
KIND = {"azure-table": "table", "azure-blob": "container"}


def task_for(target: str, resources: dict[str, str], **kw: Any) -> LoadTask:
    return LoadTask(kind="jam", target=target, task=0, seed=1, ops=1, resources=resources, **kw)


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[Target], Any]]:
    targets: list[Target] = []

    async def open_(t: Target) -> Target:
        await t.setup()
        targets.append(t)
        return t

    yield open_
    for t in targets:
        await t.close()


async def failure(call: Any) -> OpFailed:
    with pytest.raises(OpFailed) as info:
        await call
    return info.value


def _tables() -> set[str]:
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    with TableServiceClient.from_connection_string(conn) as service:
        return {t.name for t in service.list_tables()}


def _containers() -> set[str]:
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    with BlobServiceClient.from_connection_string(conn) as service:
        return {c.name for c in service.list_containers()}


def _exists(target: str, name: str) -> bool:
    return name in (_tables() if target == "azure-table" else _containers())


# reads, writes and the two condition styles ---------------------------------------------------


@pytest.mark.usefixtures("azure_stack")
async def test_azure_table_reads_writes_and_both_condition_styles(opened: Any) -> None:
    prepared = await prepare("azure-table", {})
    try:
        task = task_for("azure-table", prepared.resources)
        a = await opened(make_target(task))
        b = await opened(make_target(task, condition="version"))
        assert not a.consistent_reads and a.conditional_writes
        assert (await a.get("p/k")).value is None  # no entity reads as nothing
        # a "consistent" read is the same single Query Entity as an eventual one
        await a.get("p/k", consistent=True)
        assert a.calls == {"table.QueryEntity": 2}
        # "absent": read, then write If-Match what was read (Insert Entity when nothing was)
        await a.put("p/k", 5, conditional=True)
        await a.put("p/k", 6, conditional=True)
        assert a.calls["table.InsertEntity"] == 1 and a.calls["table.UpdateEntity"] == 1
        assert a.calls["table.QueryEntity"] == 4
        # "version": b conditions on the ETag it read; a's plain write moves it on
        assert (await b.get("p/k")).value == 6
        await a.put("p/k", 7)
        assert a.calls["table.InsertOrReplaceEntity"] == 1
        failed = await failure(b.put("p/k", 8, conditional=True))
        assert (failed.kind, failed.retries) == ("conditional_failed", 0)
        # the failure's read told b the current ETag, so its next try holds
        await b.put("p/k", 9, conditional=True)
        assert (await a.get("p/k")).value == 9
        # a version condition on a key b never saw means "must not exist" (Insert Entity)
        await a.put("p/fresh", 1)
        assert (await failure(b.put("p/fresh", 2, conditional=True))).kind == "conditional_failed"
    finally:
        await cleanup(prepared)
        await cleanup(prepared)  # idempotent
    assert not _exists("azure-table", prepared.name)


@pytest.mark.usefixtures("azure_stack")
async def test_azure_blob_reads_writes_and_both_condition_styles(opened: Any) -> None:
    prepared = await prepare("azure-blob", {})
    try:
        task = task_for("azure-blob", prepared.resources)
        a = await opened(make_target(task))
        b = await opened(make_target(task, condition="version"))
        assert not a.consistent_reads and a.conditional_writes
        assert (await a.get("p/k")).value is None  # BlobNotFound reads as nothing
        await a.get("p/k", consistent=True)
        assert a.calls == {"blob.GetBlob": 2}
        # "absent": If-None-Match an ETag no blob has: one Put Blob, and it always holds,
        # even for concurrent writers of one key
        await asyncio.gather(*(a.put("p/k", v, conditional=True) for v in range(1, 9)))
        assert a.calls["blob.PutBlob"] == 8
        assert (await b.get("p/k")).value in range(1, 9)
        await a.put("p/k", 10)
        failed = await failure(b.put("p/k", 11, conditional=True))  # If-Match a stale ETag
        assert (failed.kind, failed.code) == ("conditional_failed", "ConditionNotMet")
        assert b.calls["blob.GetBlobProperties"] == 1  # the refresh
        await b.put("p/k", 12, conditional=True)
        assert (await a.get("p/k")).value == 12
        # never seen: If-None-Match: *, refused for a blob that exists
        await a.put("p/fresh", 1)
        failed = await failure(b.put("p/fresh", 2, conditional=True))
        assert (failed.kind, failed.code) == ("conditional_failed", "BlobAlreadyExists")
    finally:
        await cleanup(prepared)
        await cleanup(prepared)
    assert not _exists("azure-blob", prepared.name)


@pytest.mark.usefixtures("azure_stack")
@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_a_missing_table_or_container_is_other(target: str, opened: Any) -> None:
    resources = {KIND[target]: "cmrloadnosuch" if target == "azure-table" else "cmr-load-nosuch"}
    t = await opened(make_target(task_for(target, resources)))
    failed = await failure(t.get("k"))
    assert failed.kind == "other" and failed.code in ("TableNotFound", "ContainerNotFound")


# seed 004's checks -----------------------------------------------------------------------------


@pytest.mark.usefixtures("azure_stack")
@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_seed_004_checks_find_every_read_fresh(target: str) -> None:
    """Seed 004 measured Azure's tables and blobs: every read fresh, whatever the time since
    the write. The meter finds the same on Azurite: no stale read, no monotonic-read or
    read-your-writes violation, in enough pairs for that to mean something."""
    prepared = await prepare(target, {})
    try:
        task = LoadTask(
            kind="staleness",
            target=target,
            task=0,
            seed=1,
            readers=3,
            writers=1,
            items=2,
            duration_s=1.0,
            write_interval_ms=100,
            consistent_ratio=0.5,
            resources=prepared.resources,
        )
        report = staleness_report(await run_task(task))
    finally:
        await cleanup(prepared)
    assert report["writes"] >= 3 * 2 and report["reads"] >= 20
    assert report["unjudged_reads"] == 0
    # one kind of read: "consistent" ones are judged with the rest, as eventual reads
    bins = report["freshness"]
    assert sum(b["reads"] for b in bins["consistent"]) == 0
    judged = sum(b["reads"] for b in bins["eventual"])
    assert judged > 0 and sum(b["fresh"] for b in bins["eventual"]) == judged
    assert report["stale_fraction"] == 0.0
    mono = report["monotonic_read_violations"]
    assert mono["pairs"] >= 10 and mono["violations"] == 0
    ryw = report["read_your_writes_violations"]
    assert ryw["pairs"] >= report["writes"] - 2 and ryw["violations"] == 0
    assert report["gamma"]["max_ms"] == 0.0


# a run deletes only what it created -------------------------------------------------------------


@pytest.mark.usefixtures("azure_stack")
@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_an_existing_table_or_container_keeps_everything_but_the_runs_keys(
    target: str, opened: Any
) -> None:
    made = await prepare(target, {})
    theirs = {"data/x": 1, f"{made.resources['prefix']}item-0": 2}  # one under a prefix
    try:
        owner = await opened(make_target(task_for(target, made.resources)))
        for key, value in theirs.items():
            await owner.put(key, value)
        again = await prepare(target, {"run": "another", KIND[target]: made.name})
        assert again.created is None and again.resources["prefix"] == "cmr-load/another/"
        mine = [f"cmr-load/another/item-{i}" for i in range(3)]
        t = await opened(make_target(task_for(target, again.resources)))
        for key in mine:
            await t.put(key, 7)
        assert await cleanup(again, mine) == []
        assert _exists(target, made.name)
        for key in mine:
            assert (await t.get(key)).value is None
        for key, value in theirs.items():
            assert (await t.get(key)).value == value
    finally:
        await cleanup(made)
    assert not _exists(target, made.name)


def _recreate(target: str, name: str) -> None:
    """Someone else deletes the run's table or container and makes one of the same name."""
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    if target == "azure-table":
        with TableServiceClient.from_connection_string(conn) as tables:
            tables.delete_table(name)
            tables.create_table(name)
    else:
        with BlobServiceClient.from_connection_string(conn) as blobs:
            blobs.delete_container(name)
            blobs.create_container(name, metadata={"owner": "someone_else"})


def _remove(target: str, name: str) -> None:
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    if target == "azure-table":
        with TableServiceClient.from_connection_string(conn) as tables:
            tables.delete_table(name)
    else:
        with BlobServiceClient.from_connection_string(conn) as blobs:
            blobs.delete_container(name)


@pytest.mark.usefixtures("azure_stack")
@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_cleanup_leaves_a_table_or_container_that_is_no_longer_the_runs(target: str) -> None:
    prepared = await prepare(target, {})
    assert prepared.created == prepared.run
    _recreate(target, prepared.name)
    try:
        notes = await cleanup(prepared)
        assert notes and "no longer the one this run created" in notes[0]
        assert _exists(target, prepared.name)
    finally:
        _remove(target, prepared.name)


@pytest.mark.usefixtures("azure_stack")
async def test_table_keys_are_their_hex_partitions() -> None:
    """The load's keys hold "/", which Azure's keys refuse: each is the hex of its bytes."""
    prepared = await prepare("azure-table", {})
    try:
        t = make_target(task_for("azure-table", prepared.resources))
        await t.setup()
        await t.put("cmr-load/x/item-0", 3)
        await t.close()
        conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        with TableServiceClient.from_connection_string(conn) as tables:
            entity = tables.get_table_client(prepared.name).get_entity(
                partition("cmr-load/x/item-0"), ""
            )
        assert bytes.fromhex(entity["PartitionKey"]) == b"cmr-load/x/item-0"
    finally:
        await cleanup(prepared)


# the azure extra ------------------------------------------------------------------------------


@pytest.mark.parametrize("target", AZURE_TARGETS)
def test_without_the_azure_extra_the_target_names_it(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = {"azure-table": "azure.data.tables", "azure-blob": "azure.storage.blob"}[target]
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(UsageError, match=r"azure extra .* pip install 'cmr\[azure\]'"):
        make_target(task_for(target, {KIND[target]: "x"}))


# errors Azurite never sends, through the real SDK ---------------------------------------------

ODATA = {"Content-Type": "application/json;odata=minimalmetadata"}


def _point_at(server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    at = f"{server.url}/{AZURITE_ACCOUNT}"
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"TableEndpoint={at};BlobEndpoint={at}",
    )


def _error(status: int, code: str) -> Answer:
    body = f'{{"odata.error": {{"code": "{code}", "message": {{"value": "{code}"}}}}}}'
    return Answer(status, body, {**ODATA, "x-ms-error-code": code})


@pytest.mark.parametrize(
    ("answer", "kind"),
    [(_error(503, "ServerBusy"), "throttled"), (_error(500, "InternalError"), "unavailable")],
)
@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_service_errors_are_classified_and_retries_off_is_one_attempt(
    target: str,
    answer: Answer,
    kind: str,
    scripted_server: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    _point_at(scripted_server, monkeypatch)
    scripted_server.script = [answer]
    t = await opened(make_target(task_for(target, {KIND[target]: "cmrloadx"}, retries="off")))
    for call in (t.get("k"), t.put("k", 1)):
        failed = await failure(call)
        assert (failed.kind, failed.retries) == (kind, 0)
    assert scripted_server.requests == 2


async def test_sdk_retries_are_counted(
    scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, opened: Any
) -> None:
    _point_at(scripted_server, monkeypatch)
    entity = '{"PartitionKey": "6b", "RowKey": "", "v@odata.type": "Edm.Int64", "v": "7"}'
    etag = {"ETag": "W/\"datetime'2026-01-01T00%3A00%3A00.0000000Z'\""}
    scripted_server.script = [_error(503, "ServerBusy"), Answer(200, entity, {**ODATA, **etag})]
    task = task_for("azure-table", {"table": "cmrloadx"}, retries="standard")
    t = await opened(make_target(task))
    got = await t.get("k")
    assert (got.value, got.retries, scripted_server.requests) == (7, 1, 2)


@pytest.mark.parametrize("target", AZURE_TARGETS)
async def test_a_silent_server_is_timeout(
    target: str, scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, opened: Any
) -> None:
    _point_at(scripted_server, monkeypatch)
    scripted_server.silent = True
    task = task_for(target, {KIND[target]: "cmrloadx"})
    t = await opened(make_target(task, connect_timeout=0.5, read_timeout=0.3))
    started = time.monotonic()
    assert (await failure(t.get("k"))).kind == "timeout"
    assert time.monotonic() - started < 5


def test_without_the_azure_extra_the_cli_says_so_on_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "azure.data.tables", None)  # as if not installed
    result = CliRunner().invoke(
        app,
        ["loadgen", "jam", "--target", "azure-table", "--ops", "10", "--no-progress",
         "--json", str(tmp_path / "j.json")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "pip install 'cmr[azure]'" in result.stderr
    assert "azure-data-tables is not installed" in result.stderr
