"""Services the load-generator tests drive: the local stack's SimpleDB and a scripted HTTP server.

SimpleDB is the local stack's moto server (scripts/stack.sh), reached through the standard
``AWS_ENDPOINT_URL_SIMPLEDB`` as a user reaches it. The scripted server answers every request
with the next response of a script (the last one repeats), so tests can provoke the exact errors a
cloud service sends under load (503 ServiceUnavailable, SlowDown, throttling) through the
real SDK, which a local stack never does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from tests.stack import free_port

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def simpledb(aws_stack: dict[str, str]) -> str:
    """The local stack's SimpleDB (moto), through the standard AWS_ENDPOINT_URL_SIMPLEDB."""
    return aws_stack["AWS_ENDPOINT_URL_SIMPLEDB"]


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
