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

# First: aiohttp imported without reading the CA bundle twice (lazyca's docstring).
from cmr.backends.aws import lazyca  # noqa: F401

# isort: split
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
    """aiobotocore's HTTP session with the TLS context of :func:`_tls`, through a proxy too.
    A client certificate, a proxy's own CA bundle or client certificate, or
    ``verify=False`` take aiobotocore's own path, unchanged.

    A client of a plain ``http://`` endpoint (the local stack) makes no TLS connection, so
    it reads no CA bundle (~90 ms of CPU, once per process: a tenth of a short ``cmr``
    command on the stack). Its connector is made on its first request, whose URL says which:
    botocore sends every request of a client to its one endpoint. Should an ``https://``
    URL ever come through such a connector, aiohttp still verifies it, with its default
    context (the system's CAs)."""

    _plain = False  # the URL of the request about to make the connector is http://

    async def send(self, request: Any) -> Any:
        # Read by _create_connector before send's first await (aiobotocore makes the
        # connector synchronously in _get_session), so no other request runs in between.
        self._plain = request.url.startswith("http://")
        return await super().send(request)

    def _create_connector(self, proxy_url: str | None) -> aiohttp.TCPConnector:
        proxy = self._proxy_config.settings if proxy_url else {}
        if (
            not self._verify
            or self._cert_file
            or proxy.get("proxy_ca_bundle") is not None
            or proxy.get("proxy_client_cert") is not None
        ):
            connector: aiohttp.TCPConnector = super()._create_connector(proxy_url)
            return connector
        # Through a proxy with no TLS settings of its own, aiobotocore 2.25 gives the
        # connector ssl=False: the server's certificate behind the proxy went unverified.
        # It is verified as a direct connection's is.
        plain = self._plain and not proxy_url
        context: ssl.SSLContext | bool = True if plain else _tls(self._verify)
        return aiohttp.TCPConnector(
            limit=self._max_pool_connections, ssl=context, **self._connector_args
        )
