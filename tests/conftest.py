"""Fixtures for every test: no test can reach a real AWS account or Azure storage account."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.stack import (
    AZURE_SERVER,
    AZURITE_CONNECTION_STRING,
    DYNAMODB_SERVER,
    azurite_up,
    stack_env,
    stack_up,
)

pytest_plugins = ("tests.alone", "tests.everyday")  # parallel runs; the everyday subset

# Where the local stack's DynamoDB server (moto) lacks a semantic that cmr relies on from real
# DynamoDB, the test keeps asserting it, on the embedded backend as written and on the stack as
# a strict expected failure: the day the server learns it, the test fails and says so. A gap
# of Azurite's against Azure is marked ``backend="azure"``: expected to fail there only (and
# in a test that takes no ``backend_name``), named after AZURE_SERVER.
EMULATOR_GAP = "emulator_gap"


def check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under --dist loadgroup, a worker's xdist_group marks must have reached the node ids
    (pytest-xdist adds ``@group`` to them, which is how the controller groups): with pytest
    9.2 they silently did not, and each test of a group ran on any worker (the docs' fresh
    copy set up once per worker, the ``alone`` tests draining the others once each). Called by
    the collection hook below, which runs last (after pytest-xdist's)."""
    # workerinput: an xdist worker's own config (a pytest that a test runs inherits the
    # worker's PYTEST_XDIST_WORKER, not its options).
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"--dist loadgroup did not group {item.nodeid} (pytest {pytest.__version__}): "
                "pin a pytest that pytest-xdist's loadgroup works with (pyproject.toml)"
            )


@pytest.hookimpl(trylast=True)  # after pytest-xdist's, which check_groups checks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_groups(config, items)
    for item in items:
        gap = item.get_closest_marker(EMULATOR_GAP)
        if gap is None:
            continue
        backend = gap.kwargs.get("backend", "aws")
        params = getattr(item, "callspec", None)
        if params is not None and params.params.get("backend_name", backend) != backend:
            continue  # the embedded backend models it, another has no such gap: as written
        server = AZURE_SERVER if backend == "azure" else DYNAMODB_SERVER
        reason = f"emulator gap ({server}): {gap.kwargs['reason']}"
        # raises=: only the gap's own error is expected; any other failure still fails.
        raises = gap.kwargs.get("raises")
        item.add_marker(pytest.mark.xfail(strict=True, reason=reason, raises=raises))
        item.user_properties.append((EMULATOR_GAP, reason))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Count and name the emulator gaps in every run's summary (CI prints it)."""
    gaps = [
        (report.nodeid, dict(report.user_properties)[EMULATOR_GAP])
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        and EMULATOR_GAP in dict(getattr(report, "user_properties", ()))
    ]
    if gaps:
        terminalreporter.section(f"emulator gaps: {len(gaps)}")
        for nodeid, reason in gaps:
            terminalreporter.write_line(f"{nodeid}: {reason}")


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
def _no_real_azure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrub AZURE_* (connection strings, account names and keys, SAS tokens, service
    principals) so only azure_stack can let a test out."""
    for key in list(os.environ):
        if key.startswith("AZURE_"):
            monkeypatch.delenv(key)


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


@pytest.fixture
def azure_stack(_no_real_azure: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point Azure's standard setting, AZURE_STORAGE_CONNECTION_STRING, at the local stack's
    Azurite and return it; skip (fail in CI) when Azurite is down, as aws_stack does."""
    if not azurite_up():
        message = "Azurite is not running: start the local stack with scripts/stack.sh start"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE_CONNECTION_STRING)
    return AZURITE_CONNECTION_STRING
