"""`cmr dashboard`'s refusals, each one clear line before anything is opened: an address beyond
loopback without --allow-remote, the embedded backend, a port out of range or taken."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.dashboard.live import ROOT

STORE = "aws://cmr-nowhere/cmr-nowhere?prefix=cmrnowhere-"


def dashboard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", "dashboard", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "example.com", "::"])
def test_a_host_beyond_loopback_needs_allow_remote(host: str) -> None:
    line = one_error(dashboard("--store", STORE, "--host", host))
    assert f"--host {host} is not a loopback address" in line and "--allow-remote" in line


def test_the_embedded_backend_says_what_to_do_instead() -> None:
    line = one_error(dashboard("--store", "embedded"))
    assert "inside its own `cmr run` process" in line and "--store aws" in line


def test_a_port_out_of_range() -> None:
    assert "--port must be from 0 to 65535" in one_error(
        dashboard("--store", STORE, "--port", "70000")
    )


def test_a_port_taken() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = one_error(dashboard("--store", STORE, "--port", str(port)))
    assert f"cannot listen on 127.0.0.1:{port}" in line
