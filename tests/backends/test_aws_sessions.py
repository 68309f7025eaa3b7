"""Clients that share one TLS context and one model loader per process still verify what
they must: a server whose certificate the CA bundle does not vouch for is refused, one the
configured bundle (``AWS_CA_BUNDLE``, ``verify=``) vouches for is reached, and ``verify=False``
does not verify. Real TLS handshakes with a loopback HTTPS server."""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, SSLError

from cmr.backends.aws import sessions
from tests.tls import loopback_certificate

_BODY = b'{"__type": "com.amazonaws.sqs#Teapot", "message": "a loopback server"}'
ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n"
    + f"Content-Length: {len(_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _BODY
)


@pytest.fixture
async def https(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[int]]]:
    """A loopback HTTPS server answering every request with an SQS-style error: (its URL,
    the CA bundle that vouches for it, how many requests got through the handshake)."""
    cert, key = loopback_certificate(tmp_path, "cmr loopback test")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    served: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            served.append(1)
            writer.write(ANSWER)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # a client that refused our certificate hangs up mid-handshake
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"https://127.0.0.1:{port}", cert, served


async def _call(endpoint: str, monkeypatch: pytest.MonkeyPatch, **client: Any) -> str:
    """One GetQueueUrl through a shared-TLS client: the error code the server's answer
    carried, or the exception's class name when the handshake failed."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    config = sessions.config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=5)
    async with sessions.session(region="us-east-1").client(
        "sqs", endpoint_url=endpoint, config=config, **client
    ) as sqs:
        try:
            await sqs.get_queue_url(QueueName="q")
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        except SSLError as exc:
            return type(exc).__name__
    return "answered"


async def test_an_unknown_certificate_is_refused_with_the_default_bundle(
    https: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, served = https
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    assert await _call(url, monkeypatch) == "SSLError"
    assert await _call(url, monkeypatch) == "SSLError"  # the shared context, a second time
    assert served == []


async def test_the_configured_bundle_is_used_and_shared_per_bundle(
    https: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert, served = https
    # AWS_CA_BUNDLE, botocore's standard setting, and verify= on the client.
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    assert await _call(url, monkeypatch) == "Teapot"
    monkeypatch.delenv("AWS_CA_BUNDLE")
    assert await _call(url, monkeypatch, verify=str(cert)) == "Teapot"
    assert len(served) == 2
    # Yet the default bundle, asked for after, still refuses it: one context per bundle.
    assert await _call(url, monkeypatch) == "SSLError"
    assert len(served) == 2


async def test_verify_false_does_not_verify(
    https: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, served = https
    assert await _call(url, monkeypatch, verify=False) == "Teapot"
    assert served == [1]


def test_sessions_share_the_model_loader_but_not_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s1")
    one = sessions.session(region="us-east-1")
    assert asyncio.run(one._session.get_credentials()).access_key == "first"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    two = sessions.session(region="eu-west-1")
    assert asyncio.run(two._session.get_credentials()).access_key == "second"
    assert asyncio.run(one._session.get_credentials()).access_key == "first"
    loader = one._session.get_component("data_loader")
    assert two._session.get_component("data_loader") is loader
    assert loader.load_service_model("sqs", "service-2")["metadata"]["protocol"]
    assert (one.region_name, two.region_name) == ("us-east-1", "eu-west-1")


async def test_a_plain_http_endpoint_reads_no_ca_bundle(
    https: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local stack's clients make no TLS connection: building a verifying context for
    them cost ~90 ms of CPU per process. An https endpoint after it still gets one, and
    still refuses a certificate the bundle does not vouch for."""
    served: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    sessions._tls.cache_clear()
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        assert await _call(f"http://127.0.0.1:{port}", monkeypatch) == "Teapot"
    assert served == [1]
    assert sessions._tls.cache_info().currsize == 0
    url, _, through = https
    assert await _call(url, monkeypatch) == "SSLError"
    assert sessions._tls.cache_info().currsize == 1
    assert through == []


_DEFAULTS_PROBE = """
import asyncio, ssl, sys
import cmr.backends.aws.sessions  # imports aioboto3, and aiohttp through lazyca
import aiohttp
from aiohttp import connector

verified, unverified = connector._SSL_CONTEXT_VERIFIED, connector._SSL_CONTEXT_UNVERIFIED
print(type(verified).__name__, verified.cert_store_stats()["x509_ca"])
print("patched" if "set_default_verify_paths" in vars(ssl.SSLContext) else "restored")
print(ssl.create_default_context().cert_store_stats()["x509_ca"] > 0)

async def get(**kw):
    async with aiohttp.ClientSession() as s:
        try:
            async with s.get(sys.argv[1], **kw) as r:
                return r.status
        except aiohttp.ClientConnectorCertificateError:
            return "refused"

print(asyncio.run(get()), verified.cert_store_stats()["x509_ca"] > 0)
print(asyncio.run(get(ssl=False)))
"""


async def test_aiohttps_default_contexts_read_the_ca_bundle_at_first_use_and_still_verify(
    https: tuple[str, Path, list[int]],
) -> None:
    """lazyca: importing aioboto3 no longer reads the CA bundle for aiohttp's two default
    contexts (~180 ms of CPU per process); the verifying one reads it before its first
    connection and refuses a certificate the bundle does not vouch for; the patch is gone
    after the import. In a fresh process: this one has imported aiohttp already."""
    url, _, served = https
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DEFAULTS_PROBE, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "_CAsOnFirstUse 0",  # not read at import
        "restored",
        "True",  # contexts made after the import read it as ever
        "refused True",  # verified, with the bundle read at first use
        "400",  # ssl=False: the unverified default connects
    ]
    assert served == [1]


async def test_a_server_behind_a_proxy_is_verified_too(
    https: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through an HTTPS_PROXY with no TLS settings of its own, aiobotocore 2.25 built its
    connector with ssl=False: a certificate no bundle vouches for was accepted."""
    url, cert, served = https
    tunnels: list[str] = []

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    async def connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        host, port = (await r.readuntil(b"\r\n\r\n")).split()[1].decode().rsplit(":", 1)
        tunnels.append(f"{host}:{port}")
        far_r, far_w = await asyncio.open_connection(host, int(port))
        w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await w.drain()
        await asyncio.gather(pipe(r, far_w), pipe(far_r, w))

    proxy = await asyncio.start_server(connect, "127.0.0.1", 0)
    async with proxy:
        port = proxy.sockets[0].getsockname()[1]
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
        assert await _call(url, monkeypatch) == "SSLError"
        assert tunnels and served == []  # it went through the proxy, and was refused
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
        assert await _call(url, monkeypatch) == "Teapot"  # the configured bundle vouches
        assert len(tunnels) == 2 and served == [1]
