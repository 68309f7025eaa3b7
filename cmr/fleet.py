"""``cmr fleet``: run identical ``cmr worker`` processes on EC2 from ``deploy/fleet.yaml``.

up      build the project's wheel, upload it to the bucket, create or update the stack
scale   set the Auto Scaling group's desired capacity
status  instances and their states, running jobs, an hourly cost estimate
logs    recent worker output (EC2 console output: the unit writes to journald and console)
down    delete the stack; the bucket and table go too unless --keep-data

Endpoints and credentials come from the standard AWS settings (AWS_ENDPOINT_URL*,
AWS_PROFILE, AWS_REGION ...), as for the aws backend, so LocalStack and moto need no flags.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import boto3
import typer
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError
from rich.console import Console
from rich.table import Table

from cmr.cliopts import Profile, Region, err, fail
from cmr.records import ACTIVE_PK, JobState

fleet_app = typer.Typer(
    no_args_is_help=True,
    help="Run a worker fleet on EC2: up, scale, status, logs, down (deploy/fleet.yaml).",
)
out = Console(soft_wrap=True)

TEMPLATE = "deploy/fleet.yaml"
PRICES = "deploy/prices.json"
WHEEL_PREFIX = "fleet/wheels"
POLL_S = 2.0
_DONE = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "DELETE_COMPLETE", "IMPORT_COMPLETE"}
_FAILED_SUFFIXES = ("_FAILED", "ROLLBACK_COMPLETE")

StackName = Annotated[str, typer.Option("--stack", help="CloudFormation stack name")]
Timeout = Annotated[float, typer.Option(help="seconds to wait for the stack")]


class FleetError(Exception):
    """A failure with a message meant for the user."""


@dataclass
class Aws:
    session: Any
    region: str

    def client(self, service: str) -> Any:
        extra: dict[str, Any] = {}
        if service == "s3" and (
            os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        ):
            # Local endpoints cannot route virtual-hosted bucket names on host:port.
            extra["s3"] = {"addressing_style": "path"}
        config = Config(retries={"mode": "standard", "max_attempts": 6}, **extra)
        return self.session.client(service, region_name=self.region, config=config)


def _aws(region: str | None, profile: str | None) -> Aws:
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
    except BotoCoreError as exc:
        raise FleetError(str(exc)) from exc
    return Aws(session, session.region_name or "us-east-1")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def project_root(start: Path | None = None) -> Path:
    """The nearest directory up from ``start`` holding both pyproject.toml and the template."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / TEMPLATE).is_file():
            return d
    raise FleetError(f"no project with {TEMPLATE} at or above {here}: run from the cmr checkout")


def build_wheel(root: Path, outdir: Path) -> Path:
    """Build the project's wheel with uv (offline-capable) or, failing that, ``python -m build``."""
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "build", "--wheel", "--out-dir", str(outdir), str(root)]
    else:
        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(root)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(outdir.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise FleetError(f"building the wheel failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return wheels[-1]


def wheel_key(wheel: Path) -> str:
    """Content-addressed key: a changed wheel is a new key, so the stack update rolls it out."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    return f"{WHEEL_PREFIX}/{digest}/{wheel.name}"


def describe_stack(cfn: Any, stack: str) -> dict[str, Any] | None:
    try:
        got = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if _code(exc) == "ValidationError" and "does not exist" in str(exc):
            return None
        raise
    if not got or got[0]["StackStatus"] == "DELETE_COMPLETE":
        return None
    return dict(got[0])


def _params(stack: dict[str, Any]) -> dict[str, str]:
    return {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}


def _outputs(stack: dict[str, Any]) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def wait_stack(
    cfn: Any, stack: str, timeout: float, on_tick: Callable[[], None] | None = None
) -> str:
    """Poll until the stack settles; raise with its failure events if it did not succeed."""
    deadline = time.monotonic() + timeout
    while True:
        got = describe_stack(cfn, stack)
        status = "DELETE_COMPLETE" if got is None else str(got["StackStatus"])
        if status in _DONE:
            return status
        if status.endswith(_FAILED_SUFFIXES):
            raise FleetError(f"stack {stack} ended {status}:\n{_failure_events(cfn, stack)}")
        if time.monotonic() > deadline:
            raise FleetError(f"stack {stack} still {status} after {timeout:.0f}s")
        if on_tick:
            on_tick()
        time.sleep(POLL_S)


def _failure_events(cfn: Any, stack: str) -> str:
    try:
        events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
    except ClientError:
        return "(no events)"
    lines = [
        f"  {e.get('LogicalResourceId')}: {e.get('ResourceStatus')} "
        f"{e.get('ResourceStatusReason', '')}"
        for e in events
        if str(e.get("ResourceStatus", "")).endswith("FAILED")
    ]
    return "\n".join(lines[:20]) or "(no failed resources reported)"


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


def bucket_exists(s3: Any, bucket: str) -> bool:
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise
    return True


def table_exists(db: Any, table: str) -> bool:
    try:
        db.describe_table(TableName=table)
    except ClientError as exc:
        if _code(exc) == "ResourceNotFoundException":
            return False
        raise
    return True


def _apply(
    cfn: Any,
    stack: str,
    body: str,
    params: dict[str, str],
    exists: bool,
    timeout: float,
) -> None:
    listed = [{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()]
    kwargs: dict[str, Any] = {
        "StackName": stack,
        "TemplateBody": body,
        "Parameters": listed,
        "Capabilities": ["CAPABILITY_IAM"],
        "Tags": [{"Key": "cmr:fleet", "Value": stack}],
    }
    if not exists:
        cfn.create_stack(**kwargs)
    else:
        try:
            cfn.update_stack(**kwargs)
        except ClientError as exc:
            if "No updates are to be performed" in str(exc):
                return
            raise
    wait_stack(cfn, stack, timeout)


def group_name(aws: Aws, stack: str) -> str:
    got = describe_stack(aws.client("cloudformation"), stack)
    if got is None:
        raise FleetError(f"no fleet stack {stack}: run `cmr fleet up` first")
    name = _outputs(got).get("GroupName")
    if not name:
        raise FleetError(f"stack {stack} has no GroupName output (status {got['StackStatus']})")
    return name


def find_group(autoscaling: Any, name: str) -> tuple[dict[str, Any] | None, str]:
    """The group, or None and why: LocalStack community accepts the template's group but
    creates none and serves no Auto Scaling API (see README "Running on EC2")."""
    try:
        got = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    except ClientError as exc:
        if _code(exc) in ("InternalFailure", "NotImplemented", "501"):
            return None, f"this endpoint has no Auto Scaling API ({_code(exc)})"
        raise
    groups = got["AutoScalingGroups"]
    if not groups:
        return None, f"Auto Scaling group {name} does not exist"
    return dict(groups[0]), ""


def describe_group(autoscaling: Any, name: str) -> dict[str, Any]:
    group, why = find_group(autoscaling, name)
    if group is None:
        raise FleetError(why)
    return group


def load_prices(root: Path | None) -> dict[str, Any]:
    path = (root or project_root()) / PRICES
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def hourly_cost(instances: list[dict[str, Any]], prices: dict[str, Any]) -> tuple[float, list[str]]:
    """Estimated USD/hour of the pending or running instances, and the types without a price."""
    table: dict[str, float] = prices["on_demand_hourly"]
    discount = float(prices["spot_discount_assumption"])
    total, unknown = 0.0, []
    for inst in instances:
        if inst["state"] not in ("pending", "running"):
            continue
        price = table.get(inst["type"])
        if price is None:
            unknown.append(inst["type"])
            continue
        total += price * (1 - discount) if inst["market"] == "spot" else price
    return total, sorted(set(unknown))


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
            if _code(exc) == "ResourceNotFoundException":
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
            if "NonExistentQueue" not in str(exc) and "QueueDoesNotExist" not in str(exc):
                raise
    return len(urls)


def _run(fn: Callable[[], None]) -> None:
    """Run a command body; AWS and fleet failures become one readable line and exit 1."""
    try:
        fn()
    except (FleetError, ClientError, BotoCoreError, ResponseParserError) as exc:
        fail(str(exc))


def _account(aws: Aws) -> str:
    return str(aws.client("sts").get_caller_identity()["Account"])


# What `up` uses when neither the command line nor the existing stack says otherwise.
DEFAULTS = {
    "TableName": "cmr",
    "QueuePrefix": "cmr-",
    "InstanceType": "c7i.large",
    "Spot": "false",
    "OnDemandBase": "0",
    "MaxCount": "20",
    "Processes": "2",
    "IdleExitSeconds": "300",
}


ALARM_PERIOD_S = 300  # EC2's basic monitoring: one CPU figure per instance every 5 minutes


def idle_periods(idle_exit_s: int) -> int:
    """5-minute periods of an all-idle fleet before its alarm scales it to zero: the workers'
    idle time, rounded up, so the fleet outlives no worker by more than one period."""
    return max(1, math.ceil(idle_exit_s / ALARM_PERIOD_S))


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


def _opt(value: object) -> str | None:
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


@fleet_app.command()
def up(
    count: Annotated[
        int | None, typer.Option(help="instances (default: 1, or the current)")
    ] = None,
    stack: StackName = "cmr-fleet",
    bucket: Annotated[
        str | None, typer.Option(help="bucket (default: cmr-<account>-<region>)")
    ] = None,
    table: Annotated[str | None, typer.Option("--table", help="DynamoDB table [cmr]")] = None,
    queue_prefix: Annotated[str | None, typer.Option(help="prefix of cmr's queues [cmr-]")] = None,
    instance_type: Annotated[str | None, typer.Option(help="EC2 type [c7i.large]")] = None,
    spot: Annotated[
        bool | None, typer.Option(help="instances above the on-demand base as spot [no]")
    ] = None,
    on_demand_base: Annotated[int | None, typer.Option(help="always on-demand [0]")] = None,
    max_count: Annotated[int | None, typer.Option("--max", help="group bound [20]")] = None,
    processes: Annotated[int | None, typer.Option(help="worker processes per instance [2]")] = None,
    idle_exit: Annotated[
        int | None,
        typer.Option(help="idle seconds before a worker exits; the fleet then scales to 0 [300]"),
    ] = None,
    subnet: Annotated[
        list[str], typer.Option(help="subnet id (repeat); default: the default VPC's")
    ] = [],  # noqa: B006
    vpc: Annotated[
        str | None, typer.Option(help="VPC id (default: the subnets' or the default)")
    ] = None,
    create_table: Annotated[
        bool | None, typer.Option(help="let the stack create the table (default: if missing)")
    ] = None,
    image: Annotated[
        str | None, typer.Option(help="AMI SSM parameter name (default: AL2023)")
    ] = None,
    wheel: Annotated[
        Path | None, typer.Option(help="a built wheel (default: build the project)")
    ] = None,
    timeout: Timeout = 1800,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Build and upload the wheel, then create or update the fleet's stack. On an update,
    every option not given keeps the stack's current value."""

    def body() -> None:
        aws = _aws(region, profile)
        root = project_root()
        cfn, s3 = aws.client("cloudformation"), aws.client("s3")
        current = describe_stack(cfn, stack)
        if current is not None and str(current["StackStatus"]).endswith("_IN_PROGRESS"):
            raise FleetError(f"stack {stack} is {current['StackStatus']}: wait and retry")
        prev = _params(current) if current else {}
        given = {
            "TableName": _opt(table),
            "QueuePrefix": _opt(queue_prefix),
            "InstanceType": _opt(instance_type),
            "Spot": _opt(spot),
            "OnDemandBase": _opt(on_demand_base),
            "MaxCount": _opt(max_count),
            "Processes": _opt(processes),
            "IdleExitSeconds": _opt(idle_exit),
        }
        params: dict[str, str] = {}
        for k, default in DEFAULTS.items():
            value = given[k]
            params[k] = value if value is not None else prev.get(k, default)
        name = bucket or prev.get("BucketName") or f"cmr-{_account(aws)}-{aws.region}"
        if subnet or vpc or not prev:
            vpc_id, subnets = default_network(aws.client("ec2"), subnet, vpc)
        else:
            # moto reports a list parameter as a Python list's repr: take the ids in any form.
            vpc_id, subnets = prev["VpcId"], re.findall(r"subnet-[0-9A-Za-z]+", prev["SubnetIds"])
        with tempfile.TemporaryDirectory() as tmp:
            whl = wheel or build_wheel(root, Path(tmp))
            key = wheel_key(whl)
            if current is None:
                make_bucket = not bucket_exists(s3, name)
                make_table = (
                    create_table
                    if create_table is not None
                    else not table_exists(aws.client("dynamodb"), params["TableName"])
                )
            else:
                # Keep what the stack owns: flipping these would orphan or clash with a resource.
                make_bucket = prev.get("CreateBucket") == "true"
                make_table = prev.get("CreateTable") == "true"
            if count is not None:
                desired = count
            elif current is not None:
                group, _ = find_group(aws.client("autoscaling"), group_name(aws, stack))
                desired = int(group["DesiredCapacity"] if group else prev["DesiredCount"])
            else:
                desired = 1
            params.update(
                {
                    "BucketName": name,
                    "CreateBucket": str(make_bucket).lower(),
                    "CreateTable": str(make_table).lower(),
                    "WheelKey": key,
                    "DesiredCount": str(desired),
                    "MaxCount": str(max(int(params["MaxCount"]), desired)),
                    "VpcId": vpc_id,
                    "SubnetIds": ",".join(subnets),
                }
            )
            params["IdlePeriods"] = str(idle_periods(int(params["IdleExitSeconds"])))
            if image:
                params["ImageId"] = image
            elif prev.get("ImageId", "").startswith("/"):
                # An SSM parameter name; moto reports the resolved AMI id here, which must not
                # be passed back as a parameter name.
                params["ImageId"] = prev["ImageId"]
            template = (root / TEMPLATE).read_text()
            if current is None and make_bucket:
                # The stack makes the bucket, so it starts with no instances until the wheel is in.
                err.print(f"creating stack {stack} (bucket {name}), then uploading the wheel")
                _apply(cfn, stack, template, {**params, "DesiredCount": "0"}, False, timeout)
                current = describe_stack(cfn, stack)
            s3.upload_file(str(whl), name, key)
            err.print(f"uploaded {whl.name} to s3://{name}/{key}")
            err.print(
                f"{'updating' if current else 'creating'} stack {stack}: "
                f"{desired} x {params['InstanceType']}"
            )
            _apply(cfn, stack, template, params, current is not None, timeout)
        spot_note = " (spot)" if params["Spot"] == "true" else ""
        out.print(
            f"fleet {stack} up: {desired} x {params['InstanceType']}{spot_note}, bucket {name}, "
            f"table {params['TableName']}, queues {params['QueuePrefix']}*",
            highlight=False,
        )

    _run(body)


@fleet_app.command()
def scale(
    count: Annotated[int, typer.Argument(help="desired number of instances")],
    stack: StackName = "cmr-fleet",
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Set the group's desired capacity (the stack's template is not touched)."""

    def body() -> None:
        aws = _aws(region, profile)
        name = group_name(aws, stack)
        autoscaling = aws.client("autoscaling")
        group = describe_group(autoscaling, name)
        if count < 0 or count > int(group["MaxSize"]):
            raise FleetError(
                f"{count} is outside 0..{group['MaxSize']}: raise the bound with "
                f"`cmr fleet up --max {max(count, 1)}`"
            )
        autoscaling.set_desired_capacity(
            AutoScalingGroupName=name, DesiredCapacity=count, HonorCooldown=False
        )
        out.print(
            f"{name}: desired capacity {group['DesiredCapacity']} -> {count}", highlight=False
        )

    _run(body)


@fleet_app.command()
def status(
    stack: StackName = "cmr-fleet",
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Instances and their states, jobs being served, and an hourly cost estimate."""

    def body() -> None:
        aws = _aws(region, profile)
        got = describe_stack(aws.client("cloudformation"), stack)
        if got is None:
            raise FleetError(f"no fleet stack {stack}")
        outputs, params = _outputs(got), _params(got)
        group, why = find_group(aws.client("autoscaling"), outputs["GroupName"])
        instances = fleet_instances(aws, group) if group else []
        jobs = running_jobs(aws, outputs.get("TableName", params.get("TableName", "cmr")))
        prices = load_prices(None)
        cost, unknown = hourly_cost(instances, prices)
        report = {
            "stack": stack,
            "stack_status": got["StackStatus"],
            "group": outputs["GroupName"],
            "group_missing": why or None,
            "desired": int(group["DesiredCapacity"]) if group else None,
            "min": int(group["MinSize"]) if group else None,
            "max": int(group["MaxSize"]) if group else None,
            "instances": instances,
            "running_jobs": jobs,
            "hourly_cost_usd": round(cost, 4),
            "unpriced_types": unknown,
            "prices_as_of": prices["as_of"],
            "prices_verified": bool(prices.get("verified", False)),
            "prices_region": prices["region"],
            "region": aws.region,
            "idle_alarm": idle_alarm(aws, outputs.get("IdleAlarmName")),
        }
        if as_json:
            out.print_json(json.dumps(report))
            return
        sizes = (
            f"desired {report['desired']} (min {report['min']}, max {report['max']})"
            if group
            else f"not available: {why}"
        )
        out.print(
            f"stack {stack} {got['StackStatus']}  group {report['group']}  {sizes}",
            highlight=False,
        )
        t = Table("instance", "type", "market", "state", "lifecycle", "health", "zone")
        t.columns[0].no_wrap = True
        for i in instances:
            t.add_row(
                i["id"], i["type"], i["market"], i["state"], i["lifecycle"], i["health"], i["zone"]
            )
        out.print(t)
        out.print(f"running jobs: {', '.join(jobs) if jobs else 'none'}", highlight=False)
        alarm = report["idle_alarm"]
        if "idle_minutes" in alarm:
            out.print(
                f"idle scale-in: alarm {alarm['name']} is {alarm['state']}; the group goes to 0 "
                f"after {alarm['idle_minutes']} min with every instance under "
                f"{alarm['cpu_below_percent']:g}% CPU",
                highlight=False,
            )
        else:
            out.print(f"idle scale-in: state unknown ({alarm['why']})", highlight=False)
        note = "" if aws.region == prices["region"] else f", priced as {prices['region']}"
        missing = f"; no price for {', '.join(unknown)}" if unknown else ""
        out.print(
            f"estimated cost: ${cost:.4f}/hour (prices of {prices['as_of']}, spot at "
            f"{prices['spot_discount_assumption']:.0%} off{note}{missing}"
            f"{'' if prices.get('verified') else ', unverified'}; see {PRICES})",
            highlight=False,
        )

    _run(body)


@fleet_app.command()
def logs(
    stack: StackName = "cmr-fleet",
    lines: Annotated[int, typer.Option("--lines", "-n", help="lines per instance")] = 50,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Recent worker output per instance, from the EC2 console (the unit logs to journald and the
    console, so this needs no agent and no permission on the instance)."""

    def body() -> None:
        aws = _aws(region, profile)
        group, why = find_group(aws.client("autoscaling"), group_name(aws, stack))
        if group is None:
            out.print(f"no instances: {why}", highlight=False)
            return
        ec2 = aws.client("ec2")
        members = [i["InstanceId"] for i in group.get("Instances", [])]
        if not members:
            out.print("no instances in the group")
        for iid in members:
            try:
                got = ec2.get_console_output(InstanceId=iid, Latest=True)
            except ClientError as exc:
                if _code(exc) != "UnsupportedOperation":
                    raise
                got = ec2.get_console_output(InstanceId=iid)
            text = str(got.get("Output") or "")
            tail = text.splitlines()[-lines:] if text else ["(no console output yet)"]
            out.print(f"==> {iid} <==", highlight=False)
            for line in tail:
                out.print(line, highlight=False, markup=False)

    _run(body)


@fleet_app.command()
def down(
    stack: StackName = "cmr-fleet",
    keep_data: Annotated[
        bool, typer.Option(help="keep the bucket, the table and the queues")
    ] = False,
    timeout: Timeout = 1800,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Delete the stack (instances, group, role ...); then the bucket, table and queues."""

    def body() -> None:
        aws = _aws(region, profile)
        cfn = aws.client("cloudformation")
        got = describe_stack(cfn, stack)
        if got is None:
            raise FleetError(f"no fleet stack {stack}")
        params = _params(got)
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

    _run(body)
