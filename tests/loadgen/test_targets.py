"""Each target against its real local service, and error classes from real SDK errors.

DynamoDB runs on moto's server, S3 and SQS on LocalStack (the ``aws_stack`` fixture),
SimpleDB on moto's server. Errors the local services never send (throttling, 503s) come from
a scripted HTTP server through the real SDK: the bodies are the services' documented ones,
SimpleDB's being seed 000's own.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cmr.loadgen.sim import SimConfig
from cmr.loadgen.spec import LoadTask
from cmr.loadgen.targets import (
    MARKER,
    RESOURCE,
    OpFailed,
    SimTarget,
    Target,
    classify,
    cleanup,
    make_target,
    prepare,
)
from tests.loadgen.conftest import Answer, ScriptedServer
from tests.stack import free_port


def task_for(target: str, resources: dict[str, str], **kw: Any) -> LoadTask:
    return LoadTask(kind="jam", target=target, task=0, seed=1, ops=1, resources=resources, **kw)


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[Target], Any]]:
    """Set targets up, and close them after the test."""
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


# real services ------------------------------------------------------------------------------


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_dynamodb_reads_writes_and_both_condition_styles(opened: Any) -> None:
    prepared = await prepare("dynamodb", {})
    resources = prepared.resources
    try:
        task = task_for("dynamodb", resources)
        a = await opened(make_target(task))
        b = await opened(make_target(task, condition="version"))
        assert a.consistent_reads and a.conditional_writes
        assert (await a.get("k", consistent=True)).value is None
        # "absent": attribute_not_exists of a fictitious attribute always holds
        for value in (5, 6):
            await a.put("k", value, conditional=True)
        assert (await a.get("k", consistent=True)).value == 6
        assert (await a.get("k", consistent=False)).value in (5, 6)
        # "version": b conditions on the version it read; a's write moves it on
        assert (await b.get("k", consistent=True)).value == 6
        await a.put("k", 7, conditional=False)
        failed = await failure(b.put("k", 8, conditional=True))
        assert failed.kind == "conditional_failed"
        # the failure told b the current version, so its next try holds
        await b.put("k", 9, conditional=True)
        assert (await a.get("k", consistent=True)).value == 9
        # a version condition on a key b never saw means "must not exist"
        await a.put("fresh", 1)
        assert (await failure(b.put("fresh", 2, conditional=True))).kind == "conditional_failed"
    finally:
        await cleanup(prepared)
        await cleanup(prepared)  # idempotent


@pytest.mark.usefixtures("aws_stack")
async def test_dynamodb_missing_table_is_other(opened: Any) -> None:
    t = await opened(make_target(task_for("dynamodb", {"table": "cmr-load-no-such-table"})))
    assert (await failure(t.get("k", consistent=True))).kind == "other"


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_s3_plain_reads_and_writes(opened: Any) -> None:
    prepared = await prepare("s3", {})
    resources = prepared.resources
    try:
        t = await opened(make_target(task_for("s3", resources)))
        assert not t.consistent_reads and not t.conditional_writes
        assert (await t.get("k")).value is None  # NoSuchKey reads as nothing
        await t.put("k", 41, conditional=True)
        await t.put("k", 42)
        assert (await t.get("k", consistent=True)).value == 42
    finally:
        await cleanup(prepared)
        await cleanup(prepared)


@pytest.mark.usefixtures("aws_stack")
async def test_sqs_send_receive_delete(opened: Any) -> None:
    prepared = await prepare("sqs", {})
    resources = prepared.resources
    try:
        t = await opened(make_target(task_for("sqs", resources)))
        for v in (1, 2, 3):
            await t.put("ignored", v)
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            got = await t.get("ignored")
            if got.value is not None:
                seen.add(got.value)
        assert seen == {1, 2, 3}
        assert (await t.get("ignored")).value is None  # deleted on receipt: the queue is empty
    finally:
        await cleanup(prepared)
        await cleanup(prepared)


@pytest.mark.usefixtures("simpledb")
async def test_simpledb_on_moto(opened: Any) -> None:
    prepared = await prepare("simpledb", {})
    resources = prepared.resources
    try:
        t = await opened(make_target(task_for("simpledb", resources)))
        assert t.consistent_reads and t.conditional_writes
        assert (await t.get("item", consistent=True)).value is None
        await t.put("item", 3, conditional=True)  # Expected: fictitious attribute absent
        await t.put("item", 4)
        assert (await t.get("item", consistent=True)).value == 4
        assert (await t.get("item", consistent=False)).value == 4
    finally:
        await cleanup(prepared)


@pytest.mark.usefixtures("simpledb")
@pytest.mark.slow
async def test_moto_ignores_simpledb_expected(opened: Any) -> None:
    """moto 5.2 accepts Expected but never checks it, so conditional failures cannot be seen
    on SimpleDB locally; this pins that limit (it fails once moto implements Expected)."""
    prepared = await prepare("simpledb", {})
    resources = prepared.resources
    try:
        task = task_for("simpledb", resources)
        a = await opened(make_target(task, condition="version"))
        b = await opened(make_target(task, condition="version"))
        await a.put("item", 1, conditional=True)
        await b.put("item", 2, conditional=True)  # real SimpleDB: ConditionalCheckFailed
        assert (await a.get("item", consistent=True)).value == 2
    finally:
        await cleanup(prepared)


def _domains(url: str) -> list[str]:
    import boto3

    client = boto3.client("sdb", endpoint_url=url, region_name="us-east-1")
    return list(client.list_domains().get("DomainNames", []))


def _attributes(url: str, domain: str, item: str) -> dict[str, str]:
    import boto3

    client = boto3.client("sdb", endpoint_url=url, region_name="us-east-1")
    got = client.get_attributes(DomainName=domain, ItemName=item, ConsistentRead=True)
    return {a["Name"]: a["Value"] for a in got.get("Attributes", [])}


async def test_simpledb_standard_endpoint_variable_wins(
    simpledb: str, scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, opened: Any
) -> None:
    """AWS_ENDPOINT_URL_SIMPLEDB (botocore's own name) wins over cmr's AWS_ENDPOINT_URL_SDB
    alias for every client the load generator makes: the domain is made, written, read and
    deleted where the standard variable points, and the server the alias names hears
    nothing (not even a first try)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SDB", scripted_server.url)
    scripted_server.script = [Answer(500)]
    prepared = await prepare("simpledb", {})
    domain = prepared.resources["domain"]
    try:
        assert domain in _domains(simpledb)
        t = await opened(make_target(task_for("simpledb", prepared.resources)))
        await t.put("item", 7)
        assert (await t.get("item", consistent=True)).value == 7
        assert _attributes(simpledb, domain, "item")  # the target wrote it there
    finally:
        await cleanup(prepared)
    assert domain not in _domains(simpledb)
    assert scripted_server.requests == 0


async def test_simpledb_alias_is_used_when_the_standard_variable_is_unset(
    simpledb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_SIMPLEDB")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SDB", simpledb)
    prepared = await prepare("simpledb", {})
    assert prepared.resources["domain"] in _domains(simpledb)
    await cleanup(prepared)


# the simulated store ----------------------------------------------------------------------------


async def test_sim_over_capacity_is_unavailable_and_conditions_fail() -> None:
    t = SimTarget(SimConfig(capacity_ops_s=10, burst_s=0.1, read_median_ms=1, write_median_ms=1))
    kinds = []
    for i in range(5):
        try:
            await t.put("k", i)
            kinds.append("ok")
        except OpFailed as exc:
            kinds.append(exc.kind)
    assert kinds[0] == "ok" and set(kinds[1:]) == {"unavailable"}

    a = SimTarget(SimConfig(seed=1))
    b = SimTarget(store=a.store)  # two clients of one store
    await a.put("k", 1, conditional=True)  # version 0: must not exist
    assert (await b.get("k", consistent=True)).value == 1
    await a.put("k", 2)
    assert (await failure(b.put("k", 3, conditional=True))).kind == "conditional_failed"
    await b.put("k", 3, conditional=True)  # refreshed by the failure


# errors services send under load, through the real SDK ------------------------------------------

DDB_JSON = {"Content-Type": "application/x-amz-json-1.0"}
SIMPLEDB_503 = (
    '<?xml version="1.0"?>\n<Response><Errors><Error><Code>ServiceUnavailable</Code>'
    "<Message>Service AmazonSimpleDB is currently unavailable. Please try again later</Message>"
    "</Error></Errors><RequestID>613df115-aee4-f86f-7a22-9a94f9b1633c</RequestID></Response>"
)


def ddb_error(code: str) -> str:
    return f'{{"__type": "com.amazonaws.dynamodb.v20120810#{code}", "message": "{code}"}}'


@pytest.mark.parametrize(
    "code",
    ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"],
)
async def test_dynamodb_throttling_is_throttled_and_retries_off_is_one_attempt(
    code: str,
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", scripted_server.url)
    scripted_server.script = [Answer(400, ddb_error(code), DDB_JSON)]
    t = await opened(make_target(task_for("dynamodb", {"table": "t"}, retries="off")))
    failed = await failure(t.put("k", 1))
    assert (failed.kind, failed.retries, scripted_server.requests) == ("throttled", 0, 1)


async def test_sdk_retries_are_counted(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", scripted_server.url)
    scripted_server.script = [
        Answer(503, ddb_error("ServiceUnavailableException"), DDB_JSON),
        Answer(200, '{"Item": {"k": {"S": "k"}, "v": {"N": "7"}}}', DDB_JSON),
    ]
    t = await opened(make_target(task_for("dynamodb", {"table": "t"}, retries="standard")))
    got = await t.get("k", consistent=True)
    assert (got.value, got.retries, scripted_server.requests) == (7, 1, 2)


async def test_sdk_retries_on_a_failure_are_counted(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", scripted_server.url)
    scripted_server.script = [Answer(503, ddb_error("ServiceUnavailableException"), DDB_JSON)]
    t = await opened(make_target(task_for("dynamodb", {"table": "t"}, retries="standard")))
    failed = await failure(t.get("k"))  # botocore's standard mode: 3 attempts
    assert (failed.kind, failed.retries, scripted_server.requests) == ("unavailable", 2, 3)


async def test_simpledb_503_is_unavailable(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SDB", scripted_server.url)
    scripted_server.script = [Answer(503, SIMPLEDB_503, {"Content-Type": "text/xml"})]
    t = await opened(make_target(task_for("simpledb", {"domain": "d"})))
    for call in (t.get("k", consistent=True), t.put("k", 1, conditional=True)):
        assert (await failure(call)).kind == "unavailable"


async def test_s3_slowdown_is_throttled(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", scripted_server.url)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        "<Message>Please reduce your request rate.</Message></Error>"
    )
    scripted_server.script = [Answer(503, body, {"Content-Type": "application/xml"})]
    t = await opened(make_target(task_for("s3", {"bucket": "b"})))
    assert (await failure(t.put("k", 1))).kind == "throttled"
    assert (await failure(t.get("k"))).kind == "throttled"


async def test_sqs_throttling_is_throttled(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", scripted_server.url)
    json_10 = {"Content-Type": "application/x-amz-json-1.0"}
    scripted_server.script = [
        Answer(200, f'{{"QueueUrl": "{scripted_server.url}/000000000000/q"}}', json_10),
        Answer(
            400,
            '{"__type": "com.amazonaws.sqs#RequestThrottled", "message": "Rate exceeded"}',
            {**json_10, "x-amzn-query-error": "AWS.SimpleQueueService.RequestThrottled;Sender"},
        ),
    ]
    t = await opened(make_target(task_for("sqs", {"queue": "q"})))
    assert (await failure(t.put("k", 1))).kind == "throttled"


async def test_silent_server_is_timeout(
    scripted_server: ScriptedServer,
    test_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    opened: Any,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", scripted_server.url)
    scripted_server.silent = True
    task = task_for("dynamodb", {"table": "t"})
    t = await opened(make_target(task, connect_timeout=0.5, read_timeout=0.3))
    started = time.monotonic()
    failed = await failure(t.get("k"))
    assert failed.kind == "timeout" and time.monotonic() - started < 5


async def test_closed_port_is_other(
    test_credentials: None, monkeypatch: pytest.MonkeyPatch, opened: Any
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{free_port()}")
    t = await opened(make_target(task_for("dynamodb", {"table": "t"}), connect_timeout=0.5))
    assert (await failure(t.put("k", 1))).kind == "other"


def test_classify_plain_timeouts() -> None:
    assert classify(TimeoutError()) == "timeout"
    assert classify(ValueError("x")) == "other"


# a run deletes only what it created -----------------------------------------------------------


def _admin(service: str) -> Any:
    import boto3

    return boto3.client(service, region_name="us-east-1")


def _recreate(target: str, name: str) -> None:
    """Someone else deletes the run's resource and makes one of the same name, untagged."""
    if target == "dynamodb":
        ddb = _admin("dynamodb")
        ddb.delete_table(TableName=name)
        ddb.get_waiter("table_not_exists").wait(TableName=name)
        time.sleep(1.1)  # a creation time of its own, to the second at least
        ddb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    elif target == "s3":
        s3 = _admin("s3")
        s3.delete_bucket(Bucket=name)
        s3.create_bucket(Bucket=name)
        # its owner's tags (LocalStack would otherwise keep the deleted bucket's tags)
        tags = {"TagSet": [{"Key": "owner", "Value": "someone else"}]}
        s3.put_bucket_tagging(Bucket=name, Tagging=tags)
    else:
        sqs = _admin("sqs")
        sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=name)["QueueUrl"])
        sqs.create_queue(QueueName=name)


def _still_there(target: str, name: str) -> bool:
    if target == "dynamodb":
        return name in _admin("dynamodb").list_tables()["TableNames"]
    if target == "s3":
        return name in {b["Name"] for b in _admin("s3").list_buckets()["Buckets"]}
    urls = _admin("sqs").list_queues(QueueNamePrefix=name).get("QueueUrls", [])
    return any(u.endswith("/" + name) for u in urls)


def _remove(target: str, name: str) -> None:
    if target == "dynamodb":
        _admin("dynamodb").delete_table(TableName=name)
    elif target == "s3":
        _admin("s3").delete_bucket(Bucket=name)
    else:
        sqs = _admin("sqs")
        sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=name)["QueueUrl"])


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.parametrize("target", ["dynamodb", "s3", "sqs"])
async def test_cleanup_leaves_a_resource_that_is_no_longer_the_one_it_created(
    target: str,
) -> None:
    prepared = await prepare(target, {})
    assert prepared.created is not None and prepared.run
    name = prepared.name
    if target == "s3":
        tags = _admin("s3").get_bucket_tagging(Bucket=name)["TagSet"]
        assert {"Key": MARKER, "Value": prepared.run} in tags
    elif target == "sqs":
        url = _admin("sqs").get_queue_url(QueueName=name)["QueueUrl"]
        assert _admin("sqs").list_queue_tags(QueueUrl=url)["Tags"] == {MARKER: prepared.run}
    _recreate(target, name)
    try:
        notes = await cleanup(prepared)
        assert notes and "no longer the one this run created" in notes[0]
        assert _still_there(target, name)
    finally:
        _remove(target, name)


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.parametrize("target", ["dynamodb", "s3", "sqs"])
@pytest.mark.slow
async def test_an_existing_resource_is_used_as_is_and_kept(target: str) -> None:
    made = await prepare(target, {})
    try:
        again = await prepare(target, {"run": "another", RESOURCE[target]: made.name})
        assert again.created is None and again.run == "another"
        assert again.resources["prefix"] == "cmr-load/another/"
        assert await cleanup(again) == []
        assert _still_there(target, made.name)
    finally:
        await cleanup(made)
    assert not _still_there(target, made.name)
