"""Fixtures for every test: no test can reach a real AWS account."""

from __future__ import annotations

import os

import pytest

from tests.stack import stack_env, stack_up


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrub AWS_* (credentials, profiles, endpoints) so only aws_stack can let a test out."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    # ~/.aws must not supply a profile or credentials either, nor may botocore ask EC2's IMDS.
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cmr run` remembers where it ran (cmr.cli.laststore): tests keep that to themselves,
    never overwriting the developer's own last run."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def aws_stack(_no_real_aws: None, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point the standard AWS settings at the local stack; skip (fail in CI) when it is down."""
    if not stack_up():
        message = "local AWS stack is not running: start it with scripts/stack.sh start"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    env = stack_env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
