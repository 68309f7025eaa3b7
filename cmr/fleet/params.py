"""What ``cmr fleet up`` asks CloudFormation for, from what the user said and what was
looked up: a pure function, so every rule here is testable without a server.

The order of precedence for each setting: the command line, then the existing stack's value
(an update keeps what the user does not restate), then :data:`DEFAULTS`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cmr.errors import FleetError
from cmr.settings import AwsSettings

DEFAULT_STACK = "cmr-fleet"  # the CloudFormation stack every fleet command works on

# What `up` uses when neither the command line nor the existing stack says otherwise.
DEFAULTS = {
    "TableName": AwsSettings.table,  # the same table and queue names as a plain `cmr run`
    "QueuePrefix": AwsSettings.queue_prefix,
    "InstanceType": "c7i.large",
    "Spot": "false",
    "OnDemandBase": "0",
    "MaxCount": "20",
    "Processes": "2",
    # Each worker's reducer budget (cmr worker --memory-mb, per reduce task; map tasks size
    # their pieces from it too). "auto": the bootstrap takes half the instance's memory over
    # its processes, so a big instance spills less (docs/fleet.md, "A sort of 100 TB").
    "MemoryMb": "auto",
    # Each instance's root volume, where its workers spool: map tasks' shuffle spools, a
    # reducer's fetched parts and sorted runs (a 100 TB sort wants terabytes: docs/fleet.md).
    "VolumeGiB": "20",
    "IdleExitSeconds": "300",
    # The one job module this project's wheel ships (the load generator's): a fleet serves
    # load tests at once, and the user's own job modules once named with --jobs-from.
    "JobsFrom": "cmr.loadgen.job",
    "OutputsUnder": "",  # empty: anywhere in the fleet's bucket (the worker's default)
    "InputsUnder": "",  # empty: anywhere in the fleet's bucket (the worker's default)
}

# One entry of each list parameter (the lists are entries separated by single spaces, which
# the bootstrap splits into one worker flag each). A module name only, never a directory: on
# an instance job code is what the wheel installs, and the one directory a worker could be
# pointed at that is not the wheel's is its spool, which the worker itself writes.
JOB_MODULE = r"[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*"
OUTPUT_PREFIX = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9_.-]+)*/?"
_LISTS = {"JobsFrom": JOB_MODULE, "OutputsUnder": OUTPUT_PREFIX, "InputsUnder": OUTPUT_PREFIX}

# --memory-mb's range, MB per reducer: below 64 a reducer spills almost every batch; 1 TiB
# is more than any reducer needs (and the bootstrap refuses more than the instance has).
MEMORY_MB_MIN = 64
MEMORY_MB_MAX = 1024 * 1024
AUTO_MEMORY = "auto"  # --memory-mb's default: sized on each instance from its memory

ALARM_PERIOD_S = 300  # EC2's basic monitoring: one CPU figure per instance every 5 minutes

# The template's AllowedPattern of each parameter its user data puts into a shell script
# (tests/deploy/test_template.py holds the two equal): checked here first, so that a value
# that could end a quote, start a command or expand to file names is one clear error before
# anything is made. Letters, digits and ._/- only; the two lists add single spaces between
# their entries, and s3:// before each output prefix.
PATTERNS = {
    "BucketName": r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]",
    "TableName": r"[A-Za-z0-9_.-]{3,255}",
    "QueuePrefix": r"[A-Za-z0-9_-]{1,40}",
    "WheelKey": r"fleet/wheels/[0-9a-f]{64}/[A-Za-z0-9_.+-]{1,200}[.]whl",
    "LockKey": r"fleet/locks/[0-9a-f]{64}/requirements[.]txt",
    "InstanceType": r"[a-z0-9-]{1,20}[.][a-z0-9-]{1,20}",
    "Processes": r"[1-9][0-9]{0,3}",
    "MemoryMb": r"(auto|6[4-9]|[7-9][0-9]|[1-9][0-9]{2,6})",  # from MEMORY_MB_MIN (64)
    "IdleExitSeconds": r"[1-9][0-9]{0,6}",
    # At least one module: an empty list would leave the worker its default, its own spool.
    "JobsFrom": rf"{JOB_MODULE}( {JOB_MODULE})*",
    "OutputsUnder": rf"({OUTPUT_PREFIX}( {OUTPUT_PREFIX})*)?",
    "InputsUnder": rf"({OUTPUT_PREFIX}( {OUTPUT_PREFIX})*)?",
}
_FLAGS = {
    "BucketName": "--bucket",
    "TableName": "--table",
    "QueuePrefix": "--queue-prefix",
    "WheelKey": "the wheel's key",
    "LockKey": "the lock's key",
    "InstanceType": "--instance-type",
    "Processes": "--processes",
    "MemoryMb": "--memory-mb",
    "IdleExitSeconds": "--idle-exit",
    "JobsFrom": "--jobs-from",
    "OutputsUnder": "--outputs-under",
    "InputsUnder": "--inputs-under",
}
_WHAT = {
    "JobsFrom": "a module name, e.g. cmr.loadgen.job: on the instances job code is the "
    "wheel's modules, never a file path",
    "OutputsUnder": "an s3://BUCKET/PREFIX/ URL of letters, digits and ._/-",
    "InputsUnder": "an s3://BUCKET/PREFIX/ URL of letters, digits and ._/-",
}
_SHOWN = 80  # characters of a refused value the error repeats


def idle_periods(idle_exit_s: int) -> int:
    """5-minute periods of an all-idle fleet before its alarm scales it to zero: the workers'
    idle time, rounded up, so the fleet outlives no worker by more than one period."""
    return max(1, math.ceil(idle_exit_s / ALARM_PERIOD_S))


@dataclass(frozen=True)
class UpOptions:
    """``cmr fleet up``'s options; None: not given on the command line."""

    count: int | None = None
    bucket: str | None = None
    table: str | None = None
    queue_prefix: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    on_demand_base: int | None = None
    max_count: int | None = None
    processes: int | None = None
    memory_mb: int | str | None = None  # MB per reducer, or "auto"
    volume_gib: int | None = None
    idle_exit: int | None = None
    jobs_from: Sequence[str] | None = None  # each a module name; ("",): back to the default
    outputs_under: Sequence[str] | None = None  # each an s3:// prefix; ("",): the whole bucket
    inputs_under: Sequence[str] | None = None  # each an s3:// prefix; ("",): the whole bucket
    subnets: Sequence[str] = ()
    vpc: str | None = None
    create_table: bool | None = None
    image: str | None = None


@dataclass(frozen=True)
class Found:
    """What ``up`` looked up before resolving, as plain values. Each lookup is made only when
    the resolution needs it (see :func:`needs_account`, :func:`needs_network`)."""

    region: str
    wheel_key: str
    lock_key: str = ""
    previous: Mapping[str, str] = field(default_factory=dict)  # the stack's; {}: no stack
    account: str = ""  # needed only when no bucket is named anywhere
    suffix: str = ""  # random: a new default bucket name cannot be guessed and taken first
    network: tuple[str, Sequence[str]] | None = None  # the VPC and subnets looked up
    bucket_exists: bool = False  # a new stack's bucket is there already
    table_exists: bool = False  # a new stack's table is there already
    group_desired: int | None = None  # the running group's capacity (None: no group)


def _opt(value: object) -> str | None:
    if value is None:
        return None
    return str(value).lower() if isinstance(value, bool) else str(value)


def _listed(values: Sequence[str] | None, key: str) -> str | None:
    """A repeatable option as its stack parameter: entries joined by single spaces; empty
    entries dropped, so that ``--outputs-under ''`` restores the default on an update."""
    if values is None:
        return None
    return " ".join(v for v in values if v) or DEFAULTS[key]


def _memory_mb(value: int | str | None) -> str | None:
    """--memory-mb as its stack parameter: "auto", or whole MB in range."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text == AUTO_MEMORY:
        return text
    if not re.fullmatch(r"[0-9]{1,9}", text) or not (MEMORY_MB_MIN <= int(text) <= MEMORY_MB_MAX):
        raise FleetError(
            f"--memory-mb {_shown(str(value))}: give each reducer's memory in MB, "
            f"{MEMORY_MB_MIN} to {MEMORY_MB_MAX:,} (each of an instance's --processes reducers "
            f"may hold this much), or {AUTO_MEMORY} (half the instance's memory over its "
            "processes)"
        )
    return str(int(text))


def needs_account(opts: UpOptions, previous: Mapping[str, str]) -> bool:
    """The default bucket name has the account id in it."""
    return not opts.bucket and not previous.get("BucketName")


def needs_network(opts: UpOptions, previous: Mapping[str, str]) -> bool:
    """A new stack, or new network options: the VPC and subnets must be looked up."""
    return bool(opts.subnets or opts.vpc or not previous)


def bucket_name(
    opts: UpOptions, previous: Mapping[str, str], account: str, region: str, suffix: str
) -> str:
    """The named bucket, the stack's, or a new ``cmr-<account>-<region>-<random>``: bucket
    names are global, and a predictable one can be created by a stranger before us."""
    name = opts.bucket or previous.get("BucketName")
    if name:
        return name
    if not account:
        raise FleetError("no bucket given and no account id to name one: pass --bucket")
    if not re.fullmatch(r"[0-9a-f]{8,}", suffix):
        raise FleetError("no random suffix for a new bucket name: pass --bucket")
    return f"cmr-{account}-{region}-{suffix}"


def store_url(params: Mapping[str, str], account: str) -> str:
    """The ``--store`` that submits to the fleet: its bucket (which must be ``account``'s),
    table and queue prefix."""
    return (
        f"aws://{params['BucketName']}/{params['TableName']}"
        f"?prefix={params['QueuePrefix']}&owner={account}"
    )


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def validate(params: Mapping[str, str]) -> None:
    """Refuse any parameter the template's user data would put in its shell unless it is of
    the template's own pattern."""
    for key, pattern in PATTERNS.items():
        value = params.get(key)
        if value is None or re.fullmatch(pattern, value):
            continue
        if key in _LISTS:
            # Name the entry at fault (or the spacing, when every entry is well formed).
            bad = next((e for e in value.split(" ") if not re.fullmatch(_LISTS[key], e)), value)
            raise FleetError(
                f"{_FLAGS[key]} {_shown(bad)} is not allowed: each of the fleet's {key} must "
                f"match {_LISTS[key]} ({_WHAT[key]}); the list must match {pattern}"
            )
        raise FleetError(
            f"{_FLAGS[key]} {_shown(value)} is not allowed: the fleet's {key} must match "
            f"{pattern} (letters, digits and ._- only reach the instances' shell)"
        )


def check_outputs(outputs_under: str, bucket: str, flag: str = "--outputs-under") -> None:
    """Every output (or input) prefix lies in the fleet's bucket: the only one its role may
    write (or read)."""
    verb = "read" if flag == "--inputs-under" else "write"
    for url in outputs_under.split():
        if url.removeprefix("s3://").split("/", 1)[0] != bucket:
            raise FleetError(
                f"{flag} {_shown(url)} is outside the fleet's bucket: its workers' "
                f"role may {verb} s3://{bucket}/ only; give a prefix in it"
            )


def resolve(opts: UpOptions, found: Found) -> dict[str, str]:
    """The stack's parameters for ``up``: every template parameter the command sets."""
    prev = found.previous
    if opts.count is not None and opts.count < 0:
        raise FleetError(f"--count {opts.count}: give 0 or more instances")
    if opts.volume_gib is not None and not 8 <= opts.volume_gib <= 16384:
        raise FleetError(
            f"--volume-gib {opts.volume_gib}: give 8 (the image's own size) to 16384 "
            "(a gp3 volume's largest)"
        )
    given = {
        "TableName": _opt(opts.table),
        "QueuePrefix": _opt(opts.queue_prefix),
        "InstanceType": _opt(opts.instance_type),
        "Spot": _opt(opts.spot),
        "OnDemandBase": _opt(opts.on_demand_base),
        "MaxCount": _opt(opts.max_count),
        "Processes": _opt(opts.processes),
        "MemoryMb": _memory_mb(opts.memory_mb),
        "VolumeGiB": _opt(opts.volume_gib),
        "IdleExitSeconds": _opt(opts.idle_exit),
        "JobsFrom": _listed(opts.jobs_from, "JobsFrom"),
        "OutputsUnder": _listed(opts.outputs_under, "OutputsUnder"),
        "InputsUnder": _listed(opts.inputs_under, "InputsUnder"),
    }
    params: dict[str, str] = {}
    for k, default in DEFAULTS.items():
        value = given[k]
        params[k] = value if value is not None else prev.get(k, default)
    if needs_network(opts, prev):
        if found.network is None:
            raise FleetError("the VPC and subnets were not looked up: pass --subnet and --vpc")
        vpc_id, subnets = found.network[0], list(found.network[1])
    else:
        # moto reports a list parameter as a Python list's repr: take the ids in any form.
        vpc_id, subnets = prev["VpcId"], re.findall(r"subnet-[0-9A-Za-z]+", prev["SubnetIds"])
    if not prev:
        make_bucket = not found.bucket_exists
        make_table = opts.create_table if opts.create_table is not None else not found.table_exists
    else:
        # Keep what the stack owns: flipping these would orphan or clash with a resource.
        make_bucket = prev.get("CreateBucket") == "true"
        make_table = prev.get("CreateTable") == "true"
    if opts.count is not None:
        desired = opts.count
    elif prev:
        desired = (
            found.group_desired if found.group_desired is not None else int(prev["DesiredCount"])
        )
    else:
        desired = 1
    params.update(
        {
            "BucketName": bucket_name(opts, prev, found.account, found.region, found.suffix),
            "CreateBucket": str(make_bucket).lower(),
            "CreateTable": str(make_table).lower(),
            "WheelKey": found.wheel_key,
            "LockKey": found.lock_key,
            "DesiredCount": str(desired),
            "MaxCount": str(max(int(params["MaxCount"]), desired)),
            "VpcId": vpc_id,
            "SubnetIds": ",".join(subnets),
        }
    )
    validate(params)
    check_outputs(params["OutputsUnder"], params["BucketName"])
    check_outputs(params["InputsUnder"], params["BucketName"], "--inputs-under")
    params["IdlePeriods"] = str(idle_periods(int(params["IdleExitSeconds"])))
    if opts.image:
        params["ImageId"] = opts.image
    elif prev.get("ImageId", "").startswith("/"):
        # An SSM parameter name; moto reports the resolved AMI id here, which must not be
        # passed back as a parameter name.
        params["ImageId"] = prev["ImageId"]
    return params
