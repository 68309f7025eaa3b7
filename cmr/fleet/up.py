"""``cmr fleet up``: look up what the parameters need, resolve them (:mod:`cmr.fleet.params`),
upload the wheel and create or update the stack."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cmr.cli.options import err
from cmr.errors import FleetError
from cmr.fleet.lookups import bucket_exists, default_network, table_exists
from cmr.fleet.params import DEFAULTS, Found, UpOptions, needs_account, needs_network, resolve
from cmr.fleet.stack import (
    Aws,
    account,
    apply,
    describe_stack,
    find_group,
    group_name,
    stack_params,
)
from cmr.fleet.wheel import TEMPLATE, build_wheel, project_root, wheel_key


def bring_up(
    aws: Aws, stack: str, opts: UpOptions, wheel: Path | None, timeout: float
) -> dict[str, str]:
    """Create or update the stack; returns the parameters it was given."""
    root = project_root()
    cfn, s3 = aws.client("cloudformation"), aws.client("s3")
    current = describe_stack(cfn, stack)
    if current is not None and str(current["StackStatus"]).endswith("_IN_PROGRESS"):
        raise FleetError(f"stack {stack} is {current['StackStatus']}: wait and retry")
    prev = stack_params(current) if current else {}
    network = None
    if needs_network(opts, prev):
        network = default_network(aws.client("ec2"), list(opts.subnets), opts.vpc)
    acct = account(aws) if needs_account(opts, prev) else ""
    with tempfile.TemporaryDirectory() as tmp:
        whl = wheel or build_wheel(root, Path(tmp))
        name = opts.bucket or prev.get("BucketName") or f"cmr-{acct}-{aws.region}"
        table = opts.table or prev.get("TableName") or DEFAULTS["TableName"]
        desired = None
        if current is not None and opts.count is None:
            group, _ = find_group(aws.client("autoscaling"), group_name(aws, stack))
            desired = int(group["DesiredCapacity"]) if group else None
        found = Found(
            region=aws.region,
            wheel_key=wheel_key(whl),
            previous=prev,
            account=acct,
            network=network,
            bucket_exists=current is None and bucket_exists(s3, name),
            table_exists=(
                current is None
                and opts.create_table is None
                and table_exists(aws.client("dynamodb"), table)
            ),
            group_desired=desired,
        )
        params = resolve(opts, found)
        template = (root / TEMPLATE).read_text()
        if current is None and params["CreateBucket"] == "true":
            # The stack makes the bucket, so it starts with no instances until the wheel is in.
            err.print(f"creating stack {stack} (bucket {name}), then uploading the wheel")
            apply(cfn, stack, template, {**params, "DesiredCount": "0"}, False, timeout)
            current = describe_stack(cfn, stack)
        s3.upload_file(str(whl), name, params["WheelKey"])
        err.print(f"uploaded {whl.name} to s3://{name}/{params['WheelKey']}")
        err.print(
            f"{'updating' if current else 'creating'} stack {stack}: "
            f"{params['DesiredCount']} x {params['InstanceType']}"
        )
        apply(cfn, stack, template, params, current is not None, timeout)
    return params
