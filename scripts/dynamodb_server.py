"""DynamoDB and SimpleDB for the local stack: moto's open-source (Apache-2.0) models of both,
served on one loopback port. Run by scripts/stack.sh with the interpreter of its own venv
(.stack/moto-venv, installed from scripts/moto-requirements.txt with every hash checked):

    python scripts/dynamodb_server.py --host 127.0.0.1 --port 8000

Why not ``moto_server``: it guesses the service of every request under one global lock,
scanning every moto module, and it runs requests of many connections at once on the same
in-memory tables. Moto's DynamoDB model has no lock of its own, so two conditional writes
could both see the item absent and both succeed -- a race real DynamoDB never lets happen
and cmr's claims and commit records must never meet. Here a request is routed by its
``X-Amz-Target`` header (DynamoDB's JSON protocol) or else to SimpleDB (a form-encoded
query), its body is read whole first, and the model runs one request at a time.
"""

from __future__ import annotations

import argparse
import io
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

Environ = dict[str, Any]
StartResponse = Callable[..., Any]


class QuietHandler(MotoRequestHandler):
    """One log line per request would fill the log of a load test: errors only."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code).startswith("5"):
            super().log_request(code, size)


class OneAtATime:
    """DynamoDB by X-Amz-Target, SimpleDB otherwise; each request applied whole before the
    next one starts (see the module's docstring)."""

    def __init__(self) -> None:
        self.dynamodb = create_backend_app("dynamodb")
        self.sdb = create_backend_app("sdb")
        self.lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        # The body is read before the lock is taken, so a slow sender holds up no one else.
        length = int(environ.get("CONTENT_LENGTH") or 0)
        environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read(length) if length else b"")
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        app = self.dynamodb if target.startswith("DynamoDB_") else self.sdb
        with self.lock:
            result = app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = make_server(
        args.host, args.port, OneAtATime(), threaded=True, request_handler=QuietHandler
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"DynamoDB and SimpleDB (moto) on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
