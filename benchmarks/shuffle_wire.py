"""TeraSort's requests on the wire, shuffled through queues and through the blob store.

    scripts/stack.sh start
    .venv/bin/python benchmarks/shuffle_wire.py [--sizes-mb 200,1000] [--shuffles queue,blob]
        [--workers 2] [--reducers 4] [--json F] [--markdown F]

Runs ``cmr run examples/terasort.py --backend aws`` (a local TeraGen input, staged into S3
by cmr; the output fetched back to a local directory) against the local stack, with every
HTTP request going through a counting proxy in this process: one in front of LocalStack
(S3 and SQS), one in front of moto's DynamoDB. The client and its ``cmr worker``
processes are pointed at the proxies by ``AWS_ENDPOINT_URL*``, so every request of the run
is counted, retries and multipart parts included. Each output is checked by Hadoop's
TeraValidate and against the input's checksum.

Reported per run: requests by service and operation, SQS requests as billed (each 64 KiB
of a request's payload one request; the payload taken as the larger of the HTTP request and
response bodies, JSON and base64 included, so a slight overcount), and per GB shuffled
(TeraSort shuffles all of its input); between two sizes, the per-GB slope of each service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

if __package__:  # imported as benchmarks.shuffle_wire
    from benchmarks import hadoop
else:  # run as a script: benchmarks/ is on sys.path
    import hadoop  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CHUNK = 64 * 1024  # SQS bills each 64 KiB of a payload as one request
GB = 1_000_000_000
# Hop-by-hop headers (RFC 9110) and the ones aiohttp sets itself from the body it sends.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


@contextlib.contextmanager
def self_signed() -> Iterator[tuple[ssl.SSLContext, str]]:
    """A TLS server context for 127.0.0.1 with a throwaway self-signed certificate, and the
    path of that certificate: a client that trusts it (``AWS_CA_BUNDLE``) speaks https to
    the proxies as it would to AWS, so botocore signs no payload (it hashes every payload
    it sends over plain http) and pays for TLS instead."""
    if str(REPO) not in sys.path:  # run as a script: the checkout's tests/ beside it
        sys.path.insert(0, str(REPO))
    from tests.tls import loopback_certificate

    with tempfile.TemporaryDirectory(prefix="cmr-tls-") as d:
        # A day: longer than any run a benchmark makes (cloudsort's may take two hours).
        crt, pem = loopback_certificate(Path(d), "cmr counting proxy", datetime.timedelta(days=1))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(crt, pem)
        yield context, str(crt)


@dataclass
class Tally:
    """Requests seen by one proxy: by service.operation, and SQS's billed count."""

    requests: Counter[str] = field(default_factory=Counter)
    sqs_billed: int = 0
    bytes_up: Counter[str] = field(default_factory=Counter)  # by service
    bytes_down: Counter[str] = field(default_factory=Counter)
    # By "operation@kind" (kind: what the request touched, as Proxy's ``kind`` tells it):
    # requests, and the bytes of their bodies either way.
    by_kind: Counter[str] = field(default_factory=Counter)
    kind_bytes: Counter[str] = field(default_factory=Counter)

    def by_service(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for op, n in self.requests.items():
            out[op.split(".", 1)[0]] += n
        return out


def operation(method: str, path: str, query: str, headers: Any, body: bytes) -> str:
    """service.Operation of one request to LocalStack or DynamoDB."""
    target = str(headers.get("X-Amz-Target", ""))
    if target.startswith("DynamoDB_"):
        return "dynamodb." + target.split(".", 1)[1]
    if target.startswith("AmazonSQS."):
        return "sqs." + target.split(".", 1)[1]
    if "Action=" in query or (
        body.startswith(b"Action=") and "x-www-form-urlencoded" in headers.get("Content-Type", "")
    ):
        text = query if "Action=" in query else body[:200].decode(errors="replace")
        action = text.split("Action=", 1)[1].split("&", 1)[0]
        return "sqs." + action
    # S3, path style: /bucket[/key]
    key = path.strip("/").partition("/")[2]
    if method == "PUT":
        if "partNumber=" in query:
            return "s3.UploadPart"
        if headers.get("x-amz-copy-source"):
            return "s3.CopyObject"
        return "s3.PutObject" if key else "s3.CreateBucket"
    if method == "POST":
        if "uploads" in query.split("&"):
            return "s3.CreateMultipartUpload"
        if "uploadId=" in query:
            return "s3.CompleteMultipartUpload"
        if "delete" in query.split("&"):
            return "s3.DeleteObjects"
        return "s3.POST"
    if method == "DELETE":
        return "s3.AbortMultipartUpload" if "uploadId=" in query else "s3.DeleteObject"
    if method == "HEAD":
        return "s3.HeadObject" if key else "s3.HeadBucket"
    if method == "GET":
        if not key:
            return "s3.ListObjects" if "list-type" in query or "prefix" in query else "s3.GET"
        return "s3.GetObject"
    return f"s3.{method}"


class Proxy:
    """A reverse proxy on 127.0.0.1 that forwards every request to ``upstream`` as it is
    (headers, Host included, and body) and counts it."""

    def __init__(self, upstream: str, tally: Tally, kind: Any = None, name: Any = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.tally = tally
        self.kind = kind  # path -> a label, or None: no breakdown
        self.name = name or operation  # (method, path, query, headers, body) -> service.Op
        self.port = 0
        self._lock = threading.Lock()
        self.session: ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        assert self.session is not None
        async with self.session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body,
            allow_redirects=False,
            auto_decompress=False,
            # No Content-Type of aiohttp's own: Azure's Shared Key signs the header, so one
            # the client did not send makes the service refuse the signature.
            skip_auto_headers=() if "Content-Type" in headers else ("Content-Type",),
        ) as resp:
            data = await resp.read()
            out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            if request.method == "HEAD" and "Content-Length" in resp.headers:
                # A HEAD answer has no body, yet its length is the object's (S3's size).
                out_headers["Content-Length"] = resp.headers["Content-Length"]
            status = resp.status
        op = self.name(request.method, request.path, request.query_string, request.headers, body)
        service = op.split(".", 1)[0]
        with self._lock:
            self.tally.requests[op] += 1
            self.tally.bytes_up[service] += len(body)
            self.tally.bytes_down[service] += len(data)
            if service == "sqs":
                self.tally.sqs_billed += max(1, math.ceil(max(len(body), len(data)) / CHUNK))
            if self.kind is not None:
                label = f"{op}@{self.kind(request.path)}"
                self.tally.by_kind[label] += 1
                self.tally.kind_bytes[label] += len(body) + len(data)
        if request.method == "HEAD":
            head = web.StreamResponse(status=status, headers=out_headers)
            await head.prepare(request)
            return head
        return web.Response(status=status, body=data, headers=out_headers)

    async def start(self, tls: ssl.SSLContext | None = None) -> web.AppRunner:
        self.session = ClientSession(
            connector=TCPConnector(limit=256), timeout=ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner


@contextlib.contextmanager
def serving(made: list[Proxy], tls: ssl.SSLContext | None = None) -> Iterator[list[Proxy]]:
    """Counting proxies served by a loop in a thread of their own, started (each with its
    port) for the block and stopped after it. With ``tls`` they serve https."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runners: list[web.AppRunner] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def go() -> None:
            for p in made:
                runners.append(await p.start(tls))
            started.set()

        loop.run_until_complete(go())
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield made
    finally:

        async def stop() -> None:
            for r in runners:
                await r.cleanup()
            for p in made:
                if p.session is not None:
                    await p.session.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@contextlib.contextmanager
def proxies(
    localstack: str, dynamodb: str, kind: Any = None, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[Tally, Tally, int, int]]:
    """Two counting proxies (``kind``: the breakdown of LocalStack's requests, Proxy's).
    With ``tls`` they serve https, as AWS does, and forward plain http to the local stack:
    the TLS is the clients' and this process's, never the stack's."""
    aws, ddb = Tally(), Tally()
    with serving([Proxy(localstack, aws, kind), Proxy(dynamodb, ddb)], tls) as (p1, p2):
        yield aws, ddb, p1.port, p2.port


@dataclass
class Run:
    size_mb: int
    shuffle: str
    workers: int
    reducers: int
    seconds: float
    ok: bool
    check: str
    requests: dict[str, int]
    by_service: dict[str, int]
    sqs_billed: int
    bytes_up: dict[str, int]
    bytes_down: dict[str, int]

    @property
    def gb(self) -> float:
        return self.size_mb * 1_000_000 / GB

    def per_gb(self) -> dict[str, float]:
        return {
            "sqs_billed": self.sqs_billed / self.gb,
            "s3": self.by_service.get("s3", 0) / self.gb,
            "dynamodb": self.by_service.get("dynamodb", 0) / self.gb,
        }


def teragen_input(size_mb: int, root: Path) -> Path:
    rows = size_mb * 1_000_000 // hadoop.RECORD
    out = root / f"teragen-{size_mb}mb"
    if (out / "_SUCCESS").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    ran = hadoop.teragen(rows, out, hadoop.Env(root / f".teragen-{size_mb}mb"))
    if ran.failure:
        raise SystemExit(f"TeraGen failed: {ran.failure}")
    return out


@functools.cache
def input_checksum(data: Path, scratch: Path) -> str | None:
    """TeraValidate's checksum of the input (TeraGen's, unsorted): a sorted output of the
    same records has the same one."""
    _, _, lines = hadoop.validate_run(data, hadoop.Env(scratch))
    got: str | None = hadoop.checksum(lines)
    return got


def one_run(
    size_mb: int, data: Path, shuffle: str, workers: int, reducers: int, scratch: Path, tag: str
) -> Run:
    out = scratch / f"out-{size_mb}-{shuffle}"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    with proxies(
        env.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
        env.get("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000"),
    ) as (aws, ddb, aws_port, ddb_port):
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{aws_port}"
        env["AWS_ENDPOINT_URL_DYNAMODB"] = f"http://127.0.0.1:{ddb_port}"
        store = f"aws://cmr-wire-{tag}/cmr-wire-{tag}?prefix=cmrw{tag}-"
        argv = [
            sys.executable, "-m", "cmr", "run", str(REPO / "examples" / "terasort.py"),
            "--store", store, "--input", str(data), "--output", str(out),
            "--workers", str(workers), "--reducers", str(reducers),
            "--shuffle", shuffle, "--no-progress",
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(
            argv, check=False, env=env, capture_output=True, text=True, timeout=3600
        )
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"cmr run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        tallies = (aws, ddb)
        requests: Counter[str] = Counter()
        for t in tallies:
            requests.update(t.requests)
        by_service: Counter[str] = Counter()
        bytes_up: Counter[str] = Counter()
        bytes_down: Counter[str] = Counter()
        for t in tallies:
            by_service.update(t.by_service())
            bytes_up.update(t.bytes_up)
            bytes_down.update(t.bytes_down)
        billed = aws.sqs_billed
    ok, lines = hadoop.validate_cmr_output(out, hadoop.Env(scratch / f".check-{size_mb}-{shuffle}"))
    got, want = hadoop.checksum(lines), input_checksum(data, scratch / f".check-in-{size_mb}")
    good = ok and got is not None and got == want
    same = "=" if got == want else "!="
    check = f"TeraValidate {'ok' if ok else 'FAILED'}, checksum {got} {same} input's {want}"
    shutil.rmtree(out, ignore_errors=True)
    return Run(
        size_mb, shuffle, workers, reducers, round(seconds, 2), good, check,
        dict(sorted(requests.items())), dict(by_service), billed, dict(bytes_up), dict(bytes_down),
    )  # fmt: skip


def slopes(runs: list[Run]) -> dict[str, dict[str, float]]:
    """Per shuffle: the extra requests per extra GB between the smallest and largest size."""
    out: dict[str, dict[str, float]] = {}
    for shuffle in sorted({r.shuffle for r in runs}):
        mine = sorted((r for r in runs if r.shuffle == shuffle), key=lambda r: r.size_mb)
        if len(mine) < 2:
            continue
        a, b = mine[0], mine[-1]
        dgb = b.gb - a.gb
        out[shuffle] = {
            "sqs_billed": (b.sqs_billed - a.sqs_billed) / dgb,
            "sqs": (b.by_service.get("sqs", 0) - a.by_service.get("sqs", 0)) / dgb,
            "s3": (b.by_service.get("s3", 0) - a.by_service.get("s3", 0)) / dgb,
            "dynamodb": (b.by_service.get("dynamodb", 0) - a.by_service.get("dynamodb", 0)) / dgb,
        }
    return out


def markdown(runs: list[Run]) -> str:
    lines = [
        "| size | shuffle | time | SQS requests | SQS billed | per GB | S3 | per GB | "
        "DynamoDB | per GB | check |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        g = r.per_gb()
        s = r.by_service
        lines.append(
            f"| {r.size_mb} MB | {r.shuffle} | {r.seconds:.1f} s | {s.get('sqs', 0):,} | "
            f"{r.sqs_billed:,} | {g['sqs_billed']:,.0f} | {s.get('s3', 0):,} | {g['s3']:,.0f} | "
            f"{s.get('dynamodb', 0):,} | {g['dynamodb']:,.0f} | {r.check} |"
        )
    sl = slopes(runs)
    if sl:
        lines += [
            "",
            "| shuffle | SQS billed per extra GB | SQS | S3 | DynamoDB |",
            "|---|---:|---:|---:|---:|",
        ]
        for shuffle, v in sl.items():
            lines.append(
                f"| {shuffle} | {v['sqs_billed']:,.0f} | {v['sqs']:,.0f} | {v['s3']:,.0f} | "
                f"{v['dynamodb']:,.0f} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", default="200,1000")
    ap.add_argument("--shuffles", default="queue,blob")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reducers", type=int, default=4)
    ap.add_argument("--data", type=Path, default=HERE / "data")
    ap.add_argument("--scratch", type=Path, default=HERE / "out" / "shuffle-wire")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    if hadoop.problem():
        raise SystemExit(f"Hadoop is needed for TeraGen and TeraValidate: {hadoop.problem()}")
    args.scratch.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    tag = f"{os.getpid():x}"
    for size in (int(s) for s in args.sizes_mb.split(",")):
        data = teragen_input(size, args.data)
        for shuffle in args.shuffles.split(","):
            run = one_run(size, data, shuffle, args.workers, args.reducers, args.scratch, tag)
            runs.append(run)
            print(json.dumps(asdict(run)), flush=True)
    table = markdown(runs)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs": [asdict(r) for r in runs],
                    "slopes": slopes(runs),
                    "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                },
                indent=1,
            )
            + "\n"
        )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
