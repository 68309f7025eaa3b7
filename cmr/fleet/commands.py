"""The ``cmr fleet`` commands: options in, one call into the module that does the work.

boto3 and botocore load inside the commands, never at import: ``cmr`` imports
``fleet_app`` to list it, and ``cmr run`` must not pay for boto3.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cmr.cli.options import Profile, Region, fail
from cmr.errors import CmrError, FleetError
from cmr.fleet.params import DEFAULT_STACK, DEFAULTS, UpOptions
from cmr.settings import AwsSettings

fleet_app = typer.Typer(
    no_args_is_help=True,
    help="Run a worker fleet on EC2: up, scale, status, logs, down (deploy/fleet.yaml).",
)
out = Console(soft_wrap=True)

StackName = Annotated[str, typer.Option("--stack", help="CloudFormation stack name")]
Timeout = Annotated[float, typer.Option(help="seconds to wait for the stack")]


def _run(fn: Callable[[], None]) -> None:
    """Run a command body; AWS and fleet failures become one readable line and exit 1."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    try:
        fn()
    except CmrError as exc:
        fail(str(exc))
    except (ClientError, BotoCoreError) as exc:
        from cmr.backends.aws.errors import translated

        fail(str(translated("aws", exc)))
    except ResponseParserError as exc:
        fail(str(exc))


@fleet_app.command()
def up(
    count: Annotated[
        int | None, typer.Option(help="instances (default: 1, or the current)")
    ] = None,
    stack: StackName = DEFAULT_STACK,
    bucket: Annotated[
        str | None,
        typer.Option(
            help="bucket (default: a new cmr-<account>-<region>-<random>); one that exists "
            "must be your account's"
        ),
    ] = None,
    table: Annotated[
        str | None, typer.Option("--table", help=f"DynamoDB table [{AwsSettings.table}]")
    ] = None,
    queue_prefix: Annotated[
        str | None, typer.Option(help=f"prefix of cmr's queues [{AwsSettings.queue_prefix}]")
    ] = None,
    instance_type: Annotated[
        str | None, typer.Option(help=f"EC2 type [{DEFAULTS['InstanceType']}]")
    ] = None,
    spot: Annotated[
        bool | None, typer.Option(help="instances above the on-demand base as spot [no]")
    ] = None,
    on_demand_base: Annotated[int | None, typer.Option(help="always on-demand [0]")] = None,
    max_count: Annotated[
        int | None, typer.Option("--max", help=f"group bound [{DEFAULTS['MaxCount']}]")
    ] = None,
    processes: Annotated[
        int | None, typer.Option(help=f"worker processes per instance [{DEFAULTS['Processes']}]")
    ] = None,
    memory_mb: Annotated[
        str | None,
        typer.Option(
            "--memory-mb",
            metavar="MB",
            help="MB each reducer holds before it spills to disk (cmr worker --memory-mb; map "
            "tasks size their pieces from it), 64 or more; auto: half the instance's memory "
            f"over its processes, worked out on each instance [{DEFAULTS['MemoryMb']}]",
        ),
    ] = None,
    volume_gib: Annotated[
        int | None,
        typer.Option(
            help="each instance's root volume, GiB, where workers spool (a large sort "
            f"needs terabytes) [{DEFAULTS['VolumeGiB']}]"
        ),
    ] = None,
    idle_exit: Annotated[
        int | None,
        typer.Option(
            help="idle seconds before a worker exits; the fleet then scales to 0 "
            f"[{DEFAULTS['IdleExitSeconds']}]"
        ),
    ] = None,
    jobs_from: Annotated[
        list[str] | None,
        typer.Option(
            "--jobs-from",
            metavar="MODULE",
            help="a module (or package) whose jobs the workers serve (repeatable; replaces "
            "the list, '' restores the default): job code on the instances is the wheel's "
            "modules, so submit by module name, never a file path "
            f"[{DEFAULTS['JobsFrom']}: the load generator, the one job the wheel ships]",
        ),
    ] = None,
    outputs_under: Annotated[
        list[str] | None,
        typer.Option(
            "--outputs-under",
            metavar="URL",
            help="an s3://BUCKET/PREFIX/ in the fleet's bucket that job outputs must lie "
            "under for the workers to serve them (repeatable; replaces the list, '' restores "
            "the default) [anywhere in the bucket]",
        ),
    ] = None,
    inputs_under: Annotated[
        list[str] | None,
        typer.Option(
            "--inputs-under",
            metavar="URL",
            help="an s3://BUCKET/PREFIX/ in the fleet's bucket that job inputs must lie "
            "under for the workers to serve them (repeatable; replaces the list, '' restores "
            "the default) [anywhere in the bucket]",
        ),
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
    lock: Annotated[
        Path | None,
        typer.Option(
            help="the wheel's dependencies, pinned with hashes (pip --require-hashes); "
            "default: locked now with uv, at the versions installed here"
        ),
    ] = None,
    timeout: Timeout = 1800,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Build and upload the wheel, then create or update the fleet's stack. On an update,
    every option not given keeps the stack's current value."""
    opts = UpOptions(
        count=count,
        bucket=bucket,
        table=table,
        queue_prefix=queue_prefix,
        instance_type=instance_type,
        spot=spot,
        on_demand_base=on_demand_base,
        max_count=max_count,
        processes=processes,
        memory_mb=memory_mb,
        volume_gib=volume_gib,
        idle_exit=idle_exit,
        jobs_from=tuple(jobs_from) if jobs_from else None,
        outputs_under=tuple(outputs_under) if outputs_under else None,
        inputs_under=tuple(inputs_under) if inputs_under else None,
        subnets=tuple(subnet),
        vpc=vpc,
        create_table=create_table,
        image=image,
    )

    def body() -> None:
        from cmr.fleet.params import store_url
        from cmr.fleet.stack import session
        from cmr.fleet.up import bring_up

        aws = session(region, profile)
        params = bring_up(aws, stack, opts, wheel, timeout, lock)
        spot_note = " (spot)" if params["Spot"] == "true" else ""
        jobs = ", ".join(params["JobsFrom"].split())
        outputs = ", ".join(params["OutputsUnder"].split()) or f"s3://{params['BucketName']}/"
        inputs = ", ".join(params["InputsUnder"].split()) or f"s3://{params['BucketName']}/"
        out.print(
            f"fleet {stack} up: {params['DesiredCount']} x {params['InstanceType']}{spot_note}, "
            f"bucket {params['BucketName']}, table {params['TableName']}, "
            f"queues {params['QueuePrefix']}*\n"
            f"workers serve jobs of {jobs} (--jobs-from) with output under {outputs} and "
            f"input under {inputs}\n"
            f"submit with: cmr run ... --workers 0 --store '{store_url(params, aws.account())}'",
            highlight=False,
        )

    _run(body)


@fleet_app.command()
def scale(
    count: Annotated[int, typer.Argument(help="desired number of instances")],
    stack: StackName = DEFAULT_STACK,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Set the group's desired capacity (the stack's template is not touched)."""

    def body() -> None:
        from cmr.fleet.stack import describe_group, group_name, session

        aws = session(region, profile)
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
    stack: StackName = DEFAULT_STACK,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Instances and their states, jobs being served, and an hourly cost estimate."""

    def body() -> None:
        from cmr.fleet import status
        from cmr.fleet.stack import session

        got = status.report(session(region, profile), stack)
        (status.print_json if as_json else status.show)(out, got)

    _run(body)


@fleet_app.command()
def logs(
    stack: StackName = DEFAULT_STACK,
    lines: Annotated[int, typer.Option("--lines", "-n", help="lines per instance")] = 50,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Recent worker output per instance, from the EC2 console (the unit logs to journald and the
    console, so this needs no agent and no permission on the instance)."""

    def body() -> None:
        from cmr.fleet.stack import session
        from cmr.fleet.status import show_logs

        show_logs(out, session(region, profile), stack, lines)

    _run(body)


@fleet_app.command()
def down(
    stack: StackName = DEFAULT_STACK,
    keep_data: Annotated[
        bool, typer.Option(help="keep the bucket, the table and the queues")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="delete the data without asking")
    ] = False,
    timeout: Timeout = 1800,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Delete the stack (instances, group, role ...); then, once you confirm, the bucket and
    table it made and its jobs' queues (only those: each must carry the stack's tag or belong
    to a job in its table)."""

    def body() -> None:
        from cmr.fleet.stack import session
        from cmr.fleet.teardown import take_down

        confirm: Callable[[str], bool] | None = None
        if yes:
            confirm = lambda _question: True  # noqa: E731 -- the user said yes already
        elif sys.stdin.isatty():
            confirm = lambda question: typer.confirm(question, default=False)  # noqa: E731
        take_down(out, session(region, profile), stack, keep_data, timeout, confirm)

    _run(body)
