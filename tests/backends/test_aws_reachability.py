"""Down or slow, told apart within a bound (the issue: nothing listening took 11 s to be
said, and one 3 s connect timeout without a retry failed submits while LocalStack answered
a moment later). Real sockets throughout: a port nothing listens on; a proxy in front of
the local stack that stalls its first seconds, at connect (a full accept queue) or after
accepting (silent), then forwards; and one that never answers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlparse

import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from cmr.backends.aws.errors import translated
from cmr.errors import BackendError, Unreachable
from tests.backends.conftest import AwsNames
from tests.stack import LOCALSTACK_URL

ROOT = Path(__file__).resolve().parents[2]
BOUND = 10  # seconds: cmr.backends.aws.reach.PROBE_SECONDS, the promised bound on 'slow'
WORDCOUNT = str(ROOT / "examples" / "wordcount.py")
# The CLI as the `cmr` script runs it; then whether botocore's clients had been loaded.
PROBE = """
import json, runpy, sys
sys.argv = ["cmr", *json.loads(sys.argv[1])]
try:
    runpy.run_module("cmr", run_name="__main__")
finally:
    print(json.dumps(sorted(m for m in sys.modules if m.startswith(("aioboto3", "aiobotocore")))),
          file=sys.stderr)
"""


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class Stall:
    """A TCP proxy on 127.0.0.1 to ``target`` that stalls for ``seconds`` (None: for
    ever), then forwards. ``at="connect"``: its accept queue is full, so connects hang as
    on a loaded server; ``at="answer"``: it accepts at once and stays silent."""

    def __init__(self, target: str, seconds: float | None, at: str) -> None:
        parsed = urlparse(target)
        self.target = (parsed.hostname or "", parsed.port or 80)
        self.seconds, self.at = seconds, at
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closing = threading.Event()
        self.fillers: list[socket.socket] = []
        self.held: list[socket.socket] = []

    def __enter__(self) -> Stall:
        if self.at == "connect":
            self.listener.listen(0)  # Linux queues one connection more than the backlog
            for _ in range(2):
                filler = socket.socket()
                filler.setblocking(False)
                with suppress(BlockingIOError):
                    filler.connect(self.listener.getsockname())
                self.fillers.append(filler)
            time.sleep(0.2)  # the fillers' handshakes complete: the queue is full
        else:
            self.listener.listen(64)
        self.started = time.monotonic()
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.closing.set()
        for s in (self.listener, *self.fillers, *self.held):
            with suppress(OSError):
                s.close()

    def _open(self) -> bool:
        """Wait out the stall; False when closing first."""
        if self.seconds is None:
            self.closing.wait()
            return False
        left = self.started + self.seconds - time.monotonic()
        return not self.closing.wait(max(left, 0.0))

    def _serve(self) -> None:
        if self.at == "connect":
            if not self._open():
                return
            # Recovered, as a loaded server does: its full backlog again. With the stall's
            # one-connection queue, connects that came together lost their SYNs in turn
            # (the kernel's next try is seconds later), a slowness of this proxy's own.
            try:
                self.listener.listen(64)
            except OSError:  # closed by __exit__ meanwhile
                return
        fillers = {f.getsockname() for f in self.fillers}
        while not self.closing.is_set():
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            if peer in fillers:
                conn.close()
                continue
            self.held.append(conn)
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        if self.at == "answer" and not self._open():
            return
        with suppress(OSError):
            upstream = socket.create_connection(self.target)
            self.held.append(upstream)
            threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
            _pipe(conn, upstream)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)


@contextmanager
def stalled(seconds: float | None, at: str) -> Iterator[Stall]:
    with Stall(LOCALSTACK_URL, seconds, at) as proxy:
        yield proxy


def cmr(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 60
) -> tuple[int, str, str, float]:
    """Exit code, stdout, stderr and seconds to the answer of one `cmr` command."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def words(tmp_path: Path) -> str:
    (tmp_path / "in.txt").write_text("a b a\n")
    return str(tmp_path / "in.txt")


def store(names: AwsNames) -> str:
    names.used = True
    return f"aws://{names.bucket}/{names.table}?prefix={names.queue_prefix}"


# ------------------------------------------------------------------------------ down


@pytest.mark.alone
def test_nothing_listening_is_said_at_once_before_botocore_loads(tmp_path: Path) -> None:
    endpoint = closed_port()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    args = ["run", WORDCOUNT, "-i", words(tmp_path), "-o", "out", "--store", "aws"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seconds = time.monotonic() - started
    *said, loaded = done.stderr.splitlines()
    errors = [line for line in said if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert f"cannot reach sqs, s3, dynamodb at {endpoint}: nothing is listening" in errors[0]
    assert "scripts/stack.sh start" in errors[0]
    # Said from a socket's refusal, before a second of aioboto3 and its clients.
    assert json.loads(loaded) == []
    assert seconds < 8, seconds  # idle, under one; generous for a loaded machine


async def test_a_refused_endpoint_is_down_without_waiting() -> None:
    from cmr.backends.aws import reach

    endpoint = closed_port()
    started = time.monotonic()
    with pytest.raises(Unreachable, match="nothing is listening there") as err:
        await reach.preflight(started + 30, {"AWS_ENDPOINT_URL_DYNAMODB": endpoint})
    assert time.monotonic() - started < 1
    assert str(err.value).startswith(f"cannot reach dynamodb at {endpoint}:")


async def test_a_host_that_does_not_resolve_is_down() -> None:
    from cmr.backends.aws import reach

    env = {"AWS_ENDPOINT_URL": "http://cmr-no-such-host.invalid:4566"}
    with pytest.raises(Unreachable, match=r"cmr-no-such-host\.invalid does not resolve") as err:
        await reach.preflight(time.monotonic() + 30, env)
    assert "AWS_ENDPOINT_URL" in str(err.value)  # not local: check the settings


def test_down_and_slow_say_where_to_look() -> None:
    remote = "https://sqs.example.com"
    refused = EndpointConnectionError(endpoint_url=remote, error=ConnectionRefusedError())
    down = translated("sqs", refused)
    assert isinstance(down, Unreachable)
    assert str(down).startswith(f"cannot reach sqs at {remote}: nothing is listening there")
    assert "AWS_ENDPOINT_URL" in str(down) and "credentials" in str(down)
    # Mid-job, a timeout is slow, and retried like a service fault: not Unreachable.
    for exc in (ConnectTimeoutError(endpoint_url=remote), ReadTimeoutError(endpoint_url=remote)):
        slow = translated("sqs", exc)
        assert type(slow) is BackendError and "is slow" in str(slow), slow


def test_the_endpoints_are_botocores() -> None:
    from cmr.backends.aws import reach

    env = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_DYNAMODB": "http://b:2"}
    assert reach.configured(env) == {
        "sqs": "http://a:1",
        "s3": "http://a:1",
        "dynamodb": "http://b:2",
    }
    assert reach.configured({**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}) == {}
    assert reach.configured({}) == {}  # AWS's own endpoints: the probe's business
    assert reach.PROBE_SECONDS == BOUND


# ------------------------------------------------------------------------------ slow


@pytest.mark.alone
async def test_a_server_that_accepts_no_connection_is_slow_by_the_deadline() -> None:
    from cmr.backends.aws import reach

    with Stall(LOCALSTACK_URL, None, "connect") as proxy:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="is slow, not down: it accepted no connection"):
            await reach.preflight(started + 3, {"AWS_ENDPOINT_URL": proxy.url})
        assert 2.5 < time.monotonic() - started < 6


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.parametrize("at", ["connect", "answer"])
@pytest.mark.alone
@pytest.mark.slow
def test_a_brief_stall_does_not_fail_a_submit(at: str, tmp_path: Path, aws_names: AwsNames) -> None:
    # 4 s: longer than the old single 3 s connect (or 5 s read here), well within the bound
    seconds = 4.0 if at == "connect" else 6.0
    with stalled(seconds, at) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
        args = ["run", WORDCOUNT, "-i", words(tmp_path), "-o", "out", "--detach"]
        code, out, said, took = cmr(*args, "--store", store(aws_names), env=env, cwd=tmp_path)
    assert code == 0, said
    assert took > seconds - 1, took  # it did wait out the stall
    job = out.split()[-1]
    stack = dict(os.environ)
    code, _, said, _ = cmr("cleanup", job, "--store", store(aws_names), env=stack, cwd=tmp_path)
    assert code == 0, said


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.alone
@pytest.mark.slow
def test_a_store_that_never_answers_is_slow_within_the_bound(
    tmp_path: Path, aws_names: AwsNames
) -> None:
    with stalled(None, "answer") as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
        code, _, said, took = cmr("status", "--store", store(aws_names), env=env, cwd=tmp_path)
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1, said
    assert (
        f"sqs, s3 at {proxy.url} is slow, not down: it did not answer within {BOUND} s" in errors[0]
    )
    assert "scripts/stack.sh status" in errors[0]
    assert BOUND - 1 < took < BOUND + 8, took
