"""`cmr fleet up/status/scale/logs/down` end to end against a moto server: moto runs the
template's Auto Scaling group for real (instances launch, SetDesiredCapacity scales)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from cmr.cli import app
from cmr.fleet import hourly_cost
from cmr.settings import Store
from tests.deploy.conftest import ROOT, fleet, fleet_status


def leftovers(stack: str, bucket: str, table: str) -> dict[str, Any]:
    """Whatever of the fleet still exists (or still runs) on the endpoint."""
    cfn, asg, ec2 = (boto3.client(s) for s in ("cloudformation", "autoscaling", "ec2"))
    iam, s3, db = (boto3.client(s) for s in ("iam", "s3", "dynamodb"))
    cloudwatch = boto3.client("cloudwatch")
    live_stacks = [
        s["StackName"]
        for s in cfn.list_stacks()["StackSummaries"]
        if s["StackName"] == stack and s["StackStatus"] != "DELETE_COMPLETE"
    ]
    return {
        "stacks": live_stacks,
        "groups": [
            g["AutoScalingGroupName"]
            for g in asg.describe_auto_scaling_groups()["AutoScalingGroups"]
            if g["AutoScalingGroupName"].startswith(stack)
        ],
        "instances": [
            i["InstanceId"]
            for r in ec2.describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
            )["Reservations"]
            for i in r["Instances"]
        ],
        "launch_templates": [
            t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]
        ],
        "security_groups": [
            g["GroupId"]
            for g in ec2.describe_security_groups()["SecurityGroups"]
            if g["GroupName"] != "default"
        ],
        "roles": [
            r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith(stack)
        ],
        "profiles": [
            p["InstanceProfileName"]
            for p in iam.list_instance_profiles()["InstanceProfiles"]
            if p["InstanceProfileName"].startswith(stack)
        ],
        "buckets": [b["Name"] for b in s3.list_buckets()["Buckets"] if b["Name"] == bucket],
        "tables": [t for t in db.list_tables()["TableNames"] if t == table],
        "alarms": [
            a["AlarmName"]
            for a in cloudwatch.describe_alarms(AlarmNamePrefix=stack)["MetricAlarms"]
        ],
    }


NOTHING: dict[str, list[str]] = {
    k: []
    for k in (
        "stacks",
        "groups",
        "instances",
        "launch_templates",
        "security_groups",
        "roles",
        "profiles",
        "buckets",
        "tables",
        "alarms",
    )
}


@pytest.mark.slow
def test_up_scale_status_logs_down(moto_env: dict[str, str]) -> None:
    tag = uuid.uuid4().hex[:8]
    stack, bucket, table, prefix = f"fleet-{tag}", f"cmr-fleet-{tag}", f"cmr-{tag}", f"cmr{tag}-"
    names = ["--stack", stack]
    up = CliRunner().invoke(
        app,
        ["fleet", "up", *names, "--count", "2", "--bucket", bucket, "--table", table,
         "--queue-prefix", prefix, "--instance-type", "c7i.large",
         "--jobs-from", "myjobs", "--jobs-from", "cmr.loadgen.job",
         "--outputs-under", f"s3://{bucket}/out/"],
    )  # fmt: skip
    assert up.exit_code == 0, up.output
    # Not in this project's wheel (only a locked dependency could provide it): a warning.
    assert "warning: --jobs-from myjobs: cmr-" in up.output
    assert "--jobs-from cmr.loadgen.job:" not in up.output
    assert (
        f"workers serve jobs of myjobs, cmr.loadgen.job (--jobs-from) with output under "
        f"s3://{bucket}/out/" in up.stdout
    )
    report = fleet_status(stack)
    assert report["stack_status"] in ("CREATE_COMPLETE", "UPDATE_COMPLETE")
    assert report["desired"] == 2
    assert [i["state"] for i in report["instances"]] == ["running", "running"]
    assert {i["lifecycle"] for i in report["instances"]} == {"InService"}
    assert report["running_jobs"] == []
    assert report["hourly_cost_usd"] == pytest.approx(2 * 0.08925)
    # What to submit with: the fleet's bucket, which must be this account's, table and prefix.
    store = Store.parse(report["store"])
    assert (store.aws.bucket, store.aws.table) == (bucket, table)
    assert (store.aws.queue_prefix, store.aws.owner) == (prefix, "123456789012")

    # The wheel the workers install is in the bucket, under the key the stack was given.
    params = {
        p["ParameterKey"]: p["ParameterValue"]
        for p in boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0][
            "Parameters"
        ]
    }
    head = boto3.client("s3").head_object(Bucket=bucket, Key=params["WheelKey"])
    assert head["ContentLength"] > 10_000 and params["WheelKey"].endswith(".whl")
    assert params["CreateTable"] == "true" and params["CreateBucket"] == "true"
    assert (params["JobsFrom"], params["OutputsUnder"]) == ("myjobs cmr.loadgen.job",
                                                            f"s3://{bucket}/out/")  # fmt: skip

    # A running job in cmr's active-jobs index shows in status; one that ended (and waits
    # for its cleanup there) does not.
    for job, state in (("20260101-000000-abc", "running"), ("20260101-000000-def", "failed")):
        boto3.client("dynamodb").put_item(
            TableName=table,
            Item={"pk": {"S": "jobs#active"}, "sk": {"S": job}, "state": {"S": state}},
        )
    assert fleet_status(stack)["running_jobs"] == ["20260101-000000-abc"]

    fleet("scale", "3", *names)
    report = fleet_status(stack)
    assert report["desired"] == 3
    assert [i["state"] for i in report["instances"]] == ["running"] * 3

    fleet("scale", "1", *names)
    report = fleet_status(stack)
    assert report["desired"] == 1 and len(report["instances"]) == 1

    logs = fleet("logs", *names, "-n", "5")
    assert f"==> {report['instances'][0]['id']} <==" in logs

    # An update (spot, new bound, idle time) keeps the current size, the owned bucket and
    # table; the idle alarm's window follows the workers' idle time, in 5-minute periods.
    # (moto runs the group but not CloudWatch alarms from a template: LocalStack's test
    # checks the alarm.)
    fleet("up", *names, "--spot", "--max", "5", "--idle-exit", "601")
    report = fleet_status(stack)
    assert report["desired"] == 1 and report["max"] == 5
    params = {
        p["ParameterKey"]: p["ParameterValue"]
        for p in boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0][
            "Parameters"
        ]
    }
    assert (params["IdleExitSeconds"], params["IdlePeriods"]) == ("601", "3")
    # What the workers serve is kept too.
    assert (params["JobsFrom"], params["OutputsUnder"]) == ("myjobs cmr.loadgen.job",
                                                            f"s3://{bucket}/out/")  # fmt: skip

    # `down` asks before it deletes data; with no one to ask and no --yes it refuses, and
    # leaves everything as it was.
    result = CliRunner().invoke(app, ["fleet", "down", *names])
    assert result.exit_code == 1
    assert "pass --yes to delete them" in result.output and f"bucket {bucket}" in result.output
    assert leftovers(stack, bucket, table)["stacks"] == [stack]

    # It deletes only what is the fleet's: the queues of jobs in its table, not a queue that
    # merely shares the prefix, nor one named like a job's but of no job it knows.
    sqs = boto3.client("sqs")
    job = "20260101-000000-0123456789abcdef"
    for known in (job, f"{job}-s2"):  # a pipeline's second step is a job of its own
        boto3.client("dynamodb").put_item(
            TableName=table, Item={"pk": {"S": f"job#{known}"}, "sk": {"S": "job"}}
        )
    ours = [
        sqs.create_queue(QueueName=f"{prefix}{job}{s}")["QueueUrl"]
        for s in ("-in", "-p00000", "-s2-reduce")
    ]
    theirs = [
        sqs.create_queue(QueueName=f"{prefix}someone-elses")["QueueUrl"],
        sqs.create_queue(QueueName=f"{prefix}20260101-000000-{'f' * 16}-in")["QueueUrl"],
    ]
    # A versioned bucket (as the template makes it) with old versions and a delete marker.
    s3 = boto3.client("s3")
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for body in (b"1", b"2"):
        s3.put_object(Bucket=bucket, Key="out/part-00000", Body=body)
    s3.delete_object(Bucket=bucket, Key="out/part-00000")
    fleet("down", *names, "--yes")
    left = sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])
    assert sorted(left) == sorted(theirs) and not set(ours) & set(left)
    for url in theirs:
        sqs.delete_queue(QueueUrl=url)
    assert leftovers(stack, bucket, table) == NOTHING


@pytest.mark.slow
def test_down_keep_data_keeps_bucket_and_table(moto_env: dict[str, str]) -> None:
    tag = uuid.uuid4().hex[:8]
    stack, bucket, table = f"fleet-{tag}", f"cmr-fleet-{tag}", f"cmr-{tag}"
    fleet("up", "--stack", stack, "--count", "1", "--bucket", bucket, "--table", table)
    fleet("down", "--stack", stack, "--keep-data")
    left = leftovers(stack, bucket, table)
    assert left == {**NOTHING, "buckets": [bucket], "tables": [table]}
    # A second `up` adopts the kept bucket and table instead of failing to create them.
    fleet("up", "--stack", stack, "--count", "1", "--bucket", bucket, "--table", table)
    params = {
        p["ParameterKey"]: p["ParameterValue"]
        for p in boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0][
            "Parameters"
        ]
    }
    assert params["CreateBucket"] == "false" and params["CreateTable"] == "false"
    assert len(fleet_status(stack)["instances"]) == 1
    fleet("down", "--stack", stack, "--yes")
    # The stack did not create them this time, so down leaves them: remove them here.
    s3 = boto3.client("s3")
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=bucket)
    boto3.client("dynamodb").delete_table(TableName=table)
    assert leftovers(stack, bucket, table) == NOTHING


@pytest.mark.slow
def test_scale_beyond_max_is_refused(moto_env: dict[str, str]) -> None:
    tag = uuid.uuid4().hex[:8]
    stack = f"fleet-{tag}"
    fleet("up", "--stack", stack, "--count", "0", "--max", "2", "--table", f"cmr-{tag}")
    result = CliRunner().invoke(app, ["fleet", "scale", "3", "--stack", stack])
    assert result.exit_code == 1 and "outside 0..2" in result.output
    # No --bucket: a new name of the account and region, with a random part.
    params = {
        p["ParameterKey"]: p["ParameterValue"]
        for p in boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0][
            "Parameters"
        ]
    }
    bucket = params["BucketName"]
    assert re.fullmatch(r"cmr-123456789012-us-east-1-[0-9a-f]{8}", bucket), bucket
    fleet("down", "--stack", stack, "--yes")
    assert leftovers(stack, bucket, f"cmr-{tag}") == NOTHING


def test_hourly_cost_uses_the_price_table() -> None:
    prices = json.loads((ROOT / "deploy" / "prices.json").read_text())
    assert prices["as_of"] and 0 < prices["spot_discount_assumption"] < 1
    od = prices["on_demand_hourly"]["c7i.large"]
    instances = [
        {"type": "c7i.large", "state": "running", "market": "on-demand"},
        {"type": "c7i.large", "state": "pending", "market": "spot"},
        {"type": "c7i.large", "state": "terminated", "market": "on-demand"},
        {"type": "x9.huge", "state": "running", "market": "on-demand"},
    ]
    cost, unknown = hourly_cost(instances, prices)
    assert cost == pytest.approx(od + od * (1 - prices["spot_discount_assumption"]))
    assert unknown == ["x9.huge"]
