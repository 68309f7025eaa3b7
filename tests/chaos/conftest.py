from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor

import pytest

from cmr.api import cpu_pool


@pytest.fixture(scope="session")
def pool() -> Iterator[Executor]:
    """One CPU pool for every chaos run: starting processes per run would dominate."""
    with cpu_pool(2) as p:
        yield p
