from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import structlog

from cmr.api import open_backend
from cmr.backends.base import Backend
from cmr.settings import AwsSettings
from tests.stack import stack_backend


@pytest.fixture
async def embedded() -> AsyncIterator[Backend]:
    async with open_backend("embedded", AwsSettings()) as be:
        yield be


@pytest.fixture
async def aws(aws_stack: dict[str, str]) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    async with stack_backend("e2e", "cmre") as made:
        yield made


@pytest.fixture
def logs_restored() -> Iterator[None]:
    """structlog's configuration as it was before the test: `cmr run` and `cmr.run`
    configure it (under CliRunner, onto the runner's stderr, closed once it returns), and
    the tests after must not log into it."""
    was, saved = structlog.is_configured(), structlog.get_config()
    yield
    if was:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()
