"""Where a target's calls will go, known before any is made: its endpoint, and whether local.

The endpoint is botocore's own resolution (``AWS_ENDPOINT_URL_<SERVICE>``,
``AWS_ENDPOINT_URL``, a profile's ``endpoint_url``, else the service's AWS endpoint for the
region), read off a client that is built and never called. Local means a loopback address or
``localhost``: LocalStack and moto's DynamoDB as ``scripts/stack.sh`` runs them. Anything else,
AWS above all, may cost money or be someone's production store, so the CLI asks first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from cmr.errors import UsageError
from cmr.loadgen.targets.aws import _endpoint
from cmr.settings import AwsSettings

AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")


@dataclass(frozen=True)
class Endpoint:
    service: str  # botocore's name: dynamodb, s3, sqs, sdb, sts
    url: str
    region: str

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def netloc(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def aws(self) -> bool:
        return self.host.endswith(AWS_HOSTS)

    @property
    def local(self) -> bool:
        host = self.host
        if host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:  # a name: only localhost is taken on trust, nothing is resolved
            return False

    def __str__(self) -> str:
        if self.aws:
            return f"AWS ({self.url})"
        return f"{self.url} (local)" if self.local else self.url


def endpoint_of(service: str, aws: AwsSettings, region: str | None = None) -> Endpoint:
    """The endpoint and region a client of ``service`` would use with these settings."""
    import botocore.session
    from botocore.exceptions import BotoCoreError

    try:
        session = botocore.session.Session(profile=aws.profile)
        region = region or aws.region or session.get_config_variable("region") or "us-east-1"
        # Dummy keys: resolving real credentials could stall on EC2's metadata service, and
        # this client only reports where it would connect; it never sends a request.
        client = session.create_client(
            service,
            region_name=region,
            endpoint_url=_endpoint(service),
            aws_access_key_id="unused",
            aws_secret_access_key="unused",
        )
    except BotoCoreError as exc:
        raise UsageError(f"cannot tell where {service} calls would go: {exc}") from None
    return Endpoint(service, str(client.meta.endpoint_url), str(client.meta.region_name))
