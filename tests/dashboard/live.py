"""Real jobs on the local stack and a real `cmr dashboard` process serving them, for the API's
and the page's tests; and Debian's Chromium, driven by Playwright."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.stack import remove_test_resources

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SLOW = str(HERE / "slow_count.py")
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium's own connections (updates, sync, field
# trials) are refused here, and it stalls on them.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T = TypeVar("T")


def cmr(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cmr", *args],
        env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def done(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


@dataclass(frozen=True)
class Stack:
    """A store of its own on the local AWS stack."""

    tag: str

    @property
    def bucket(self) -> str:
        return f"cmr-dash-{self.tag}"

    @property
    def table(self) -> str:
        return f"cmr-dash-{self.tag}"

    @property
    def prefix(self) -> str:
        return f"cmrd-{self.tag}-"

    @property
    def url(self) -> str:
        return f"aws://{self.bucket}/{self.table}?prefix={self.prefix}"

    def submit(self, job: str, src: Path, *args: str) -> str:
        """Submit ``job`` and leave it to workers (--detach): its id."""
        out = done(
            cmr(
                "run",
                job,
                "-i",
                str(src),
                "-o",
                f"s3://{self.bucket}/out-{uuid.uuid4().hex[:6]}/",
                "--store",
                self.url,
                "--detach",
                *args,
            )
        )
        return out.strip().splitlines()[-1]

    def worker(self, idle_exit: float = 4) -> subprocess.Popen[str]:
        return cmr("worker", "--store", self.url, "--idle-exit", str(idle_exit))


@contextlib.contextmanager
def stack_store() -> Iterator[Stack]:
    s = Stack(uuid.uuid4().hex[:8])
    try:
        yield s
    finally:
        remove_test_resources(s.bucket, s.table, s.prefix)


@contextlib.contextmanager
def dashboard(store: str, *extra: str, stderr: list[str] | None = None) -> Iterator[str]:
    """A `cmr dashboard` process on a free port: its URL, read from the line it prints.
    ``stderr``: gets what it wrote there, once it has stopped."""
    proc = cmr("dashboard", "--store", store, "--port", "0", *extra)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if " at http://" not in line:
            proc.kill()
            raise AssertionError(f"no URL from cmr dashboard: {line!r} {proc.stderr.read()!r}")
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        if stderr is not None:
            stderr.append(err)


def get(url: str, host: str | None = None) -> tuple[int, Any]:
    """(status, JSON document) of a GET."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, body.decode(errors="replace")


def until(what: str, probe: Callable[[], T | None], timeout: float = 120) -> T:
    """``probe()`` once it is not None (or falsy), polled; fails naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def lines_file(tmp: Path, n: int) -> Path:
    src = tmp / "in.txt"
    src.write_text("".join(f"alpha beta {i % 5}\n" for i in range(n)))
    return src


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A fresh Chromium (Debian's) context, a new user-data directory each time."""
    if not shutil.which(CHROMIUM):
        message = f"Chromium is not installed ({CHROMIUM}): apt-get install chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
