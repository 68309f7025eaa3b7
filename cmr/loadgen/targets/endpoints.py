"""Where a target's calls will go, known before any is made: its endpoint, and whether local.

The endpoint is botocore's own resolution (``AWS_ENDPOINT_URL_<SERVICE>``,
``AWS_ENDPOINT_URL``, a profile's ``endpoint_url``, else the service's AWS endpoint for the
region), read off a client that is built and never called. An Azure target's is the Azure
SDK's reading of ``AZURE_STORAGE_CONNECTION_STRING`` (its ``TableEndpoint`` /
``BlobEndpoint``, else the account's endpoint in Azure), read off a client the same way.
Local means a loopback address or ``localhost``: LocalStack, moto's DynamoDB and Azurite as
``scripts/stack.sh`` runs them. Anything else, AWS or Azure above all, may cost money or be
someone's production store, so the CLI asks first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cmr.errors import UsageError
from cmr.loadgen.targets.aws import _endpoint
from cmr.settings import AwsSettings

AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")
AZURE_HOSTS = (".core.windows.net", ".core.chinacloudapi.cn", ".core.usgovcloudapi.net")


@dataclass(frozen=True)
class Endpoint:
    service: str  # botocore's name (dynamodb, s3, sqs, sdb, sts), or Azure's (table, blob)
    url: str
    region: str  # "" on Azure, where the account, not a region, is named
    account: str = ""  # the Azure storage account; AWS's is asked of STS (aim.account_of)

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
    def azure(self) -> bool:
        return self.host.endswith(AZURE_HOSTS)

    @property
    def scope(self) -> str:
        """Where in the cloud: the region (AWS), or the storage account (Azure)."""
        return f"region {self.region}" if self.region else f"account {self.account}"

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
        if self.azure:
            return f"Azure ({self.url})"
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


def azure_endpoint_of(target: str) -> Endpoint:
    """The endpoint and account an Azure target's client would use: only the connection
    string is read (an unset one is refused), nothing is sent."""
    from cmr.backends.azure.clients import connection_string

    conn = connection_string()
    client: Any
    try:
        if target == "azure-table":
            from azure.data.tables import TableServiceClient

            client, service = TableServiceClient.from_connection_string(conn), "table"
        else:
            from azure.storage.blob import BlobServiceClient

            client, service = BlobServiceClient.from_connection_string(conn), "blob"
    except ValueError as exc:  # the SDK's word for a connection string it cannot read
        raise UsageError(f"cannot tell where {target} calls would go: {exc}") from None
    with client:
        return Endpoint(service, client.url.rstrip("/"), "", str(client.account_name or ""))
