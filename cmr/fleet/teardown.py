"""``cmr fleet down``'s clean-up after the stack is gone: the bucket emptied (objects and
unfinished uploads), the queues deleted."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError
from rich.console import Console

from cmr.backends.aws.errors import classify
from cmr.cli.options import err
from cmr.errors import FleetError, QueueGone
from cmr.fleet.lookups import bucket_exists, table_exists
from cmr.fleet.stack import Aws, describe_stack, stack_params, wait_stack


def empty_bucket(s3: Any, bucket: str) -> int:
    """Delete every object and abort every multipart upload; returns the objects deleted."""
    n = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            n += len(keys)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    for up in uploads:
        s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    return n


def delete_queues(sqs: Any, prefix: str) -> int:
    urls: list[str] = sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    for url in urls:
        try:
            sqs.delete_queue(QueueUrl=url)
        except ClientError as exc:
            if classify("sqs", exc) is not QueueGone:  # deleted meanwhile: fine
                raise
    return len(urls)


def take_down(out: Console, aws: Aws, stack: str, keep_data: bool, timeout: float) -> None:
    """Delete the stack; then, unless kept, the bucket and table it made, and the queues."""
    cfn = aws.client("cloudformation")
    got = describe_stack(cfn, stack)
    if got is None:
        raise FleetError(f"no fleet stack {stack}")
    params = stack_params(got)
    cfn.delete_stack(StackName=stack)
    wait_stack(cfn, stack, timeout)
    err.print(f"stack {stack} deleted")
    if keep_data:
        out.print(
            f"kept s3://{params['BucketName']}, table {params['TableName']} and queues "
            f"{params['QueuePrefix']}*",
            highlight=False,
        )
        return
    if params.get("CreateBucket") == "true":
        s3 = aws.client("s3")
        if bucket_exists(s3, params["BucketName"]):
            n = empty_bucket(s3, params["BucketName"])
            s3.delete_bucket(Bucket=params["BucketName"])
            err.print(f"deleted bucket {params['BucketName']} ({n} objects)")
    if params.get("CreateTable") == "true":
        db = aws.client("dynamodb")
        if table_exists(db, params["TableName"]):
            db.delete_table(TableName=params["TableName"])
            err.print(f"deleted table {params['TableName']}")
    n = delete_queues(aws.client("sqs"), params["QueuePrefix"])
    out.print(f"fleet {stack} down ({n} leftover queues deleted)", highlight=False)
