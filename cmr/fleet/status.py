"""``cmr fleet status`` and ``logs``: what the fleet is doing and what it costs."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cmr.errors import FleetError
from cmr.fleet.cost import PRICES, hourly_cost, load_prices
from cmr.fleet.lookups import fleet_instances, idle_alarm, running_jobs
from cmr.fleet.params import DEFAULTS, store_url
from cmr.fleet.stack import Aws, describe_stack, find_group, group_name, stack_outputs, stack_params
from cmr.text import inert


def report(aws: Aws, stack: str) -> dict[str, Any]:
    """The status report, as ``cmr fleet status --json`` prints it."""
    got = describe_stack(aws.client("cloudformation"), stack)
    if got is None:
        raise FleetError(f"no fleet stack {stack}")
    outputs, params = stack_outputs(got), stack_params(got)
    group, why = find_group(aws.client("autoscaling"), outputs["GroupName"])
    instances = fleet_instances(aws, group) if group else []
    table = outputs.get("TableName", params.get("TableName", DEFAULTS["TableName"]))
    jobs = running_jobs(aws, table)
    prices = load_prices(None)
    cost, unknown = hourly_cost(instances, prices)
    return {
        "stack": stack,
        "stack_status": got["StackStatus"],
        "store": store_url(params, aws.account()) if "BucketName" in params else None,
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


def print_json(out: Console, report: dict[str, Any]) -> None:
    out.print_json(json.dumps(report))


def show(out: Console, report: dict[str, Any]) -> None:
    """The report for people."""
    stack, why = report["stack"], report["group_missing"]
    sizes = (
        f"desired {report['desired']} (min {report['min']}, max {report['max']})"
        if not why
        else f"not available: {why}"
    )
    out.print(
        f"stack {stack} {report['stack_status']}  group {report['group']}  {sizes}",
        highlight=False,
    )
    if report.get("store"):
        out.print(f"submit with: --store '{report['store']}'", highlight=False, markup=False)
    t = Table("instance", "type", "market", "state", "lifecycle", "health", "zone")
    t.columns[0].no_wrap = True
    for i in report["instances"]:
        t.add_row(
            i["id"], i["type"], i["market"], i["state"], i["lifecycle"], i["health"], i["zone"]
        )
    out.print(t)
    jobs = report["running_jobs"]
    out.print(Text(inert(f"running jobs: {', '.join(jobs) if jobs else 'none'}")), highlight=False)
    alarm = report["idle_alarm"]
    if "idle_minutes" in alarm:
        out.print(
            f"idle scale-in: alarm {alarm['name']} is {alarm['state']}; the group goes to 0 "
            f"after {alarm['idle_minutes']} min with every instance under "
            f"{alarm['cpu_below_percent']:g}% CPU",
            highlight=False,
        )
    else:
        out.print(Text(inert(f"idle scale-in: state unknown ({alarm['why']})")), highlight=False)
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
