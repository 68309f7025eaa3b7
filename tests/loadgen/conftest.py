"""Services the load-generator tests drive: moto's SimpleDB server and a scripted HTTP server.

moto's server is the only local SimpleDB; it runs as a subprocess for the session and skips
(fails in CI) when moto is not installed. The scripted server answers every request with the
next response of a script (the last one repeats), so tests can provoke the exact errors a
cloud service sends under load (503 ServiceUnavailable, SlowDown, throttling) through the
real SDK, which a local stack never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.1)
    return False


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The URL of a moto server started for this session."""
    if importlib.util.find_spec("moto") is None:
        _unavailable("moto is not installed: install moto[server] for the SimpleDB tests")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not _wait_for_port(port, 30):
            _unavailable("moto's server did not start within 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def simpledb(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point SimpleDB clients at moto through the AWS_ENDPOINT_URL_SDB alias."""
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SDB", moto_server)
    return moto_server


@pytest.fixture
def test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(key, value)


@dataclass(frozen=True)
class Answer:
    status: int
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ScriptedServer:
    url: str
    script: list[Answer] = field(default_factory=list)
    requests: int = 0
    silent: bool = False  # accept requests and never answer (a read timeout)


@pytest.fixture
async def scripted_server() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer(url="")
    stop = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        server.requests += 1
        if server.silent:
            await stop.wait()
        answer = server.script[min(server.requests, len(server.script)) - 1]
        return web.Response(status=answer.status, text=answer.body, headers=answer.headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        stop.set()
        await runner.cleanup()
