"""``cmr fleet down``: the stack, then the data it made, and only that: the bucket and the
table when the stack created them and they carry its tag (``cmr:fleet=<stack>``), and the
queues of jobs recorded in its table under its queue prefix. Data goes only once the user
said yes (``--yes``, or the prompt on a terminal)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError
from rich.console import Console

from cmr.backends.aws.errors import classify
from cmr.cli.options import err
from cmr.errors import FleetError, QueueGone
from cmr.fleet.lookups import bucket_exists, bucket_tags, stack_tagged, table_exists, table_tags
from cmr.fleet.stack import Aws, describe_stack, stack_params, wait_stack
from cmr.records import job_pk

# What `cmr run` names a job's queues: <prefix><job id>-in, -reduce, -p00000 ...; a
# pipeline's later steps are jobs <pipeline id>-s<n> (cmr.pipeline).
_JOB_QUEUE = re.compile(r"(\d{8}-\d{6}-[0-9a-f]{16}(?:-s\d{1,2})?)-(in|reduce|p\d{5})")


@dataclass
class DataPlan:
    """What ``down`` would delete besides the stack, and what it leaves, and why."""

    bucket: str | None = None
    table: str | None = None
    queues: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.bucket or self.table or self.queues)

    def describe(self) -> str:
        parts = []
        if self.bucket:
            parts.append(f"bucket {self.bucket} with every object in it (all versions)")
        if self.table:
            parts.append(f"table {self.table}")
        if self.queues:
            parts.append(f"{len(self.queues)} queues of its jobs")
        return ", ".join(parts)


def plan_data(aws: Aws, stack: str, params: dict[str, str]) -> DataPlan:
    """The bucket and table the stack made and tagged, and its jobs' queues."""
    plan = DataPlan()
    name, table, prefix = params["BucketName"], params["TableName"], params["QueuePrefix"]
    if params.get("CreateBucket") == "true":
        s3 = aws.client("s3")
        if bucket_exists(s3, name, aws.account()):
            if stack_tagged(bucket_tags(s3, name), stack):
                plan.bucket = name
            else:
                plan.kept.append(f"bucket {name} (it has no tag cmr:fleet={stack})")
    db = aws.client("dynamodb")
    has_table = table_exists(db, table)
    if params.get("CreateTable") == "true" and has_table:
        if stack_tagged(table_tags(db, table), stack):
            plan.table = table
        else:
            plan.kept.append(f"table {table} (it has no tag cmr:fleet={stack})")
    urls: list[str] = aws.client("sqs").list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    jobs: dict[str, bool] = {}
    for url in urls:
        name_ = url.rsplit("/", 1)[-1]
        m = _JOB_QUEUE.fullmatch(name_[len(prefix) :])
        if m and has_table and m.group(1) not in jobs:
            got = db.get_item(
                TableName=table,
                Key={"pk": {"S": job_pk(m.group(1))}, "sk": {"S": "job"}},
                ProjectionExpression="pk",
            )
            jobs[m.group(1)] = "Item" in got
        if m and jobs.get(m.group(1)):
            plan.queues.append(url)
        else:
            plan.kept.append(f"queue {name_} (not a queue of a job in table {table})")
    return plan


def empty_bucket(s3: Any, bucket: str) -> int:
    """Delete every object version and delete marker, abort every multipart upload; returns
    the versions deleted. (The fleet's bucket is versioned: deleting the current objects
    alone would leave it full of old versions, and not deletable.)"""
    n = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})
        n += len(keys)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    for up in uploads:
        s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    return n


def delete_queues(sqs: Any, urls: list[str]) -> int:
    for url in urls:
        try:
            sqs.delete_queue(QueueUrl=url)
        except ClientError as exc:
            if classify("sqs", exc) is not QueueGone:  # deleted meanwhile: fine
                raise
    return len(urls)


def take_down(
    out: Console,
    aws: Aws,
    stack: str,
    keep_data: bool,
    timeout: float,
    confirm: Callable[[str], bool] | None = None,
) -> None:
    """Delete the stack; then, unless kept, what :func:`plan_data` finds. ``confirm`` asks the
    user (None: no one to ask, and the data is deleted only when the caller passed --yes by
    giving ``confirm=lambda _: True``)."""
    cfn = aws.client("cloudformation")
    got = describe_stack(cfn, stack)
    if got is None:
        raise FleetError(f"no fleet stack {stack}")
    params = stack_params(got)
    plan = DataPlan() if keep_data else plan_data(aws, stack, params)
    if plan:
        question = f"delete stack {stack} and its data: {plan.describe()}?"
        if confirm is None:
            raise FleetError(
                f"`cmr fleet down` would delete {plan.describe()}: pass --yes to delete them, "
                "or --keep-data to delete the stack alone"
            )
        if not confirm(question):
            raise FleetError("nothing deleted (pass --keep-data to delete the stack alone)")
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
    for note in plan.kept:
        err.print(f"left {note}", highlight=False)
    if plan.bucket:
        s3 = aws.client("s3")
        n = empty_bucket(s3, plan.bucket)
        s3.delete_bucket(Bucket=plan.bucket)
        err.print(f"deleted bucket {plan.bucket} ({n} object versions)")
    n = delete_queues(aws.client("sqs"), plan.queues)
    if plan.table:
        aws.client("dynamodb").delete_table(TableName=plan.table)
        err.print(f"deleted table {plan.table}")
    out.print(f"fleet {stack} down ({n} leftover queues deleted)", highlight=False)
