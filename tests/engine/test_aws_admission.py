"""Issue 26, item 1, as it was reproduced on the local stack: someone who can write the
table and the store's bucket points a submitted job at another bucket's object. A real
`cmr worker` with its defaults (inputs under its store's bucket) refuses the job, and the
other bucket's words never reach an output."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from cmr import pipeline
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.lifecycle import job_scratch
from cmr.plan import Plan, plan_url
from cmr.records import job_pk
from cmr.settings import AwsSettings
from cmr.wire import Range
from tests.stack import DYNAMODB_URL, LOCALSTACK_URL, remove_test_resources

pytestmark = pytest.mark.usefixtures("aws_stack")

SECRET = b"zebra launchcode zebra\n"


def _worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", "worker", *args],
        env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow
async def test_a_job_pointed_at_another_buckets_object_is_refused(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, s = aws
    other = f"{s.bucket}-b{uuid.uuid4().hex[:6]}"
    s3 = boto3.client("s3", endpoint_url=LOCALSTACK_URL)
    s3.create_bucket(Bucket=other)
    try:
        s3.put_object(Bucket=other, Key="private/secret.txt", Body=SECRET)
        s3.put_object(Bucket=s.bucket, Key="in/doc.txt", Body=b"apple banana\n")
        output = f"s3://{s.bucket}/out/"
        detached = await run_on(
            be, "examples/wordcount.py", f"s3://{s.bucket}/in/", output, reducers=1, aws=s,
            workers=0, detach=True,
        )  # fmt: skip
        job_id = detached.job_id
        # With boto3 alone: the plan reads the other bucket's object, and the record's
        # plan_digest and input_root agree with it (every check but admission passes).
        table = boto3.resource("dynamodb", endpoint_url=DYNAMODB_URL).Table(s.table)
        item = table.get_item(Key={"pk": job_pk(job_id), "sk": "job"}, ConsistentRead=True)
        record = item["Item"]
        secret = f"s3://{other}/private/secret.txt"
        tasks = [(Range(secret, 0, len(SECRET) if i == 0 else 0, "secret.txt"),) for i in
                 range(int(record["maps"]))]  # fmt: skip
        data = Plan(tuple(tasks)).to_bytes()
        plan = plan_url(job_scratch(str(record["scratch"]), job_id))
        s3.put_object(Bucket=s.bucket, Key=plan.removeprefix(f"s3://{s.bucket}/"), Body=data)
        table.update_item(
            Key={"pk": job_pk(job_id), "sk": "job"},
            UpdateExpression="SET plan_digest = :d, input_root = :r",
            ExpressionAttributeValues={":d": Plan.digest(data), ":r": secret},
        )

        worker = _worker(
            "--job", job_id, "--jobs-from", "./examples",
            "--store", f"aws://{s.bucket}/{s.table}?prefix={s.queue_prefix}",
        )  # fmt: skip
        assert worker.returncode == 1, worker.stderr
        assert f"its input {secret} is outside where this worker may read" in worker.stderr
        assert "see --inputs-under" in worker.stderr and "Traceback" not in worker.stderr
        written = s3.list_objects_v2(Bucket=s.bucket, Prefix="out/").get("Contents", [])
        assert [o["Key"] for o in written] == []
        # The refused job is still running (another worker may be allowed to serve it):
        # end it and clean it up here, as the fixture checks nothing was left.
        assert await pipeline.cancel(be, job_id, "refused by the test's worker", clean=True)
    finally:
        remove_test_resources(other, f"{other}-none", f"{other}-none-")
