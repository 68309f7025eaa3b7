from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

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
