from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from cmr.api import open_backend
from cmr.backends.base import Backend
from cmr.settings import AwsSettings
from cmr.testing import backend_leftovers
from tests.stack import remove_test_resources


@pytest.fixture
async def embedded() -> AsyncIterator[Backend]:
    async with open_backend("embedded", AwsSettings()) as be:
        yield be


@pytest.fixture
async def aws(aws_stack: dict[str, str]) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    tag = uuid.uuid4().hex[:8]
    settings = AwsSettings(
        bucket=f"cmr-e2e-{tag}", table=f"cmr-e2e-{tag}", queue_prefix=f"cmre-{tag}-"
    )
    try:
        async with open_backend("aws", settings) as be:
            yield be, settings
            # Every job of the test ended and cleaned up after itself: nothing is left.
            assert await backend_leftovers(be, settings.queue_prefix) == []
    finally:
        remove_test_resources(settings.bucket, settings.table, settings.queue_prefix)
