"""`cmr dashboard` on Azurite: the same API over Azure's Table storage, a real job run by a
`cmr worker` process shown whole once it ended (the ``azure`` fixture checks nothing was left)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.settings import AwsSettings, BackendName, Store
from tests.dashboard.live import SLOW, dashboard, get, lines_file
from tests.stack import azure_stack_backend

pytestmark = [pytest.mark.usefixtures("azure_stack"), pytest.mark.slow]
LINES = 12


@pytest.fixture
async def azure(azure_stack: str) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    async with azure_stack_backend("cmrdz") as made:
        yield made


async def test_the_api_on_azurite(azure: tuple[Backend, AwsSettings], tmp_path: Path) -> None:
    be, settings = azure
    src = lines_file(tmp_path, LINES)
    result = await run_on(be, SLOW, str(src), str(tmp_path / "out"), workers=1, aws=settings)
    store = Store(BackendName.azure, settings).url
    with dashboard(store) as url:
        _, listed = await asyncio.to_thread(get, url + "api/jobs")
        (row,) = listed["jobs"]
        assert row["job"] == result.job_id and row["state"] == "succeeded"
        assert row["records_in"] == LINES
        _, doc = await asyncio.to_thread(get, f"{url}api/jobs/{result.job_id}")
        assert doc["counters"] == {"seen": {"lines": LINES}}
        committed = {(a["kind"], a["task"]) for a in doc["steps"][0]["attempts"]}
        assert ("map", 0) in committed and ("reduce", 0) in committed
        _, seen = await asyncio.to_thread(get, url + "api/workers")
        workers = {a["worker"] for a in doc["steps"][0]["attempts"]}
        assert workers <= {w["worker"] for w in seen["workers"]}
