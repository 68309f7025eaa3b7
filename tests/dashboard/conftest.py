from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmr.api import open_backend
from cmr.backends.base import Backend
from cmr.settings import AwsSettings


@pytest.fixture
async def embedded() -> AsyncIterator[Backend]:
    async with open_backend("embedded", AwsSettings()) as be:
        yield be
