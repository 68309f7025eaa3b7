"""The dashboard's server: the page and its JSON API, an ASGI app (Starlette) under uvicorn.

    GET /                      the page (static/index.html), which polls the API every second
    GET /static/...            its script, style and the vendored chart library
    GET /api/jobs              a page of the job list: ?offset=0&limit=50&state=running
    GET /api/jobs/{job}        one job: its steps, counters, duplicates, failures, attempts
    GET /api/workers           the workers seen lately

Bound to a loopback address by default. The page shows a store's job records, so the server
answers only requests that name it by a loopback name (a web page elsewhere that rebinds its
own DNS name to 127.0.0.1 cannot read it), and every response forbids scripts but its own
(Content-Security-Policy): a string from the table that got into markup would still not run.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from cmr.backends.base import Backend
from cmr.dashboard.board import MAX_PAGE, PAGE, STATES, Board, plain
from cmr.errors import BackendError, NotFound, UsageError

STATIC = "static"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
MAX_OFFSET = 10**7

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost`` (nothing is resolved: a name
    other than localhost may point anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(plain(content), allow_nan=False, separators=(",", ":")).encode()


def _int(request: Request, name: str, default: int, least: int, most: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not least <= int(text) <= most:
        raise UsageError(f"{name} must be a whole number from {least} to {most}")
    return int(text)


def make_app(board: Board, *, hosts: tuple[str, ...] | None = LOOPBACK_NAMES) -> App:
    """The app serving ``board``; ``hosts``: the names a request may call this server by
    (None: any, for a server that was told to listen beyond loopback)."""

    async def index(request: Request) -> Response:
        return FileResponse(_static_dir() + "/index.html", headers={"cache-control": "no-store"})

    async def jobs(request: Request) -> Response:
        offset = _int(request, "offset", 0, 0, MAX_OFFSET)
        limit = _int(request, "limit", PAGE, 1, MAX_PAGE)
        state = request.query_params.get("state") or None
        if state is not None and state not in STATES | {"unknown"}:
            raise UsageError(f"state must be one of {', '.join(sorted(STATES))}")
        return Json(await board.jobs(offset, limit, state))

    async def job(request: Request) -> Response:
        return Json(await board.job(request.path_params["job"]))

    async def seen(request: Request) -> Response:
        return Json(await board.workers())

    async def refused(request: Request, exc: Exception) -> Response:
        return Json({"error": str(exc)}, status_code=400)

    async def missing(request: Request, exc: Exception) -> Response:
        return Json({"error": str(exc)}, status_code=404)

    async def unreachable(request: Request, exc: Exception) -> Response:
        # The store did not answer (or refused): the page says so and polls again.
        return Json({"error": f"the store: {exc}"}, status_code=503)

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/jobs", jobs),
            Route("/api/jobs/{job}", job),
            Route("/api/workers", seen),
            Mount("/static", StaticFiles(directory=_static_dir()), name="static"),
        ],
        exception_handlers={
            UsageError: refused,
            NotFound: missing,
            BackendError: unreachable,
        },
    )
    return _guarded(app, hosts)


def _static_dir() -> str:
    from importlib.resources import files

    return str(files("cmr.dashboard") / STATIC)


def _guarded(app: App, hosts: tuple[str, ...] | None) -> App:
    """``app`` answering only requests whose Host names this server, every response with the
    page's security headers."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if hosts is not None:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = urlsplit("//" + header).hostname or ""
            if name not in hosts:
                refused = Response("unknown host\n", status_code=421, media_type="text/plain")
                await refused(scope, receive, send)
                return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await app(scope, receive, with_headers)

    return guarded


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on (host, port); port 0 picks a free one. One clear error when the
    address is taken or not this machine's."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


class Dashboard:
    """The server of one store's dashboard on a listening socket; ``serve`` until ``stop``."""

    def __init__(
        self, backend: Backend, sock: socket.socket, *, store: str = "", any_host: bool = False
    ) -> None:
        self.board = Board(backend, store=store)
        self.sock = sock
        self.url = url_of(sock)
        bound = sock.getsockname()[0]
        hosts = None if any_host else (*LOOPBACK_NAMES, bound)
        config = uvicorn.Config(
            make_app(self.board, hosts=hosts),
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self.server = uvicorn.Server(config)

    async def serve(self) -> None:
        await self.server.serve(sockets=[self.sock])

    def stop(self) -> None:
        self.server.should_exit = True
