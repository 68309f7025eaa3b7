"""Fixtures for the fleet tests: the template as data, a moto server, the fleet CLI."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cmr.cli import app
from tests.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "fleet.yaml"
MOTO_REGION = "us-east-1"


def load_template() -> dict[str, Any]:
    """The template as plain data; cfn-lint's decoder understands the !Ref/!Sub short forms."""
    from cfnlint.decode import decode_str  # type: ignore[import-untyped]

    decoded, problems = decode_str(TEMPLATE.read_text())
    assert not problems, problems
    plain: dict[str, Any] = json.loads(json.dumps(decoded))
    return plain


def render_user_data(template: dict[str, Any], values: dict[str, str]) -> str:
    """Fn::Sub of the launch template's user data, as CloudFormation would render it."""
    data = template["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    text: str = data["UserData"]["Fn::Base64"]["Fn::Sub"]

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("!"):
            return "${" + name[1:] + "}"
        return values[name]

    return re.sub(r"\$\{([^}]+)\}", one, text)


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """A moto standalone server on a free loopback port, for the whole session."""
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.skip("moto_server is not installed (moto[server] is in requirements-dev.txt)")
    port = free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 -- lives as long as the server
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto_server did not start on {url}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def moto_env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every AWS client of this test (and the CLI it runs) talks to the moto server."""
    env = {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": MOTO_REGION,
        # `up` locks the wheel's dependencies from uv's cache: no network in tests.
        "UV_OFFLINE": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    return env


def fleet(*args: str) -> str:
    """Run ``cmr fleet ARGS`` in-process; fail the test with its output unless it exits 0."""
    result = CliRunner().invoke(app, ["fleet", *args], catch_exceptions=False)
    assert result.exit_code == 0, f"cmr fleet {' '.join(args)} exited {result.exit_code}:\n" + (
        result.output
    )
    return result.stdout


def fleet_status(stack: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(fleet("status", "--stack", stack, "--json"))
    return report
