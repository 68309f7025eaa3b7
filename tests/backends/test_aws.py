"""What only the aws backend does: fail fast with a clear message, translate errors, and
read what others put on its queues."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from cmr.backends.aws import _translated, open_aws, sessions
from cmr.backends.base import Backend, Missing
from cmr.backends.parts import PART_BYTES
from cmr.backends.retry import with_retries
from cmr.errors import (
    BackendError,
    BlobMissing,
    BucketOrTableMissing,
    ConditionFailed,
    QueueGone,
    Rejected,
    Throttled,
    Unreachable,
    UsageError,
)
from cmr.settings import AwsSettings, Store
from tests.backends.conftest import AwsNames
from tests.deploy.owner_front import LOCAL_ACCOUNT, owner_front
from tests.stack import LOCALSTACK_URL


@pytest.fixture
async def aws(aws_stack: dict[str, str], aws_names: AwsNames) -> AsyncIterator[Backend]:
    aws_names.used = True
    settings = AwsSettings(bucket=aws_names.bucket, table=aws_names.table)
    async with open_aws(settings) as backend:
        yield backend


async def test_no_credentials_fails_at_open(monkeypatch: pytest.MonkeyPatch) -> None:
    # Something listens (so the endpoint is not down), and the request is never signed.
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listening.getsockname()[1]}")
        with pytest.raises(Unreachable, match="AWS_PROFILE or AWS_ACCESS_KEY_ID") as err:
            async with open_aws(AwsSettings(max_attempts=1)):
                pass
    assert "scripts/stack.sh env" in str(err.value)
    assert "\n" not in str(err.value)


async def test_unknown_profile_fails_at_open() -> None:
    with pytest.raises(Unreachable, match="nope"):
        async with open_aws(AwsSettings(profile="nope")):
            pass


async def test_refused_endpoint_fails_at_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: refused
    at = "sqs, s3, dynamodb at http://127.0.0.1:9: nothing is listening there"
    with pytest.raises(Unreachable, match=re.escape(at)) as err:
        async with open_aws(AwsSettings(max_attempts=1)):
            pass
    assert "scripts/stack.sh start" in str(err.value)


@pytest.mark.usefixtures("aws_stack")
async def test_default_region_when_none_is_configured(
    monkeypatch: pytest.MonkeyPatch, aws_names: AwsNames
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    aws_names.used = True
    async with open_aws(AwsSettings(bucket=aws_names.bucket, table=aws_names.table)) as b:
        assert b.name == "aws"
        assert b.scratch == f"s3://{aws_names.bucket}/cmr"


@pytest.mark.usefixtures("aws_stack")
async def test_opening_asks_for_the_bucket_and_the_table_once(
    monkeypatch: pytest.MonkeyPatch, aws_names: AwsNames
) -> None:
    """The probe's HeadBucket and DescribeTable answer the set-up too: every process on
    the stack opens the store, and asked twice, each opening cost two more requests."""
    aws_names.used = True
    settings = AwsSettings(bucket=aws_names.bucket, table=aws_names.table)
    async with open_aws(settings):
        pass  # made, if this is the session's first opening
    asked: Counter[str] = Counter()
    made = sessions.session

    def counted(*args: Any, **kwargs: Any) -> Any:
        session = made(*args, **kwargs)
        session._session.register("before-call", lambda model, **_: asked.update([model.name]))
        return session

    monkeypatch.setattr(sessions, "session", counted)
    async with open_aws(settings):
        pass
    assert (asked["HeadBucket"], asked["DescribeTable"], asked["GetQueueUrl"]) == (1, 1, 1)
    assert not {"CreateBucket", "CreateTable"} & set(asked), asked


@pytest.mark.usefixtures("aws_stack")
async def test_missing_resources_without_create() -> None:
    tag = uuid.uuid4().hex[:8]
    with pytest.raises(UsageError, match=f"bucket cmr-absent-{tag} does not exist"):
        async with open_aws(AwsSettings(bucket=f"cmr-absent-{tag}", create=False)):
            pass


async def test_blob_urls_must_be_s3(aws: Backend, tmp_path: object) -> None:
    with pytest.raises(UsageError, match="s3://"):
        await aws.blobs.get(f"file://{tmp_path}/x")
    with pytest.raises(UsageError, match="s3://"):
        await aws.blobs.put("/plain/path", b"x")


async def test_foreign_bodies_reach_the_engine(aws: Backend) -> None:
    name = f"cmrt-foreign-{uuid.uuid4().hex[:12]}"
    await aws.queues.create(name, visibility_s=30)
    async with aioboto3.Session().client("sqs") as sqs:
        url = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
        await sqs.send_message(QueueUrl=url, MessageBody="not base64 at all! ✓")
    [m] = await aws.queues.receive(name, wait_s=2)
    assert m.body == "not base64 at all! ✓".encode()
    await aws.queues.delete(name)


async def test_queue_deleted_elsewhere_is_gone(aws: Backend) -> None:
    name = f"cmrt-elsewhere-{uuid.uuid4().hex[:12]}"
    await aws.queues.create(name, visibility_s=30)
    assert await aws.queues.receive(name) == []  # the queue's URL is now cached
    async with aioboto3.Session().client("sqs") as sqs:
        url = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
        await sqs.delete_queue(QueueUrl=url)
    with pytest.raises(QueueGone):
        await aws.queues.receive(name)
    with pytest.raises(QueueGone):
        await aws.queues.send(name, [b"x"])


async def test_failed_calls_keep_service_operation_and_code(aws: Backend) -> None:
    """Real failing calls: the error says which service and call failed, with the code."""
    key = uuid.uuid4().hex
    await aws.table.put("t", key, {"n": 1})
    with pytest.raises(ConditionFailed) as cond:
        await aws.table.put("t", key, {"n": 2}, condition=Missing("pk"))
    assert (cond.value.service, cond.value.operation, cond.value.code) == (
        "dynamodb",
        "PutItem",
        "ConditionalCheckFailedException",
    )

    with pytest.raises(BlobMissing) as missing:
        await aws.blobs.get(f"{aws.scratch}/absent-{key}")
    assert (missing.value.service, missing.value.operation, missing.value.code) == (
        "s3",
        "GetObject",
        "NoSuchKey",
    )

    name = f"cmrt-gone-{key[:12]}"
    await aws.queues.create(name, visibility_s=30)
    assert await aws.queues.receive(name) == []  # the queue's URL is now cached
    async with aioboto3.Session().client("sqs") as sqs:
        url = (await sqs.get_queue_url(QueueName=name))["QueueUrl"]
        await sqs.delete_queue(QueueUrl=url)
    with pytest.raises(QueueGone) as gone:
        await aws.queues.receive(name)
    assert (gone.value.service, gone.value.operation) == ("sqs", "ReceiveMessage")
    assert gone.value.code in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


async def test_a_bucket_that_does_not_exist_is_an_answer_not_retried(aws: Backend) -> None:
    """A mistyped bucket is reported at its first answer: retried as a hiccup, it took 8
    requests and ~7.5 s of backoff before `cmr run` said so."""
    retrying = with_retries(aws)
    before = aws.calls()["s3.ListObjectsV2"]
    missing = f"s3://cmr-absent-{uuid.uuid4().hex[:12]}/out/"
    with pytest.raises(BucketOrTableMissing, match="bucket does not exist") as info:
        await retrying.blobs.list(missing)
    assert (info.value.service, info.value.operation, info.value.code) == (
        "s3",
        "ListObjectsV2",
        "NoSuchBucket",
    )
    assert aws.calls()["s3.ListObjectsV2"] - before == 1


def test_errors_without_a_service_have_empty_attributes() -> None:
    err = BackendError("plain")
    assert (err.service, err.operation, err.code) == ("", "", "")


async def test_setup_calls_are_not_counted(aws: Backend) -> None:
    assert sum(aws.calls().values()) == 0


def client_error(code: str, op: str = "Op", status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"says {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


@pytest.mark.parametrize(
    ("service", "code", "status", "expected"),
    [
        ("dynamodb", "ThrottlingException", 400, Throttled),
        ("dynamodb", "ProvisionedThroughputExceededException", 400, Throttled),
        ("ec2", "RequestLimitExceeded", 400, Throttled),
        ("s3", "SlowDown", 503, Throttled),
        ("s3", "ServiceUnavailable", 503, Throttled),
        ("sqs", "InternalError", 503, Throttled),
        ("sqs", "AWS.SimpleQueueService.NonExistentQueue", 400, QueueGone),
        ("sqs", "QueueDoesNotExist", 400, QueueGone),
        ("dynamodb", "ConditionalCheckFailedException", 400, ConditionFailed),
        ("s3", "NoSuchKey", 404, BlobMissing),
        ("s3", "404", 404, BlobMissing),
        ("s3", "AccessDenied", 403, Unreachable),
        ("dynamodb", "AccessDeniedException", 400, Unreachable),
        ("sqs", "InvalidClientTokenId", 403, Unreachable),
        ("dynamodb", "ValidationException", 400, Rejected),
        ("s3", "PreconditionFailed", 412, ConditionFailed),
        ("s3", "EntityTooLarge", 400, Rejected),
        ("s3", "NoSuchBucket", 404, BucketOrTableMissing),
        ("dynamodb", "ResourceNotFoundException", 400, BucketOrTableMissing),
    ],
)
def test_error_translation(service: str, code: str, status: int, expected: type) -> None:
    err = _translated(service, client_error(code, "DoIt", status), "subject")
    assert type(err) is expected
    assert (err.service, err.operation, err.code) == (service, "DoIt", code)
    assert "\n" not in str(err)
    if expected is BackendError:
        assert f"{service}.DoIt" in str(err)
        assert f"says {code}" in str(err)


def test_owner_is_an_account_id_in_the_store_url() -> None:
    store = Store.parse(f"aws://b/t?owner={LOCAL_ACCOUNT}")
    assert store.aws.owner == LOCAL_ACCOUNT
    assert Store.parse(store.url) == store
    with pytest.raises(UsageError, match="not an AWS account id"):
        Store.parse("aws://b/t?owner=me")
    with pytest.raises(UsageError, match="not an AWS account id"):
        AwsSettings(owner="12345678901")


@pytest.mark.usefixtures("aws_stack")
async def test_every_s3_request_names_the_expected_owner(
    monkeypatch: pytest.MonkeyPatch, aws_names: AwsNames, tmp_path: Path
) -> None:
    """Every S3 request the backend sends carries ExpectedBucketOwner (seen on the wire, by
    an S3 front before LocalStack, which does not check the header itself)."""
    aws_names.used = True
    key = uuid.uuid4().hex[:12]
    big = tmp_path / "big"
    big.write_bytes(os.urandom(PART_BYTES + 1024))  # a multipart upload, and its parts
    with owner_front(LOCALSTACK_URL) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
        settings = AwsSettings(bucket=aws_names.bucket, table=aws_names.table, owner=LOCAL_ACCOUNT)
        async with open_aws(settings) as be:
            base = f"s3://{aws_names.bucket}/owner-{key}/"
            await be.blobs.put(base + "a", b"abc")
            etag = await be.blobs.put_if(base + "b", b"x", etag=None)
            await be.blobs.put_if(base + "b", b"y", etag=etag)
            assert await be.blobs.get(base + "a") == b"abc"
            assert await be.blobs.get_range(base + "a", 1, 3) == b"bc"
            assert await be.blobs.size(base + "a") == 3
            await be.blobs.copy(base + "a", base + "c")
            await be.blobs.upload_file(str(big), base + "big")
            await be.blobs.download_file(base + "big", str(tmp_path / "back"))
            assert (tmp_path / "back").read_bytes() == big.read_bytes()
            await be.blobs.delete([base + "c"])
            assert await be.blobs.delete_prefix(base) == 3
    # CreateBucket alone has no such parameter: the bucket it makes is the caller's own.
    created = [s for s in front.seen if s.method == "PUT" and s.path == f"/{aws_names.bucket}"]
    others = [s for s in front.seen if s not in created]
    assert len(others) >= 14
    assert [s for s in others if s.owner != LOCAL_ACCOUNT] == []


@pytest.mark.usefixtures("aws_stack")
async def test_a_bucket_of_another_account_is_refused_at_open(
    monkeypatch: pytest.MonkeyPatch, aws_names: AwsNames
) -> None:
    aws_names.used = True
    async with open_aws(AwsSettings(bucket=aws_names.bucket, table=aws_names.table)):
        pass  # the bucket exists, LocalStack's account owns it
    with owner_front(LOCALSTACK_URL) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
        stranger = "111111111111"
        settings = AwsSettings(bucket=aws_names.bucket, table=aws_names.table, owner=stranger)
        with pytest.raises(UsageError, match=f"not owned by account {stranger}") as err:
            async with open_aws(settings):
                pass
    assert "owner=" in str(err.value) and "\n" not in str(err.value)
    assert {s.owner for s in front.seen} == {stranger}
    # Nothing was read or written: the refusal came before the bucket was used.
    assert {s.method for s in front.seen} == {"HEAD"}


@pytest.mark.usefixtures("aws_stack")
async def test_a_call_on_a_bucket_of_another_account_says_so(
    monkeypatch: pytest.MonkeyPatch, aws_names: AwsNames
) -> None:
    aws_names.used = True
    with owner_front(LOCALSTACK_URL, {"someone-elses-bucket": "222222222222"}) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
        settings = AwsSettings(bucket=aws_names.bucket, table=aws_names.table, owner=LOCAL_ACCOUNT)
        async with open_aws(settings) as be:
            # Another account's bucket named in a URL (a record, a job's output ...).
            with pytest.raises(Unreachable, match="owner= account") as err:
                await be.blobs.get("s3://someone-elses-bucket/key")
    assert err.value.code == "AccessDenied"
    assert front.seen[-1].owner == LOCAL_ACCOUNT
