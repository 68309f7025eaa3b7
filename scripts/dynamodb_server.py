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
import base64
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.core.serialize import JSONSerializer
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


# --- Items as DynamoDB writes them, without moto's generic serializer --------------------
# moto 5.2 writes every response by walking botocore's model of it, value by value: for an
# item, each attribute is a structure of ten members, each looked up under two names. That
# was over half of this server's CPU in a test run (queries return whole job records). An
# item whose attribute values are the plain dicts moto keeps ({"S": "x"}, {"M": {...}}) is
# written here as that walk writes it; anything else (another type, a member moto would
# rename) goes the generic way. CMR_MOTO_SERIALIZE_CHECK=1 runs both and logs any
# difference (a test run with it on logged none).
_generic_map = JSONSerializer._serialize_type_map
_CHECK = os.environ.get("CMR_MOTO_SERIALIZE_CHECK") == "1"
_NOT_PLAIN = object()


def _plain_value(value: Any) -> Any:
    """One AttributeValue as the generic walk writes it, or _NOT_PLAIN."""
    if type(value) is not dict or len(value) != 1:
        return _NOT_PLAIN
    ((kind, inner),) = value.items()
    if kind in ("S", "N"):
        return {kind: inner} if type(inner) is str else _NOT_PLAIN
    if kind in ("BOOL", "NULL"):
        return {kind: inner} if type(inner) is bool else _NOT_PLAIN
    if kind == "B":
        if type(inner) is bytes:
            return {kind: base64.b64encode(inner).strip().decode("utf-8")}
        return _NOT_PLAIN
    if kind in ("SS", "NS"):
        if type(inner) is list and all(type(x) is str for x in inner):
            return {kind: list(inner)}
        return _NOT_PLAIN
    if kind == "M":
        written = _plain_map(inner)
        return _NOT_PLAIN if written is _NOT_PLAIN else {kind: written}
    if kind == "L":
        if type(inner) is not list:
            return _NOT_PLAIN
        items = [_plain_value(x) for x in inner]
        return _NOT_PLAIN if any(x is _NOT_PLAIN for x in items) else {kind: items}
    return _NOT_PLAIN  # BS, or a member the model does not have


def _plain_map(value: Any) -> Any:
    if type(value) is not dict:
        return _NOT_PLAIN
    written = {}
    for name, attribute in value.items():
        one = _plain_value(attribute)
        if one is _NOT_PLAIN:
            return _NOT_PLAIN
        written[name] = one
    return written


fast_writes = [0]  # maps written here, not by the generic walk (the test checks some are)
_generic_only = [False]  # while the check's generic walk runs: nested maps generic too


def _serialize_type_map(
    self: JSONSerializer, serialized: Any, value: Any, shape: Any, key: str
) -> None:
    if not _generic_only[0] and getattr(shape.value, "name", None) == "AttributeValue":
        written = _plain_map(value)
        if written is not _NOT_PLAIN:
            fast_writes[0] += 1
            if _CHECK:
                # (An attribute named "" differs: the generic walk merges its members into
                # the enclosing map, which is moto's slip, not DynamoDB's answer.)
                generic: dict[str, Any] = {}
                _generic_only[0] = True
                try:
                    _generic_map(self, generic, value, shape, key)
                finally:
                    _generic_only[0] = False
                if generic != {self.get_serialized_name(shape, key): written}:
                    print(f"SERIALIZE MISMATCH {key}: {generic!r} != {written!r}", flush=True)
            self._default_serialize(serialized, written, shape, key)
            return
    _generic_map(self, serialized, value, shape, key)


JSONSerializer._serialize_type_map = _serialize_type_map  # type: ignore[method-assign]


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
