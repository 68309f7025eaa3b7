"""`cmr fleet up/status/logs/down` against LocalStack community: it accepts the template
(table in the local DynamoDB, so CreateTable=false) and creates the idle alarm, but creates no
Auto Scaling group and serves no Auto Scaling API, so status reports the group missing; down
must leave nothing behind."""

from __future__ import annotations

import hashlib
import json
import urllib.request
import uuid
from collections.abc import Iterator

import boto3
import pytest

from tests.deploy.conftest import ROOT, fleet, fleet_status
from tests.deploy.owner_front import LOCAL_ACCOUNT, Front, owner_front
from tests.stack import LOCALSTACK_URL

NEEDED = ("cloudformation", "cloudwatch", "ec2", "iam", "s3", "sts")


def missing_services() -> list[str]:
    with urllib.request.urlopen(f"{LOCALSTACK_URL}/_localstack/health", timeout=3) as r:
        services = json.load(r).get("services", {})
    return [s for s in NEEDED if services.get(s) not in ("available", "running")]


@pytest.fixture
def s3_front(aws_stack: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Front]:
    """The CLI's S3 calls pass a front that refuses, as S3 does, a wrong ExpectedBucketOwner
    (LocalStack ignores the header)."""
    with owner_front(LOCALSTACK_URL) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
        yield front


@pytest.mark.slow
def test_up_status_down_on_localstack(s3_front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = missing_services()
    if missing:
        pytest.skip(
            f"LocalStack runs without {', '.join(missing)}: set LS_SERVICES in scripts/stack.sh "
            "to s3,sqs,cloudformation,cloudwatch,ec2,iam,ssm,sts and run scripts/stack.sh restart"
        )
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("UV_OFFLINE", "1")  # `up` locks the dependencies from uv's cache
    ec2 = boto3.client("ec2")
    groups_before = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    tag = uuid.uuid4().hex[:8]
    stack, bucket, table, prefix = (
        f"lsfleet-{tag}",
        f"cmr-lsfleet-{tag}",
        f"cmr-ls-{tag}",
        f"cmrls{tag}-",
    )
    fleet("up", "--stack", stack, "--count", "1", "--bucket", bucket, "--table", table,
          "--queue-prefix", prefix, "--no-create-table")  # fmt: skip
    cfn = boto3.client("cloudformation")
    resources = {
        r["LogicalResourceId"]: r
        for r in cfn.describe_stack_resources(StackName=stack)["StackResources"]
    }
    assert {"Bucket", "WorkerRole", "WorkerProfile", "WorkerSecurityGroup", "LaunchTemplate",
            "WorkerGroup", "ScaleToZero", "IdleAlarm"} <= set(resources)  # fmt: skip
    assert "Table" not in resources  # the condition left it out: the local DynamoDB has it
    params = {
        p["ParameterKey"]: p["ParameterValue"]
        for p in cfn.describe_stacks(StackName=stack)["Stacks"][0]["Parameters"]
    }
    s3 = boto3.client("s3", endpoint_url=LOCALSTACK_URL)  # this test's own calls: not the front's
    assert s3.head_object(Bucket=bucket, Key=params["WheelKey"])["ContentLength"] > 10_000
    lock = s3.get_object(Bucket=bucket, Key=params["LockKey"])["Body"].read()
    assert params["LockKey"].split("/")[2] == hashlib.sha256(lock).hexdigest()
    assert b"--hash=sha256:" in lock
    # The bucket the stack made: versioned, owner-enforced, TLS-only, tagged as the stack's.
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rules = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"]
    assert rules == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    (tls,) = [st for st in policy["Statement"] if st["Sid"] == "TlsOnly"]
    assert tls["Effect"] == "Deny" and tls["Condition"] == {
        "Bool": {"aws:SecureTransport": "false"}
    }
    assert {"Key": "cmr:fleet", "Value": stack} in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    sg = resources["WorkerSecurityGroup"]["PhysicalResourceId"]
    assert sg in {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    role = resources["WorkerRole"]["PhysicalResourceId"]
    assert boto3.client("iam").get_role(RoleName=role)["Role"]["RoleName"] == role

    # The idle alarm: the busiest instance of the group under 5% CPU for one 5-minute period
    # (the default 300 s of worker idle time) fires the scale-to-zero policy.
    cloudwatch = boto3.client("cloudwatch")
    (alarm,) = cloudwatch.describe_alarms(AlarmNames=[f"{stack}-idle"])["MetricAlarms"]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == (
        "AWS/EC2",
        "CPUUtilization",
        "Maximum",
    )
    assert [d["Name"] for d in alarm["Dimensions"]] == ["AutoScalingGroupName"]
    assert (alarm["Period"], alarm["EvaluationPeriods"], alarm["Threshold"]) == (300, 1, 5.0)
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    assert len(alarm["AlarmActions"]) == 1 and alarm["ActionsEnabled"]

    report = fleet_status(stack)
    assert report["idle_alarm"]["name"] == f"{stack}-idle"
    assert report["idle_alarm"]["idle_minutes"] == 5
    assert report["idle_alarm"]["state"] in ("OK", "INSUFFICIENT_DATA")
    assert report["group_missing"] and report["instances"] == []
    assert report["running_jobs"] == [] and report["hourly_cost_usd"] == 0
    assert "no instances" in fleet("logs", "--stack", stack)

    fleet("down", "--stack", stack, "--yes")
    # Every S3 request of `up` and `down` named the caller's account as the bucket's owner.
    assert len(s3_front.seen) >= 5
    assert [s for s in s3_front.seen if s.owner != LOCAL_ACCOUNT] == []
    live = [
        s["StackName"]
        for s in cfn.list_stacks()["StackSummaries"]
        if s["StackName"] == stack and s["StackStatus"] != "DELETE_COMPLETE"
    ]
    assert live == []
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    iam = boto3.client("iam")
    assert not [r for r in iam.list_roles()["Roles"] if r["RoleName"].startswith(stack)]
    assert not [
        p
        for p in iam.list_instance_profiles()["InstanceProfiles"]
        if p["InstanceProfileName"].startswith(stack)
    ]
    groups_after = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    assert groups_after - groups_before == set()
    assert boto3.client("sqs").list_queues(QueueNamePrefix=prefix).get("QueueUrls", []) == []
    assert cloudwatch.describe_alarms(AlarmNamePrefix=stack)["MetricAlarms"] == []
