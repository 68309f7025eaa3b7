"""deploy/fleet.yaml as data: lint, least privilege, IMDSv2, table layout, user data."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import ROOT, TEMPLATE, load_template

# The three resources, as the template writes them: the role may touch nothing else.
QUEUES = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${QueuePrefix}*"
TABLE = "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${TableName}"
BUCKET = "arn:${AWS::Partition}:s3:::${BucketName}"
OBJECTS = "arn:${AWS::Partition}:s3:::${BucketName}/*"
ALLOWED = {
    QUEUES: {
        "sqs:CreateQueue",
        "sqs:GetQueueUrl",
        "sqs:GetQueueAttributes",
        "sqs:ListQueues",
        "sqs:SendMessage",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteQueue",
    },
    TABLE: {
        "dynamodb:DescribeTable",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
        "dynamodb:Query",
    },
    BUCKET: {"s3:ListBucket"},
    OBJECTS: {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"},
}

# Every client call in cmr/backends/aws/ and the IAM action it needs.
BACKEND_CALLS = {
    "create_queue": "sqs:CreateQueue",
    "get_queue_url": "sqs:GetQueueUrl",
    "list_queues": "sqs:ListQueues",
    "delete_queue": "sqs:DeleteQueue",
    "send_message_batch": "sqs:SendMessage",
    "receive_message": "sqs:ReceiveMessage",
    "delete_message_batch": "sqs:DeleteMessage",
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
    "get_queue_attributes": "sqs:GetQueueAttributes",
    "put_object": "s3:PutObject",
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "download_file": "s3:GetObject",
    "list_objects_v2": "s3:ListBucket",
    "head_bucket": "s3:ListBucket",
    "delete_objects": "s3:DeleteObject",
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "copy_object": "s3:PutObject",  # and s3:GetObject on the source, granted too
    "upload_part_copy": "s3:PutObject",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "create_bucket": "s3:CreateBucket",
    "list_buckets": "s3:ListAllMyBuckets",
    "get_item": "dynamodb:GetItem",
    "put_item": "dynamodb:PutItem",
    "update_item": "dynamodb:UpdateItem",
    "delete_item": "dynamodb:DeleteItem",
    # A transaction needs each write's own action (all granted) and this one for its checks.
    "transact_write_items": "dynamodb:ConditionCheckItem",
    "query": "dynamodb:Query",
    "describe_table": "dynamodb:DescribeTable",
    "create_table": "dynamodb:CreateTable",
    "list_tables": "dynamodb:ListTables",
}
# Workers run with --no-create: the stack owns the bucket and the table.
CREATE_ONLY = {"s3:CreateBucket", "dynamodb:CreateTable"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    role = template["Resources"]["WorkerRole"]["Properties"]
    found: list[dict[str, Any]] = []
    for policy in role["Policies"]:
        found.extend(policy["PolicyDocument"]["Statement"])
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_cfn_lint_passes() -> None:
    exe = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which(
        "cfn-lint"
    )
    if exe is None:
        pytest.skip("cfn-lint is not installed (pinned in requirements-dev.txt)")
    done = subprocess.run([exe, str(TEMPLATE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cfn_lint_is_pinned() -> None:
    pins = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^cfn-lint==\d+\.\d+\.\d+$", pins, re.M)


def test_policy_grants_only_the_three_resources(template: dict[str, Any]) -> None:
    granted: dict[str, set[str]] = {}
    for st in statements(template):
        assert st["Effect"] == "Allow"
        assert "NotAction" not in st and "NotResource" not in st
        for resource in as_list(st["Resource"]):
            assert isinstance(resource, dict) and set(resource) == {"Fn::Sub"}, resource
            arn = resource["Fn::Sub"]
            assert arn in ALLOWED, f"statement {st.get('Sid')} grants {arn}"
            actions = set(as_list(st["Action"]))
            assert all("*" not in a for a in actions), actions
            assert actions <= ALLOWED[arn], actions - ALLOWED[arn]
            granted.setdefault(arn, set()).update(actions)
    assert granted == ALLOWED
    # No other policy is attached anywhere: no managed policies, no other IAM resources.
    role = template["Resources"]["WorkerRole"]["Properties"]
    assert "ManagedPolicyArns" not in role
    iam = {
        name: r["Type"]
        for name, r in template["Resources"].items()
        if r["Type"].startswith("AWS::IAM")
    }
    assert iam == {"WorkerRole": "AWS::IAM::Role", "WorkerProfile": "AWS::IAM::InstanceProfile"}
    trust = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust == [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ]


def test_only_wildcards_are_the_queue_prefix_and_the_objects(template: dict[str, Any]) -> None:
    for st in statements(template):
        for resource in as_list(st["Resource"]):
            arn = resource["Fn::Sub"]
            assert arn != "*"
            stars = [m.start() for m in re.finditer(r"\*", arn)]
            assert stars in ([], [len(arn) - 1]), arn


def test_idle_fleet_scales_to_zero_without_instance_permissions(
    template: dict[str, Any],
) -> None:
    """Scale-in is CloudWatch's and the group's doing: the alarm watches the busiest
    instance of this group and calls a policy that sets this group's capacity to zero."""
    resources = template["Resources"]
    policy = resources["ScaleToZero"]
    assert policy["Type"] == "AWS::AutoScaling::ScalingPolicy"
    assert policy["Properties"]["AutoScalingGroupName"] == {"Ref": "WorkerGroup"}
    assert policy["Properties"]["AdjustmentType"] == "ExactCapacity"
    assert policy["Properties"]["ScalingAdjustment"] == 0
    alarm = resources["IdleAlarm"]["Properties"]
    assert resources["IdleAlarm"]["Type"] == "AWS::CloudWatch::Alarm"
    assert alarm["AlarmActions"] == [{"Ref": "ScaleToZero"}]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/EC2", "CPUUtilization")
    assert alarm["Dimensions"] == [
        {"Name": "AutoScalingGroupName", "Value": {"Ref": "WorkerGroup"}}
    ]
    # Maximum: one busy instance keeps the whole fleet; idle means every instance is idle.
    assert alarm["Statistic"] == "Maximum"
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"
    assert alarm["EvaluationPeriods"] == {"Ref": "IdlePeriods"}
    # The unit does not restart a worker that exited cleanly, and nothing on the instance
    # tries to leave the group itself (the role could not).
    data = resources["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text = data["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert "Restart=on-failure" in text
    assert "autoscaling" not in text.replace("Auto Scaling", "")


def backend_calls() -> set[str]:
    source = "\n".join(p.read_text() for p in sorted((ROOT / "cmr/backends/aws").glob("*.py")))
    direct = set(re.findall(r"await (?:self\._)?(?:sqs|s3|db|c)\.(\w+)\(", source))
    via_call = set(re.findall(r'_call\(\s*\w+,\s*"(\w+)"', source))
    via_receipt = set(re.findall(r'_per_receipt\(\s*\w+,\s*"(\w+)"', source))
    paginated = set(re.findall(r'get_paginator\("(\w+)"\)', source))
    return (direct | via_call | via_receipt | paginated) - {"get_waiter", "get_paginator"}


def test_every_backend_call_is_known() -> None:
    unknown = backend_calls() - set(BACKEND_CALLS)
    assert not unknown, f"new AWS calls in cmr/backends/aws/, review the policy: {unknown}"


def test_policy_covers_every_worker_call(template: dict[str, Any]) -> None:
    granted = {a for st in statements(template) for a in as_list(st["Action"])}
    needed = {BACKEND_CALLS[c] for c in backend_calls()} - CREATE_ONLY
    assert needed <= granted, needed - granted


def test_imdsv2_required(template: dict[str, Any]) -> None:
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": ["WorkerProfile", "Arn"]}}


def test_table_matches_cmr_layout(template: dict[str, Any]) -> None:
    table = template["Resources"]["Table"]
    assert table["Condition"] == "MakeTable"
    props = table["Properties"]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert props["AttributeDefinitions"] == [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ]
    source = "\n".join(p.read_text() for p in sorted((ROOT / "cmr/backends/aws").glob("*.py")))
    assert '{"AttributeName": "pk", "KeyType": "HASH"}' in source
    assert '{"AttributeName": "sk", "KeyType": "RANGE"}' in source


def test_bucket_encrypted_and_private(template: dict[str, Any]) -> None:
    props = template["Resources"]["Bucket"]["Properties"]
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }


def test_group_mixes_on_demand_and_spot(template: dict[str, Any]) -> None:
    props = template["Resources"]["WorkerGroup"]["Properties"]
    dist = props["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["OnDemandPercentageAboveBaseCapacity"] == {"Fn::If": ["UseSpot", 0, 100]}
    assert props["MinSize"] == "0"
    assert {"InstanceType", "DesiredCount", "Spot", "SubnetIds", "VpcId", "Processes"} <= set(
        template["Parameters"]
    )


def test_user_data_has_no_bash_braces(template: dict[str, Any]) -> None:
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text = data["UserData"]["Fn::Base64"]["Fn::Sub"]
    refs = set(re.findall(r"\$\{([^}]+)\}", text))
    # LocalStack's Fn::Sub treats every ${...} (even ${!x}) as a reference: only real ones.
    assert refs <= set(template["Parameters"]) | {"AWS::Region", "AWS::StackName"}, refs
    assert "worker --backend aws" in text and "--no-create" in text
    assert "StandardOutput=journal+console" in text
