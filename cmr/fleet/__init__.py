"""``cmr fleet``: run identical ``cmr worker`` processes on EC2 from ``deploy/fleet.yaml``.

up      build the project's wheel, upload it to the bucket, create or update the stack
scale   set the Auto Scaling group's desired capacity
status  instances and their states, running jobs, an hourly cost estimate
logs    recent worker output (EC2 console output: the unit writes to journald and console)
down    delete the stack; then, once confirmed (or --yes), the data it made, unless --keep-data

Endpoints and credentials come from the standard AWS settings (AWS_ENDPOINT_URL*,
AWS_PROFILE, AWS_REGION ...), as for the aws backend, so LocalStack and moto need no flags.

commands      the typer app; each command loads boto3 only when it runs
params        the pure resolution of ``up``'s options into the stack's parameters
up            lookups, resolution, wheel upload, stack create or update
stack         the boto3 session and the CloudFormation stack and its group
lookups       network, bucket, table, instances, running jobs, the idle alarm
status        ``status`` and ``logs``
teardown      ``down``: the stack, then the bucket, table and queues it made, once confirmed
cost, wheel   the hourly estimate; the project's wheel and its key
lock          the wheel's dependencies pinned with hashes, which instances install
"""

from __future__ import annotations

from cmr.errors import FleetError
from cmr.fleet.commands import fleet_app
from cmr.fleet.cost import hourly_cost, load_prices
from cmr.fleet.params import DEFAULTS, idle_periods
from cmr.fleet.wheel import build_wheel, project_root, wheel_key

__all__ = [
    "DEFAULTS",
    "FleetError",
    "build_wheel",
    "fleet_app",
    "hourly_cost",
    "idle_periods",
    "load_prices",
    "project_root",
    "wheel_key",
]
