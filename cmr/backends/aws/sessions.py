"""aioboto3 sessions and client configs that share, per process, what is costly to build.

An aioboto3 ``Session`` reads botocore's service models (gzipped JSON) into a loader of its
own, and every client builds a TLS context of its own from the CA bundle (~45 ms of CPU
here), even for an ``http://`` endpoint. ``open_aws`` makes six clients (three for the
job, three for its reachability probe), the load generator one per target, and a process
may open the backend many times (``cmr status`` over several stores, a test session):
measured here, a second ``open_aws`` in one process took ~420 ms of CPU, ~80 ms sharing
both. What is shared is read-only: the models (the same files for every session) and one
verifying TLS context per CA bundle. Credentials, regions and profiles stay per session.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from botocore.httpsession import create_urllib3_context, get_cert_path
from botocore.loaders import Loader


class _Shared:
    loader: Loader | None = None


def session(profile: str | None = None, region: str | None = None) -> aioboto3.Session:
    """An aioboto3 session whose botocore data loader is this process's one."""
    made = aioboto3.Session(profile_name=profile, region_name=region)
    inner = made._session  # the AioSession underneath: the component registry lives there
    if _Shared.loader is None:
        _Shared.loader = inner.get_component("data_loader")
    else:
        inner.register_component("data_loader", _Shared.loader)
    return made


def config(**options: Any) -> AioConfig:
    """An ``AioConfig`` whose clients share one TLS context per CA bundle."""
    options.setdefault("http_session_cls", SharedTLS)
    return AioConfig(**options)


@functools.cache
def _tls(verify: bool | str) -> ssl.SSLContext:
    """What aiobotocore builds for each client, built once (an SSLContext may be shared by
    connections in any number of connectors)."""
    context: ssl.SSLContext = create_urllib3_context()
    ca_certs = get_cert_path(verify)
    if ca_certs:
        context.load_verify_locations(ca_certs, None, None)
    return context


class SharedTLS(AIOHTTPSession):  # type: ignore[misc]  # aiobotocore ships no types
    """aiobotocore's HTTP session with the TLS context of :func:`_tls`. A proxy, a client
    certificate or ``verify=False`` take aiobotocore's own path, unchanged."""

    def _create_connector(self, proxy_url: str | None) -> aiohttp.TCPConnector:
        if proxy_url or not self._verify or self._cert_file:
            connector: aiohttp.TCPConnector = super()._create_connector(proxy_url)
            return connector
        return aiohttp.TCPConnector(
            limit=self._max_pool_connections, ssl=_tls(self._verify), **self._connector_args
        )
