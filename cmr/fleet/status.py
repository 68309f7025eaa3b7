"""``cmr fleet status`` and ``logs``: what the fleet is doing and what it costs."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cmr.cli.options import safe_text
from cmr.cli.tables import keep_whole, print_table
from cmr.errors import FleetError
from cmr.fleet.cost import PRICES, hourly_cost, load_prices
from cmr.fleet.lookups import fleet_instances, idle_alarm, running_jobs
from cmr.fleet.params import DEFAULTS, store_url
from cmr.fleet.stack import Aws, describe_stack, find_group, group_name, stack_outputs, stack_params
from cmr.logs import inert

# The outputs `cmr fleet up` leaves on a stack it made; one without them was left
# half-created (a failed `up` whose rollback was disabled, or still in progress).
OUTPUTS = ("GroupName", "BucketName", "TableName", "QueuePrefix", "IdleAlarmName")


def report(aws: Aws, stack: str) -> dict[str, Any]:
    """The status report, as ``cmr fleet status --json`` prints it: whatever of the fleet
    exists, and what it lacks (a stack left half-created has no outputs, no group)."""
    cfn = aws.client("cloudformation")
    got = describe_stack(cfn, stack)
    if got is None:
        raise FleetError(f"no fleet stack {stack}: run `cmr fleet up` first")
    outputs, params = stack_outputs(got), stack_params(got)
    missing = [name for name in OUTPUTS if not outputs.get(name)]
    name = outputs.get("GroupName")
    if name:
        group, why = find_group(aws.client("autoscaling"), name)
    else:
        group, why = None, "the stack has no GroupName output"
    instances = fleet_instances(aws, group) if group else []
    table = outputs.get("TableName") or params.get("TableName") or DEFAULTS["TableName"]
    jobs = running_jobs(aws, table)
    prices = load_prices(None)
    cost, unknown = hourly_cost(instances, prices)
    parts = ("BucketName", "TableName", "QueuePrefix")
    named = {k: v for k in parts if (v := outputs.get(k) or params.get(k))}
    return {
        "stack": stack,
        "stack_status": got["StackStatus"],
        "stack_reason": got.get("StackStatusReason"),
        "missing_outputs": missing,
        "resources": stack_resources(cfn, stack),
        "store": store_url(named, aws.account()) if len(named) == len(parts) else None,
        "group": name,
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


def stack_resources(cfn: Any, stack: str) -> list[dict[str, str]]:
    """The stack's resources and their states (what a half-made stack does hold)."""
    from botocore.exceptions import ClientError

    try:
        got = cfn.describe_stack_resources(StackName=stack)["StackResources"]
    except ClientError:
        return []  # status reports what it can: the outputs and the group say the rest
    return [
        {
            "logical_id": str(r.get("LogicalResourceId", "?")),
            "type": str(r.get("ResourceType", "?")),
            "physical_id": str(r.get("PhysicalResourceId") or ""),
            "status": str(r.get("ResourceStatus", "?")),
        }
        for r in got
    ]


def print_json(out: Console, report: dict[str, Any]) -> None:
    print(json.dumps(report), file=out.file)  # one document, unwrapped, uncoloured


def _line(out: Console, text: str) -> None:
    out.print(Text(inert(text)), highlight=False)  # names from the account: never markup


def show(out: Console, report: dict[str, Any]) -> None:
    """The report for people."""
    stack, why = report["stack"], report["group_missing"]
    sizes = (
        f"desired {report['desired']} (min {report['min']}, max {report['max']})"
        if not why
        else f"not available: {why}"
    )
    group = report["group"] or "(none)"
    _line(out, f"stack {stack} {report['stack_status']}  group {group}  {sizes}")
    if report["missing_outputs"]:
        reason = f" ({report['stack_reason']})" if report.get("stack_reason") else ""
        _line(
            out,
            f"stack {stack} lacks the outputs {', '.join(report['missing_outputs'])}{reason}: "
            f"it was left half-created (by a failed `cmr fleet up`?); `cmr fleet down --stack "
            f"{stack}` removes it, `cmr fleet up --stack {stack}` makes it anew",
        )
        made = report["resources"]
        _line(out, f"the stack holds {len(made)} resources{':' if made else ''}")
        for r in made:
            _line(out, f"  {r['logical_id']} {r['type']} {r['status']} {r['physical_id']}".rstrip())
    if report.get("store"):
        out.print(f"submit with: --store '{report['store']}'", highlight=False, markup=False)
    if report["instances"] or not why:
        t = Table("instance", "type", "market", "state", "lifecycle", "health", "zone")
        for i in report["instances"]:
            t.add_row(
                *(
                    safe_text(i[k])
                    for k in ("id", "type", "market", "state", "lifecycle", "health", "zone")
                )
            )
        keep_whole(t, 0, (safe_text(i["id"]).plain for i in report["instances"]))
        print_table(out, t)
    jobs = report["running_jobs"]
    _line(out, f"running jobs: {', '.join(jobs) if jobs else 'none'}")
    alarm = report["idle_alarm"]
    if "idle_minutes" in alarm:
        out.print(
            f"idle scale-in: alarm {alarm['name']} is {alarm['state']}; the group goes to 0 "
            f"after {alarm['idle_minutes']} min with every instance under "
            f"{alarm['cpu_below_percent']:g}% CPU",
            highlight=False,
        )
    else:
        _line(out, f"idle scale-in: state unknown ({alarm['why']})")
    discount = load_prices(None)["spot_discount_assumption"]
    priced_as = report["prices_region"]
    note = "" if report["region"] == priced_as else f", priced as {priced_as}"
    unknown = report["unpriced_types"]
    missing = f"; no price for {', '.join(unknown)}" if unknown else ""
    out.print(
        f"estimated cost: ${report['hourly_cost_usd']:.4f}/hour (prices of "
        f"{report['prices_as_of']}, spot at {discount:.0%} off{note}{missing}"
        f"{'' if report['prices_verified'] else ', unverified'}; see {PRICES})",
        highlight=False,
    )


def show_logs(out: Console, aws: Aws, stack: str, lines: int) -> None:
    """Recent console output of each instance of the group."""
    from botocore.exceptions import ClientError

    from cmr.backends.aws.errors import error_code

    group, why = find_group(aws.client("autoscaling"), group_name(aws, stack))
    if group is None:
        out.print(Text(inert(f"no instances: {why}")), highlight=False)
        return
    ec2 = aws.client("ec2")
    members = [i["InstanceId"] for i in group.get("Instances", [])]
    if not members:
        out.print("no instances in the group")
    for iid in members:
        try:
            got = ec2.get_console_output(InstanceId=iid, Latest=True)
        except ClientError as exc:
            if error_code(exc) != "UnsupportedOperation":
                raise
            got = ec2.get_console_output(InstanceId=iid)
        text = str(got.get("Output") or "")
        tail = text.splitlines()[-lines:] if text else ["(no console output yet)"]
        out.print(f"==> {iid} <==", highlight=False)
        for line in tail:
            out.print(Text(inert(line)), highlight=False)
