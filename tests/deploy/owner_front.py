"""An S3 endpoint that enforces ExpectedBucketOwner, in front of LocalStack.

LocalStack 4.9.2 (and moto) accept any ExpectedBucketOwner, where S3 answers 403 to a request
whose bucket another account owns. This front forwards every request to LocalStack unchanged,
records the header each carried, and answers 403 AccessDenied, as S3 does, when the header
names another account than the bucket's owner: LocalStack's own account for every bucket but
those ``owners`` gives to strangers.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

LOCAL_ACCOUNT = "000000000000"  # LocalStack's account: the owner of every bucket on it
HEADER = "x-amz-expected-bucket-owner"
_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length"}
_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


@dataclass
class Seen:
    """One request that reached the front: method, path (with query) and the owner it named."""

    method: str
    path: str
    owner: str | None


@dataclass
class Front:
    url: str
    seen: list[Seen] = field(default_factory=list)


@contextmanager
def owner_front(upstream: str, owners: dict[str, str] | None = None) -> Iterator[Front]:
    """A front on a free loopback port for the duration of the block (path-style URLs)."""
    owned = owners or {}
    target = urlparse(upstream)
    front = Front("")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test reads `seen`, not a log

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            owner = self.headers.get(HEADER)
            with lock:
                front.seen.append(Seen(self.command, self.path, owner))
            bucket = urlparse(self.path).path.lstrip("/").split("/", 1)[0]
            if owner is not None and owner != owned.get(bucket, LOCAL_ACCOUNT):
                payload = b"" if self.command == "HEAD" else _DENIED
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            got = conn.getresponse()
            data = got.read()
            self.send_response(got.status, got.reason)
            for k, v in got.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            # HEAD answers carry the object's length, not a body.
            size = got.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", size or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    front.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield front
    finally:
        server.shutdown()
        server.server_close()
