"""The fleet's CloudFormation stack and its Auto Scaling group: a boto3 session, describing,
creating or updating, and waiting until the stack settles.

Importing this module loads boto3; ``cmr.fleet.commands`` imports it only inside a command,
so that other ``cmr`` commands never pay for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from cmr.backends.aws.errors import error_code
from cmr.backends.aws.owner import expect_owner
from cmr.errors import FleetError

POLL_S = 2.0
_DONE = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "DELETE_COMPLETE", "IMPORT_COMPLETE"}
_FAILED_SUFFIXES = ("_FAILED", "ROLLBACK_COMPLETE")


@dataclass
class Aws:
    session: Any
    region: str
    _account: str = field(default="", repr=False)

    def client(self, service: str) -> Any:
        extra: dict[str, Any] = {}
        if service == "s3" and (
            os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        ):
            # Local endpoints cannot route virtual-hosted bucket names on host:port.
            extra["s3"] = {"addressing_style": "path"}
        config = Config(retries={"mode": "standard", "max_attempts": 6}, **extra)
        client = self.session.client(service, region_name=self.region, config=config)
        if service == "s3":
            # The fleet's bucket is the caller's account's, always: a bucket of the same name
            # in another account is never read, written or emptied.
            expect_owner(client, self.account())
        return client

    def account(self) -> str:
        """The caller's account id (one STS call, remembered)."""
        if not self._account:
            got = self.client("sts").get_caller_identity()
            self._account = str(got["Account"])
        return self._account


def session(region: str | None, profile: str | None) -> Aws:
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
    except BotoCoreError as exc:
        raise FleetError(str(exc)) from exc
    return Aws(session, session.region_name or "us-east-1")


def account(aws: Aws) -> str:
    return aws.account()


def describe_stack(cfn: Any, stack: str) -> dict[str, Any] | None:
    try:
        got = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if error_code(exc) == "ValidationError" and "does not exist" in str(exc):
            return None
        raise
    if not got or got[0]["StackStatus"] == "DELETE_COMPLETE":
        return None
    return dict(got[0])


def stack_params(stack: dict[str, Any]) -> dict[str, str]:
    return {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}


def stack_outputs(stack: dict[str, Any]) -> dict[str, str]:
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


def apply(
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
    name = stack_outputs(got).get("GroupName")
    if not name:
        raise FleetError(f"stack {stack} has no GroupName output (status {got['StackStatus']})")
    return name


def find_group(autoscaling: Any, name: str) -> tuple[dict[str, Any] | None, str]:
    """The group, or None and why: LocalStack community accepts the template's group but
    creates none and serves no Auto Scaling API (see README "Running on EC2")."""
    try:
        got = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    except ClientError as exc:
        if error_code(exc) in ("InternalFailure", "NotImplemented", "501"):
            return None, f"this endpoint has no Auto Scaling API ({error_code(exc)})"
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
