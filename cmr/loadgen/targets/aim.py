"""What a load test will hit, said before it starts: a jam costs money and can throttle a
production table.

``aim`` settles the target without a single request: the endpoint its calls will go to
(and so whether it is local), the region (on Azure, the account), the resource's name (a
new ``cmr-load-<run>``, ``cmrload<run>`` for an Azure table, unless the user named one),
and it refuses cmr's own store (the table, bucket and queue prefix of ``--store``, where
the load's items would mix with job records) unless allowed. ``survey`` then asks: STS for
the account (only where STS answers at the target's own endpoint, or both are AWS's, so
the account shown is the target's; an Azure account is the connection string's), and
whether the resource exists. ``Sighting.statement`` is the text the CLI shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmr.errors import UsageError
from cmr.loadgen.targets.endpoints import Endpoint, azure_endpoint_of, endpoint_of
from cmr.loadgen.targets.resources import (
    AZURE,
    MARKER,
    RESOURCE,
    Found,
    check_name,
    default_name,
    find,
    new_run,
)
from cmr.settings import AwsSettings

SIM = "sim, the simulated store inside each map task (local)"


@dataclass(frozen=True)
class Aim:
    target: str
    resources: dict[str, str]  # for prepare: the name, the run id, the key prefix
    endpoint: Endpoint | None  # None: the simulated store

    @property
    def local(self) -> bool:
        return self.endpoint is None or self.endpoint.local

    @property
    def kind(self) -> str:
        return RESOURCE.get(self.target, "")

    @property
    def name(self) -> str:
        return self.resources.get(self.kind, "")

    @property
    def run(self) -> str:
        return self.resources["run"]

    def where(self) -> str:
        """One line: the target, its endpoint and region, and its resource."""
        if self.endpoint is None:
            return SIM
        e = self.endpoint
        return f"{self.target} at {e}, {e.scope}, {self.kind} {self.name}"


def own_store(target: str, resources: dict[str, str], aws: AwsSettings) -> str | None:
    """What of cmr's own store (``--store``) the named resource is, if it is."""
    if target == "dynamodb" and resources.get("table") == aws.table:
        return f"cmr's own table {aws.table}"
    if target == "s3" and resources.get("bucket") == aws.bucket:
        return f"cmr's own bucket {aws.bucket}"
    # Azure's: the store's table and container by name (its account is the connection
    # string's, which the load uses too)
    if target == "azure-table" and resources.get("table") == aws.table:
        return f"cmr's own table {aws.table}"
    if target == "azure-blob" and resources.get("container") == aws.bucket:
        return f"cmr's own container {aws.bucket}"
    queue = resources.get("queue", "")
    if target == "sqs" and aws.queue_prefix and queue.startswith(aws.queue_prefix):
        return f"under cmr's own queue prefix {aws.queue_prefix!r} (job queues live there)"
    return None


def aim(
    target: str,
    named: dict[str, str],
    aws: AwsSettings,
    *,
    allow_own_store: bool = False,
    run: str | None = None,
) -> Aim:
    """The target of a load test, from the resource names the user gave (``named``)."""
    if target == "sim":
        return Aim(target, {"run": run or new_run()}, None)
    own = own_store(target, named, aws)
    if own is not None and not allow_own_store:
        kind = RESOURCE[target]
        raise UsageError(
            f"{kind} {named[kind]} is {own}: the load's items would mix with job records; "
            f"name another with --target-{kind}, or pass --allow-cmr-store if you mean it"
        )
    resources = {**named, "run": run or new_run()}
    resources.setdefault(RESOURCE[target], default_name(target, resources["run"]))
    check_name(target, resources[RESOURCE[target]])
    resources.setdefault("prefix", f"cmr-load/{resources['run']}/")
    if target in AZURE:
        # an Azure account has no region: its endpoints are all the connection string says
        return Aim(target, resources, azure_endpoint_of(target))
    service = "sdb" if target == "simpledb" else target
    endpoint = endpoint_of(service, aws)
    # the tasks use the region stated, wherever they run
    resources.setdefault("region", endpoint.region)
    return Aim(target, resources, endpoint)


@dataclass(frozen=True)
class Sighting:
    """An aim, with what the services said about it."""

    aim: Aim
    account: str  # the account id, or "unknown (why)"
    found: Found | None  # None: the resource will be created

    def statement(self, keep: bool = False) -> list[str]:
        a = self.aim
        if a.endpoint is None:
            return [f"target: {SIM}"]
        e = a.endpoint
        region = f"region {e.region}, " if e.region else ""
        lines = [f"target: {a.target} at {e}, {region}account {self.account}"]
        what = f"  {a.kind} {a.name}"
        if self.found is None:
            after = "kept afterwards (--keep)" if keep else "deleted afterwards"
            # Azure tables have no tags: the run marks what it makes (azure_resources)
            how = "marked as the run's" if a.target in AZURE else "tagged"
            lines.append(f"{what}: will be created, {how} {MARKER}={a.run}, {after}")
            return lines
        mine = (
            f"messages it sends (attribute {MARKER}={a.run})"
            if a.target == "sqs"
            else f"keys under {a.resources['prefix']}"
        )
        after = "are kept (--keep)" if keep else "are deleted afterwards"
        lines.append(
            f"{what}: exists: used as-is, never emptied or deleted; the run's {mine} {after}"
        )
        lines += [f"  note: {a.kind} {a.name} {note}" for note in self.found.notes]
        return lines


async def account_of(endpoint: Endpoint, aws: AwsSettings) -> str:
    """The account the target belongs to, from STS, or "unknown (why)"."""
    sts = endpoint_of("sts", aws, endpoint.region)
    if not ((sts.aws and endpoint.aws) or sts.netloc == endpoint.netloc):
        return "unknown (STS does not answer at this endpoint)"
    from cmr.backends.aws import sessions

    config = sessions.config(
        retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=3, read_timeout=5
    )
    session = sessions.session(aws.profile, sts.region)
    try:
        async with session.client("sts", config=config, endpoint_url=sts.url) as client:
            return str((await client.get_caller_identity())["Account"])
    except Exception as exc:  # any failure only leaves the account unsaid
        return f"unknown ({type(exc).__name__})"


async def survey(target: Aim, aws: AwsSettings) -> Sighting:
    """Ask the services about an aim: read-only requests (STS, Describe/Head/GetQueueUrl)."""
    if target.endpoint is None:
        return Sighting(target, "", None)
    # Azure's account is named in the connection string; AWS's is asked of STS
    account = target.endpoint.account or await account_of(target.endpoint, aws)
    return Sighting(target, account, await find(target.target, target.name, aws))
