"""`cmr fleet status` on a stack an earlier `cmr fleet up` left half-created (no outputs, no
group): it reports what exists and what is missing, in plain lines and in --json, instead of
dying on the first output it expected."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
from typer.testing import CliRunner

from cmr.cli import app
from cmr.fleet.status import OUTPUTS
from tests.deploy.conftest import fleet, fleet_status

ROLE = {
    "WorkerRole": {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "ec2.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            }
        },
    }
}


def half_made(stack: str, outputs: dict[str, str]) -> None:
    """A stack holding only the fleet's role, with these outputs (as a failed `up` whose
    rollback was turned off leaves it: some resources made, the group not)."""
    template: dict[str, object] = {"Resources": ROLE}
    if outputs:
        template["Outputs"] = {k: {"Value": v} for k, v in outputs.items()}
    cfn = boto3.client("cloudformation")
    cfn.create_stack(StackName=stack, TemplateBody=json.dumps(template))
    cfn.get_waiter("stack_create_complete").wait(StackName=stack)


@pytest.mark.usefixtures("moto_env")
@pytest.mark.slow
def test_status_of_a_stack_without_outputs() -> None:
    stack = f"fleet-half-{uuid.uuid4().hex[:8]}"
    half_made(stack, {})
    try:
        report = fleet_status(stack)
        assert report["missing_outputs"] == list(OUTPUTS)
        assert [(r["logical_id"], r["type"]) for r in report["resources"]] == [
            ("WorkerRole", "AWS::IAM::Role")
        ]
        assert (report["group"], report["group_missing"]) == (
            None,
            "the stack has no GroupName output",
        )
        assert report["instances"] == [] and report["store"] is None
        assert report["desired"] is None and report["running_jobs"] == []

        shown = fleet("status", "--stack", stack)
        assert "KeyError" not in shown and "Traceback" not in shown
        lines = shown.splitlines()
        assert lines[0].startswith(f"stack {stack} CREATE_COMPLETE  group (none)  not available")
        assert lines[1] == (
            f"stack {stack} lacks the outputs {', '.join(OUTPUTS)}: it was left half-created "
            f"(by a failed `cmr fleet up`?); `cmr fleet down --stack {stack}` removes it, "
            f"`cmr fleet up --stack {stack}` makes it anew"
        )
        assert lines[2] == "the stack holds 1 resources:"
        assert lines[3].startswith("  WorkerRole AWS::IAM::Role CREATE_COMPLETE ")
        assert "instance" not in shown  # no empty table of a group that does not exist
        assert "running jobs: none" in shown
    finally:
        boto3.client("cloudformation").delete_stack(StackName=stack)


@pytest.mark.usefixtures("moto_env")
def test_status_of_a_stack_whose_group_is_gone() -> None:
    tag = uuid.uuid4().hex[:8]
    stack = f"fleet-half-{tag}"
    half_made(
        stack,
        {"GroupName": f"{stack}-group", "BucketName": f"b-{tag}", "TableName": f"t-{tag}"},
    )
    try:
        report = fleet_status(stack)
        assert report["missing_outputs"] == ["QueuePrefix", "IdleAlarmName"]
        assert report["group"] == f"{stack}-group"
        assert report["group_missing"] == f"Auto Scaling group {stack}-group does not exist"
        assert report["store"] is None  # no queue prefix: no store to submit to
        result = CliRunner().invoke(app, ["fleet", "status", "--stack", stack])
        assert result.exit_code == 0, result.output
        assert "lacks the outputs QueuePrefix, IdleAlarmName" in result.stdout
        assert "idle scale-in: state unknown (the stack has no idle alarm)" in result.stdout
    finally:
        boto3.client("cloudformation").delete_stack(StackName=stack)


@pytest.mark.usefixtures("moto_env")
def test_status_of_no_stack_is_one_line() -> None:
    result = CliRunner().invoke(app, ["fleet", "status", "--stack", "fleet-never-made"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: no fleet stack fleet-never-made: run `cmr fleet up` first"
    )
