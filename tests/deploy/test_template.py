"""deploy/fleet.yaml as data: lint, least privilege (derived from the worker's own calls),
the bucket's policies, IMDSv2, encrypted volumes, the worker's sandbox, the user data's
parameters."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cmr.errors import FleetError
from cmr.fleet.params import _FLAGS as FLAGS
from cmr.fleet.params import _LISTS as LISTS
from cmr.fleet.params import DEFAULTS, PATTERNS, validate
from tests.deploy.conftest import ROOT, TEMPLATE, load_template, render_user_data

# The three resources, as the template writes them: the role may touch nothing else.
QUEUES = "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${QueuePrefix}*"
TABLE = "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${TableName}"
BUCKET = "arn:${AWS::Partition}:s3:::${BucketName}"
OBJECTS = "arn:${AWS::Partition}:s3:::${BucketName}/*"
FLEET = "arn:${AWS::Partition}:s3:::${BucketName}/fleet/*"
ALLOWED = {
    QUEUES: {
        "sqs:CreateQueue",  # a pipeline's next step's queues (cmr.pipeline), under the prefix
        "sqs:GetQueueUrl",
        "sqs:GetQueueAttributes",
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
    BUCKET: {"s3:ListBucket", "s3:ListBucketMultipartUploads"},
    OBJECTS: {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"},
}
FLEET_WRITES = {"s3:PutObject*", "s3:DeleteObject*", "s3:AbortMultipartUpload"}

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
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
    "create_bucket": "s3:CreateBucket",
    "list_buckets": "s3:ListAllMyBuckets",
    "get_item": "dynamodb:GetItem",
    "put_item": "dynamodb:PutItem",
    "update_item": "dynamodb:UpdateItem",
    "delete_item": "dynamodb:DeleteItem",
    # A transaction needs this for its checks, and each write's own action (see below).
    "transact_write_items": "dynamodb:ConditionCheckItem",
    "query": "dynamodb:Query",
    "describe_table": "dynamodb:DescribeTable",
    "create_table": "dynamodb:CreateTable",
    "list_tables": "dynamodb:ListTables",
}
# A transaction's writes, by the class the engine builds them with.
TX_WRITES = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
}
# What `cmr worker --no-create` calls when it opens the backend (the probe, then the bucket
# and table checked, never made): see cmr/backends/aws/provisioning.py.
OPEN_CALLS = {"get_queue_url", "head_bucket", "describe_table"}
PROTOCOL_CLASSES = {"queues": ("sqs.py", "AwsQueues"), "blobs": ("s3.py", "AwsBlobs"),
                    "table": ("dynamodb.py", "AwsTable")}  # fmt: skip
AWS = ROOT / "cmr" / "backends" / "aws"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def statements(template: dict[str, Any], effect: str = "Allow") -> list[dict[str, Any]]:
    role = template["Resources"]["WorkerRole"]["Properties"]
    found: list[dict[str, Any]] = []
    for policy in role["Policies"]:
        found.extend(policy["PolicyDocument"]["Statement"])
    return [st for st in found if st["Effect"] == effect]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def user_data(template: dict[str, Any]) -> str:
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text: str = data["UserData"]["Fn::Base64"]["Fn::Sub"]
    return text


@pytest.mark.slow
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
    assert re.search(r"^cfn-lint==\d+\.\d+\.\d+ \\\n\s+--hash=sha256:[0-9a-f]{64}", pins, re.M)


@pytest.mark.slow
def test_policy_grants_only_the_three_resources(template: dict[str, Any]) -> None:
    granted: dict[str, set[str]] = {}
    for st in statements(template):
        assert "NotAction" not in st and "NotResource" not in st and "Condition" not in st
        for resource in as_list(st["Resource"]):
            assert isinstance(resource, dict) and set(resource) == {"Fn::Sub"}, resource
            arn = resource["Fn::Sub"]
            assert arn in ALLOWED, f"statement {st.get('Sid')} grants {arn}"
            actions = set(as_list(st["Action"]))
            assert all("*" not in a for a in actions), actions
            assert actions <= ALLOWED[arn], actions - ALLOWED[arn]
            granted.setdefault(arn, set()).update(actions)
    assert granted == ALLOWED
    # The one Deny: nothing under fleet/ may be written or deleted by a worker.
    (deny,) = statements(template, "Deny")
    assert set(deny) == {"Sid", "Effect", "Action", "Resource"}
    assert deny["Resource"] == {"Fn::Sub": FLEET}
    assert set(deny["Action"]) == FLEET_WRITES
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


def role_allows(template: dict[str, Any], action: str, arn: str) -> bool:
    """IAM's evaluation of the role's own policy for one request: an explicit Deny wins,
    then any Allow; actions match case-insensitively, both with IAM's * and ? wildcards."""
    values = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
              "QueuePrefix": "cmr-", "TableName": "cmr", "BucketName": "cmr-bucket"}  # fmt: skip

    def matches(st: dict[str, Any]) -> bool:
        actions = [a.lower() for a in as_list(st["Action"])]
        resources = [
            re.sub(r"\$\{([^}]+)\}", lambda m: values[m.group(1)], r["Fn::Sub"])
            for r in as_list(st["Resource"])
        ]
        return any(fnmatch.fnmatchcase(action.lower(), a) for a in actions) and any(
            fnmatch.fnmatchcase(arn, r) for r in resources
        )

    if any(matches(st) for st in statements(template, "Deny")):
        return False
    return any(matches(st) for st in statements(template, "Allow"))


@pytest.mark.slow
def test_the_role_cannot_write_fleet(template: dict[str, Any]) -> None:
    """The wheel and the lock every instance installs are out of a worker's reach; the
    objects a worker does write (scratch under cmr/, job outputs) are not."""
    obj = "arn:aws:s3:::cmr-bucket/"
    wheel = f"fleet/wheels/{'a' * 64}/cmr-0.1.0-py3-none-any.whl"
    lock = f"fleet/locks/{'b' * 64}/requirements.txt"
    writes = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:PutObjectAcl",
              "s3:DeleteObjectVersion", "s3:PutObjectTagging"]  # fmt: skip
    for key in (wheel, lock, "fleet/anything-else"):
        assert [w for w in writes if role_allows(template, w, obj + key)] == []
        assert role_allows(template, "s3:GetObject", obj + key)  # the bootstrap reads them
    for key in ("cmr/jobs/20260101-000000-abc/plan", "cmr/results/j/part-00000", "out/part-1"):
        assert role_allows(template, "s3:PutObject", obj + key)
        assert role_allows(template, "s3:DeleteObject", obj + key)
    assert not role_allows(template, "s3:PutObject", "arn:aws:s3:::other-bucket/x")
    # Queues only under the prefix (a pipeline's worker makes its next step's), never listed.
    assert role_allows(template, "sqs:CreateQueue", "arn:aws:sqs:us-east-1:123456789012:cmr-x")
    assert not role_allows(template, "sqs:CreateQueue", "arn:aws:sqs:us-east-1:123456789012:x")
    assert not role_allows(template, "sqs:ListQueues", "arn:aws:sqs:us-east-1:123456789012:cmr-x")


@pytest.mark.slow
def test_only_wildcards_are_the_queue_prefix_and_the_objects(template: dict[str, Any]) -> None:
    for st in statements(template) + statements(template, "Deny"):
        for resource in as_list(st["Resource"]):
            arn = resource["Fn::Sub"]
            assert arn != "*"
            stars = [m.start() for m in re.finditer(r"\*", arn)]
            assert stars in ([], [len(arn) - 1]), arn


@pytest.mark.slow
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
    text = user_data(template)
    assert "Restart=on-failure" in text
    assert "autoscaling" not in text.replace("Auto Scaling", "")


def backend_calls() -> set[str]:
    source = "\n".join(p.read_text() for p in sorted(AWS.glob("*.py")))
    direct = set(re.findall(r"await (?:self\._)?(?:sqs|s3|db|c)\.(\w+)\(", source))
    via_call = set(re.findall(r'_call\(\s*\w+,\s*"(\w+)"', source))
    via_receipt = set(re.findall(r'_per_receipt\(\s*\w+,\s*"(\w+)"', source))
    paginated = set(re.findall(r'get_paginator\("(\w+)"\)', source))
    return (direct | via_call | via_receipt | paginated) - {"get_waiter", "get_paginator"}


def test_every_backend_call_is_known() -> None:
    unknown = backend_calls() - set(BACKEND_CALLS)
    assert not unknown, f"new AWS calls in cmr/backends/aws/, review the policy: {unknown}"


def protocol_calls(file: str, cls_name: str) -> dict[str, set[str]]:
    """Each method of a protocol class and the client calls it makes, its own helpers'
    (``self._url``, ``self._call(name, "op")``, ``self.size`` ...) included."""
    tree = ast.parse((AWS / file).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    ops: dict[str, set[str]] = {}
    helpers: dict[str, set[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        ops[fn.name], helpers[fn.name] = set(), set()
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if (
                isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "self"
                and owner.attr in ("_sqs", "_s3", "_db")
            ):
                ops[fn.name].add(node.func.attr)
            elif isinstance(owner, ast.Name) and owner.id == "self":
                helpers[fn.name].add(node.func.attr)
                if node.func.attr in ("_call", "_per_receipt"):
                    op = node.args[1]
                    if isinstance(op, ast.Constant):
                        ops[fn.name].add(str(op.value))

    def closed(name: str, seen: frozenset[str]) -> set[str]:
        found = set(ops.get(name, ()))
        for h in helpers.get(name, set()) - seen:
            found |= closed(h, seen | {name})
        return found

    return {name: closed(name, frozenset()) - {"get_waiter"} for name in ops}


def worker_sources() -> dict[str, str]:
    """The source of every cmr module a `cmr worker` process imports from cmr.worker on."""
    found: dict[str, str] = {}
    todo = ["cmr.worker"]
    while todo:
        name = todo.pop()
        base = ROOT / Path(*name.split("."))
        path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if name in found or name == "cmr" or not path.exists():
            continue
        found[name] = path.read_text()
        for node in ast.walk(ast.parse(found[name])):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cmr"):
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("cmr")]
    return found


def worker_actions() -> set[str]:
    """The IAM actions the worker's own calls need: the protocol methods its modules call,
    the client calls those make, and what opening the backend calls."""
    sources = worker_sources()
    # The worker command reaches the rest of cmr through these two alone; the client's
    # modules (api's submit, watch) are not the worker's.
    command = (ROOT / "cmr" / "cli" / "worker.py").read_text()
    assert set(re.findall(r"\bapi\.(\w+)", command)) == {"open_backend", "cpu_pool"}
    assert not {"cmr.api", "cmr.submit", "cmr.watch"} & set(sources)
    engine = "\n".join(s for name, s in sources.items() if not name.startswith("cmr.backends"))
    used = set(re.findall(r"\b(queues|blobs|table)\.(\w+)\(", engine))
    assert ("queues", "receive") in used and ("blobs", "upload_file") in used  # sanity
    calls = set(OPEN_CALLS)
    provisioning = (AWS / "provisioning.py").read_text()
    assert all(f".{c}(" in provisioning for c in OPEN_CALLS)
    for protocol, method in used:
        file, cls_name = PROTOCOL_CLASSES[protocol]
        calls |= protocol_calls(file, cls_name)[method]
    actions = {BACKEND_CALLS[c] for c in calls}
    if "transact_write_items" in calls:
        actions |= {a for w, a in TX_WRITES.items() if re.search(rf"\b{w}\(", engine)}
    return actions


@pytest.mark.slow
def test_the_role_is_exactly_what_the_worker_calls(template: dict[str, Any]) -> None:
    """Derived from the code: every action the worker needs is granted, and nothing else
    (no sqs:ListQueues: the submitter lists a job's queues; a worker creates queues only for
    a pipeline's next step, under the queue prefix)."""
    granted = {a for st in statements(template) for a in as_list(st["Action"])}
    needed = worker_actions()
    assert needed - granted == set(), "the worker calls what the role does not allow"
    assert granted - needed == set(), "the role allows what the worker never calls"
    assert "sqs:ListQueues" not in granted


def test_imdsv2_required_and_volumes_encrypted(template: dict[str, Any]) -> None:
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": ["WorkerProfile", "Arn"]}}
    (root,) = data["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda"  # AL2023's root device: the one that is there
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["DeleteOnTermination"] is True


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
    assert props["Tags"] == [{"Key": "cmr:fleet", "Value": {"Ref": "AWS::StackName"}}]
    source = "\n".join(p.read_text() for p in sorted(AWS.glob("*.py")))
    assert '{"AttributeName": "pk", "KeyType": "HASH"}' in source
    assert '{"AttributeName": "sk", "KeyType": "RANGE"}' in source


def test_bucket_encrypted_private_versioned_owner_enforced(template: dict[str, Any]) -> None:
    props = template["Resources"]["Bucket"]["Properties"]
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    (rule,) = props["LifecycleConfiguration"]["Rules"]
    assert rule["Status"] == "Enabled" and rule["NoncurrentVersionExpiration"]["NoncurrentDays"]
    assert props["Tags"] == [{"Key": "cmr:fleet", "Value": {"Ref": "AWS::StackName"}}]


def test_bucket_policy_is_tls_only_and_keeps_workers_off_fleet(template: dict[str, Any]) -> None:
    policy = template["Resources"]["BucketPolicy"]
    assert policy["Type"] == "AWS::S3::BucketPolicy" and policy["Condition"] == "MakeBucket"
    assert policy["Properties"]["Bucket"] == {"Ref": "Bucket"}
    tls, fleet = policy["Properties"]["PolicyDocument"]["Statement"]
    assert tls == {
        "Sid": "TlsOnly",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [{"Fn::Sub": BUCKET}, {"Fn::Sub": OBJECTS}],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    assert set(fleet.pop("Action")) == FLEET_WRITES
    assert fleet == {
        "Sid": "WorkersNeverWriteFleet",
        "Effect": "Deny",
        "Principal": "*",
        "Resource": {"Fn::Sub": FLEET},
        "Condition": {"ArnEquals": {"aws:PrincipalArn": {"Fn::GetAtt": ["WorkerRole", "Arn"]}}},
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
    text = user_data(template)
    refs = set(re.findall(r"\$\{([^}]+)\}", text))
    # LocalStack's Fn::Sub treats every ${...} (even ${!x}) as a reference: only real ones.
    pseudo = {"AWS::Region", "AWS::StackName", "AWS::AccountId"}
    assert refs <= set(template["Parameters"]) | pseudo, refs
    assert "worker --store" in text and "--no-create" in text
    assert "StandardOutput=journal+console" in text


def test_user_data_parameters_are_patterned_and_single_quoted(template: dict[str, Any]) -> None:
    """Each parameter reaches the shell once, in a single-quoted assignment, and only values
    of its AllowedPattern (the same one `cmr fleet up` checks first) can get there."""
    text = user_data(template)
    params = template["Parameters"]
    used = set(re.findall(r"\$\{([^}:]+)\}", text))
    assert used == set(PATTERNS) - {"InstanceType"}, used
    for name in used:
        assert params[name]["Type"] == "String"
        assert params[name]["AllowedPattern"] == PATTERNS[name], name
        lines = [line for line in text.splitlines() if "${" + name + "}" in line]
        assert len(lines) == 1 and re.fullmatch(rf"[A-Z_]+='\$\{{{name}\}}'", lines[0]), lines
    assert params["InstanceType"]["AllowedPattern"] == PATTERNS["InstanceType"]
    hostile = ["x'; touch /tmp/owned; '", "$(id)", "`id`", "a\nb", 'a"b', "a;b", "a|b", "a&b",
               "a>b", "*", "a?", "[a]", "~", "a\\b", "a\tb"]  # fmt: skip
    for name, pattern in PATTERNS.items():
        # "a b" is two entries of a list: one value only where the parameter is not a list.
        for value in hostile + ([] if name in LISTS else ["a b"]):
            assert not re.fullmatch(pattern, value), (name, value)
            with pytest.raises(FleetError, match=f"must match {re.escape(pattern)}"):
                validate({name: value})


# Values of the two lists that must never reach an instance: file paths and directories (job
# code there is the wheel's modules), globs, empty entries, quotes, other buckets' forms.
HOSTILE_LISTS = {
    "JobsFrom": ["", " ", "a  b", " a", "a ", "examples/wordcount.py", "/var/lib/cmr", ".",
                 "..", "./jobs", "a..b", "a.", ".a", "1a", "a-b", "a,b", "cmr.*", "a b'",
                 "a $(id)", "a `id`", "a\nb", "a\tb"],
    "OutputsUnder": [" ", "s3://bkt-1/x  s3://bkt-1/y", "s3://bkt-1/x y", "file:///etc/",
                     "http://bkt-1/", "s3://Bkt/", "s3://bkt-1//x", "s3://bkt-1/x*",
                     "s3://bkt-1/x'y", "s3://bkt-1/$(id)", "s3://bkt-1/x;y", "s3://bkt-1/a b",
                     "s3://bkt-1/~", "s3:/bkt-1/", "s3://bkt-1/x\n"],
}  # fmt: skip
HOSTILE_LISTS["InputsUnder"] = HOSTILE_LISTS["OutputsUnder"]  # the same kind of list


def test_list_parameters_refuse_paths_globs_and_spacing(template: dict[str, Any]) -> None:
    params = template["Parameters"]
    assert set(HOSTILE_LISTS) == set(LISTS)
    for name, values in HOSTILE_LISTS.items():
        assert params[name]["AllowedPattern"] == PATTERNS[name]
        for value in values:
            assert not re.fullmatch(PATTERNS[name], value), (name, value)
            with pytest.raises(FleetError, match=f"^{FLAGS[name]} .* is not allowed"):
                validate({name: value})
    # What they are for: module names, and s3:// prefixes (none at all: the whole bucket).
    for ok in ("cmr.loadgen.job", "myjobs", "my_jobs.wordcount cmr.loadgen.job", "_a.b_2"):
        assert re.fullmatch(PATTERNS["JobsFrom"], ok), ok
    for ok in ("", "s3://bkt-1/", "s3://bkt-1", "s3://bkt-1/out/ s3://bkt-1/a.b/c_d-e"):
        assert re.fullmatch(PATTERNS["OutputsUnder"], ok), ok
        assert re.fullmatch(PATTERNS["InputsUnder"], ok), ok
    # The stack's defaults are `cmr fleet up`'s: the load generator's job, the whole bucket.
    assert params["JobsFrom"]["Default"] == DEFAULTS["JobsFrom"] == "cmr.loadgen.job"
    assert params["OutputsUnder"]["Default"] == DEFAULTS["OutputsUnder"] == ""
    assert params["InputsUnder"]["Default"] == DEFAULTS["InputsUnder"] == ""


def worker_argv(template: dict[str, Any], tmp_path: Path, values: dict[str, str]) -> list[str]:
    """The arguments `cmr worker` gets from run-worker.sh for these parameter values: the user
    data's own lines that build the script, run by bash, then the script itself, with a
    `cmr` that prints its arguments."""
    rendered = {k: "x" for k in template["Parameters"]}
    rendered.update({"AWS::AccountId": "0" * 12, "AWS::Region": "r", "AWS::StackName": "s"})
    rendered.update(values)
    text = render_user_data(template, rendered)
    assignments = [line for line in text.splitlines() if re.fullmatch(r"[A-Z_]+='[^']*'", line)]
    admit = text[text.index('ADMIT=""') : text.index("# Endpoint overrides")]
    m = re.search(r'cat > "\$APP/run-worker\.sh" <<EOF\n.*?\nEOF\n', text, re.S)
    assert m, "no run-worker.sh in the user data"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    cmr = venv / "bin" / "cmr"
    cmr.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    cmr.chmod(0o755)
    (tmp_path / "worker.env").write_text("")
    program = "\n".join(
        [*assignments, f"APP={tmp_path}", f"VENV={venv}", f"ENV_FILE={tmp_path}/worker.env",
         admit, m.group(0), 'exec bash "$APP/run-worker.sh"']
    )  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", program], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    argv: list[str] = json.loads(done.stdout)
    return argv


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_run_worker_passes_one_flag_per_entry(template: dict[str, Any], tmp_path: Path) -> None:
    # A file in the worker's cwd that a glob in a list would expand to: none may.
    (tmp_path / "cmr.loadgen.jobX").write_text("")
    argv = worker_argv(
        template,
        tmp_path,
        {
            "JobsFrom": "myjobs.count cmr.loadgen.job",
            "OutputsUnder": "s3://bkt/out/ s3://bkt/b",
            "InputsUnder": "s3://bkt/in/ s3://bkt/c",
        },
    )
    assert argv[:2] == ["worker", "--store"]
    assert flag_values(argv, "--jobs-from") == ["myjobs.count", "cmr.loadgen.job"]
    assert flag_values(argv, "--outputs-under") == ["s3://bkt/out/", "s3://bkt/b"]
    assert flag_values(argv, "--inputs-under") == ["s3://bkt/in/", "s3://bkt/c"]
    assert "--no-create" in argv
    # No outputs or inputs given: no --outputs-under or --inputs-under, so the worker keeps
    # its defaults (its own bucket).
    argv = worker_argv(
        template, tmp_path, {"JobsFrom": "cmr.loadgen.job", "OutputsUnder": "", "InputsUnder": ""}
    )
    assert flag_values(argv, "--jobs-from") == ["cmr.loadgen.job"]
    assert "--outputs-under" not in argv and "--inputs-under" not in argv


def test_run_worker_passes_the_memory_mb(template: dict[str, Any], tmp_path: Path) -> None:
    """MemoryMb reaches `cmr worker --memory-mb` (the bootstrap has replaced auto by a figure
    by then: tests/deploy/test_bootstrap.py); its default is `cmr fleet up`'s."""
    argv = worker_argv(template, tmp_path, {"JobsFrom": "cmr.loadgen.job", "MemoryMb": "4096"})
    assert flag_values(argv, "--memory-mb") == ["4096"]
    assert template["Parameters"]["MemoryMb"]["Default"] == DEFAULTS["MemoryMb"] == "auto"
    for ok in ("auto", "64", "4096", "1048576"):
        assert re.fullmatch(PATTERNS["MemoryMb"], ok), ok
    for wrong in ("", "0", "10", "63", "064", "Auto", "auto64", "4096 ", "-1", "1e3", "12345678"):
        assert not re.fullmatch(PATTERNS["MemoryMb"], wrong), wrong


def test_user_data_refuses_an_empty_jobs_from(template: dict[str, Any], tmp_path: Path) -> None:
    """Without any --jobs-from a worker takes job code from its cwd, which on an instance is
    its own spool: the bootstrap stops before it installs anything."""
    values = {k: "x" for k in template["Parameters"]}
    values.update({"AWS::AccountId": "0" * 12, "AWS::Region": "r", "AWS::StackName": "s"})
    values["JobsFrom"] = ""
    log = tmp_path / "boot.log"
    done = subprocess.run(
        ["bash", "-c", render_user_data(template, values)],
        env={"PATH": "/usr/bin:/bin", "CMR_ROOT": str(tmp_path), "CMR_BOOT_LOG": str(log),
             "CMR_PYTHON": "false-python-never-run", "CMR_AWS": "false-aws-never-run"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "REFUSED: JobsFrom is empty" in log.read_text()
    assert not (tmp_path / "opt").exists()


def worker_unit(template: dict[str, Any], user: str, spool: Path, start: Path) -> str:
    """The systemd unit the user data writes, its shell variables filled in."""
    values = {k: "x" for k in template["Parameters"]}
    values.update({"AWS::AccountId": "0" * 12, "AWS::Region": "us-east-1", "AWS::StackName": "s"})
    text = render_user_data(template, values)
    m = re.search(r'cmr-worker\.service" <<EOF\n(.*?)\nEOF\n', text, re.S)
    assert m, "no unit in the user data"
    names = {"$APP/run-worker.sh": str(start), "$WORKER_USER": user, "$WORKER_GROUP": user,
             "$SPOOL": str(spool), "$BUCKET": "b", "$TABLE": "t"}  # fmt: skip
    unit = m.group(1)
    for k, v in names.items():
        unit = unit.replace(k, v)
    assert "$" not in unit, unit
    return unit + "\n"


def test_worker_unit_is_non_root_and_sandboxed(template: dict[str, Any], tmp_path: Path) -> None:
    text = user_data(template)
    assert 'WORKER_USER=$(pick "$CMR_WORKER_USER" cmr)' in text  # a system user of its own
    assert "useradd --system" in text and "--shell /sbin/nologin" in text
    assert 'install -m 0600 -o "$WORKER_USER"' in text  # worker.env, before anything is in it
    unit = worker_unit(template, "cmr", tmp_path / "spool", tmp_path / "run.sh")
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#"
    )
    expected = {
        "User": "cmr",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ReadWritePaths": str(tmp_path / "spool"),
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }
    assert {k: settings.get(k) for k in expected} == expected


def test_systemd_accepts_the_unit_and_rates_its_exposure_low(
    template: dict[str, Any], tmp_path: Path
) -> None:
    """systemd's own reading of the unit: every directive known, and `systemd-analyze
    security` rates the sandbox (0 = locked down, 10 = none) under 2.0."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    start = tmp_path / "run.sh"
    start.write_text("#!/bin/sh\n")
    start.chmod(0o755)
    path = tmp_path / "cmr-worker.service"
    path.write_text(worker_unit(template, "cmr", tmp_path, start))
    done = subprocess.run(
        [exe, "security", "--offline=yes", "--threshold=20", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "Unknown key" not in done.stderr and "Failed" not in done.stderr, done.stderr
    score = re.search(r"Overall exposure level for cmr-worker\.service: ([0-9.]+)", done.stdout)
    assert score and float(score.group(1)) < 2.0, done.stdout[-500:]
