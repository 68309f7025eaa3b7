"""The local AWS stack (LocalStack for S3 and SQS, moto for DynamoDB and SimpleDB) as tests
see it."""

from __future__ import annotations

import socket
from contextlib import suppress
from urllib.parse import urlparse

LOCALSTACK_URL = "http://127.0.0.1:4566"
DYNAMODB_URL = "http://127.0.0.1:8000"
# What answers DYNAMODB_URL (and SimpleDB) in scripts/stack.sh: named in every emulator gap.
DYNAMODB_SERVER = "moto 5.2.5"


def stack_env() -> dict[str, str]:
    """The standard AWS settings that point every client at the local stack."""
    return {
        "AWS_ENDPOINT_URL": LOCALSTACK_URL,
        "AWS_ENDPOINT_URL_DYNAMODB": DYNAMODB_URL,
        "AWS_ENDPOINT_URL_SIMPLEDB": DYNAMODB_URL,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _answers(url: str, timeout: float = 1.0) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout):
            return True
    except OSError:
        return False


def stack_up() -> bool:
    """Whether both LocalStack and the DynamoDB server accept connections."""
    return _answers(LOCALSTACK_URL) and _answers(DYNAMODB_URL)


def remove_test_resources(bucket: str, table: str, queue_prefix: str) -> None:
    """Delete what a test session made on the local stack; whatever is already gone is fine."""
    import boto3
    from botocore.exceptions import ClientError

    env = stack_env()
    session = boto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    sqs = session.client("sqs", endpoint_url=LOCALSTACK_URL)
    for url in sqs.list_queues(QueueNamePrefix=queue_prefix).get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)
    s3 = session.client("s3", endpoint_url=LOCALSTACK_URL)
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        s3.delete_bucket(Bucket=bucket)
    except ClientError:
        pass
    dynamodb = session.client("dynamodb", endpoint_url=DYNAMODB_URL)
    with suppress(ClientError):
        dynamodb.delete_table(TableName=table)
