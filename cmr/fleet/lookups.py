"""What the fleet commands look up in the account: the network for a new stack, whether the
bucket and table exist, the group's instances, the jobs running, the idle alarm."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cmr.backends.aws.errors import error_code
from cmr.backends.aws.owner import DENIED_CODES, not_owned
from cmr.errors import FleetError
from cmr.fleet.stack import Aws
from cmr.records import ACTIVE_PK, JobState


def default_network(ec2: Any, subnets: list[str], vpc: str | None) -> tuple[str, list[str]]:
    """The given subnets and their VPC, or the default VPC's subnets."""
    if subnets:
        if vpc:
            return vpc, subnets
        got = ec2.describe_subnets(SubnetIds=subnets)["Subnets"]
        vpcs = {s["VpcId"] for s in got}
        if len(vpcs) != 1:
            raise FleetError(f"the subnets span {len(vpcs)} VPCs; pass subnets of one VPC")
        return vpcs.pop(), subnets
    if not vpc:
        found = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not found:
            raise FleetError("no default VPC in this region: pass --subnet (and --vpc)")
        vpc = str(found[0]["VpcId"])
    got = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    if not got:
        raise FleetError(f"VPC {vpc} has no subnets: pass --subnet")
    return vpc, sorted(str(s["SubnetId"]) for s in got)


def bucket_exists(s3: Any, bucket: str, account: str) -> bool:
    """Whether the bucket exists; one of another account is refused (the fleet's clients send
    ExpectedBucketOwner, see :meth:`cmr.fleet.stack.Aws.client`)."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
            return False
        if error_code(exc) in DENIED_CODES:
            raise FleetError(not_owned(bucket, account) + "; or pass another --bucket") from exc
        raise
    return True


def stack_tagged(tags: list[dict[str, Any]], stack: str) -> bool:
    """The resource carries the tag the template gives everything it makes for ``stack``."""
    return any(t.get("Key") == "cmr:fleet" and t.get("Value") == stack for t in tags)


def bucket_tags(s3: Any, bucket: str) -> list[dict[str, Any]]:
    try:
        return list(s3.get_bucket_tagging(Bucket=bucket).get("TagSet", []))
    except ClientError as exc:
        if error_code(exc) == "NoSuchTagSet":
            return []
        raise


def table_tags(db: Any, table: str) -> list[dict[str, Any]]:
    arn = db.describe_table(TableName=table)["Table"]["TableArn"]
    tags: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"ResourceArn": arn}
    while True:
        page = db.list_tags_of_resource(**kwargs)
        tags += page.get("Tags", [])
        if not page.get("NextToken"):
            return tags
        kwargs["NextToken"] = page["NextToken"]


def table_exists(db: Any, table: str) -> bool:
    try:
        db.describe_table(TableName=table)
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise
    return True


def fleet_instances(aws: Aws, group: dict[str, Any]) -> list[dict[str, Any]]:
    """The group's instances with their EC2 state, type and market (spot or on-demand)."""
    members = {i["InstanceId"]: i for i in group.get("Instances", [])}
    if not members:
        return []
    ec2 = aws.client("ec2")
    found: list[dict[str, Any]] = []
    for res in ec2.describe_instances(InstanceIds=sorted(members))["Reservations"]:
        for inst in res["Instances"]:
            member = members[inst["InstanceId"]]
            found.append(
                {
                    "id": inst["InstanceId"],
                    "type": inst.get("InstanceType", member.get("InstanceType", "?")),
                    "state": inst["State"]["Name"],
                    "lifecycle": member.get("LifecycleState", "?"),
                    "health": member.get("HealthStatus", "?"),
                    "market": "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand",
                    "zone": inst.get("Placement", {}).get("AvailabilityZone", "?"),
                }
            )
    return sorted(found, key=lambda i: str(i["id"]))


def running_jobs(aws: Aws, table: str) -> list[str]:
    """Ids of running jobs, from cmr's active-jobs index (pk ``jobs#active``)."""
    db = aws.client("dynamodb")
    ids: list[str] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": ACTIVE_PK}},
        "ProjectionExpression": "sk, #s",
        "ExpressionAttributeNames": {"#s": "state"},
    }
    while True:
        try:
            page = db.query(**kwargs)
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return []  # no table yet: cmr creates it with the first job
            raise
        ids.extend(
            str(item["sk"]["S"])
            for item in page.get("Items", [])
            # The active index keeps ended jobs until they are cleaned up: not running.
            if item.get("state", {}).get("S") == JobState.RUNNING.value
        )
        if "LastEvaluatedKey" not in page:
            return ids
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def idle_alarm(aws: Any, name: str | None) -> dict[str, Any]:
    """The idle alarm's state, or why it cannot be read (status must not fail on it)."""
    if not name:
        return {"name": None, "state": "unknown", "why": "the stack has no idle alarm"}
    try:
        got = aws.client("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"]
    except (ClientError, BotoCoreError) as exc:
        return {"name": name, "state": "unknown", "why": str(exc)}
    if not got:
        return {"name": name, "state": "unknown", "why": "no such alarm"}
    a = got[0]
    return {
        "name": name,
        "state": a.get("StateValue", "unknown"),
        "idle_minutes": int(a.get("EvaluationPeriods", 1)) * int(a.get("Period", 300)) // 60,
        "cpu_below_percent": a.get("Threshold"),
    }
