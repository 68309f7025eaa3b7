"""``cmr fleet up``: look up what the parameters need, resolve them (:mod:`cmr.fleet.params`),
upload the lock and the wheel and create or update the stack."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from cmr.cli.options import err
from cmr.errors import FleetError
from cmr.fleet.lock import check_lock, compile_lock, lock_key
from cmr.fleet.lookups import bucket_exists, default_network, table_exists
from cmr.fleet.params import Found, UpOptions, needs_network, resolve
from cmr.fleet.stack import (
    Aws,
    apply,
    describe_stack,
    find_group,
    group_name,
    stack_params,
)
from cmr.fleet.wheel import TEMPLATE, build_wheel, not_in_wheel, project_root, wheel_key

SUFFIX_BYTES = 4  # 8 hex digits in a new default bucket name
# Stand-ins of the right form until the wheel and its lock are built.
_PENDING_WHEEL = f"fleet/wheels/{'0' * 64}/pending.whl"
_PENDING_LOCK = f"fleet/locks/{'0' * 64}/requirements.txt"


def bring_up(
    aws: Aws,
    stack: str,
    opts: UpOptions,
    wheel: Path | None,
    timeout: float,
    lock: Path | None = None,
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
    acct = aws.account()
    desired = None
    if current is not None and opts.count is None:
        group, _ = find_group(aws.client("autoscaling"), group_name(aws, stack))
        desired = int(group["DesiredCapacity"]) if group else None
    found = Found(
        region=aws.region,
        wheel_key=_PENDING_WHEEL,
        lock_key=_PENDING_LOCK,
        previous=prev,
        account=acct,
        suffix=secrets.token_hex(SUFFIX_BYTES),
        network=network,
        group_desired=desired,
    )
    # Resolved once before anything is built, so that a refused option fails at once.
    params = resolve(opts, found)
    name, table = params["BucketName"], params["TableName"]
    if current is None:
        found = replace(
            found,
            # A bucket that exists must be the caller's account's (else this refuses it).
            bucket_exists=bucket_exists(s3, name, acct),
            table_exists=opts.create_table is None and table_exists(aws.client("dynamodb"), table),
        )
    with tempfile.TemporaryDirectory() as tmp:
        whl = wheel or build_wheel(root, Path(tmp))
        if lock is not None:
            check_lock(lock)
            locked = Path(tmp) / "requirements.txt"
            shutil.copyfile(lock, locked)
        else:
            locked = compile_lock(whl, Path(tmp))
        params = resolve(opts, replace(found, wheel_key=wheel_key(whl), lock_key=lock_key(locked)))
        for module in not_in_wheel(whl, params["JobsFrom"].split()):
            # A warning, not a refusal: a locked dependency may provide it.
            err.print(
                f"warning: --jobs-from {module}: {whl.name} has no such module; the workers "
                "serve its jobs only if one of the locked dependencies installs it",
                highlight=False,
            )
        template = (root / TEMPLATE).read_text()
        if current is None and params["CreateBucket"] == "true":
            # The stack makes the bucket, so it starts with no instances until the wheel is in.
            err.print(f"creating stack {stack} (bucket {name}), then uploading the wheel")
            apply(cfn, stack, template, {**params, "DesiredCount": "0"}, False, timeout)
            current = describe_stack(cfn, stack)
        # The lock first: an instance that finds the wheel finds its lock too.
        s3.upload_file(str(locked), name, params["LockKey"])
        s3.upload_file(str(whl), name, params["WheelKey"])
        err.print(f"uploaded {whl.name} and its lock to s3://{name}/fleet/")
        err.print(
            f"{'updating' if current else 'creating'} stack {stack}: "
            f"{params['DesiredCount']} x {params['InstanceType']}"
        )
        apply(cfn, stack, template, params, current is not None, timeout)
    return params
