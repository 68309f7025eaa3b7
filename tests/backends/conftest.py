"""The ``backend`` fixture: every conformance test runs once per implementation."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.aws import open_aws
from cmr.backends.base import Backend
from cmr.backends.embedded import embedded_backend
from cmr.settings import AwsSettings
from tests.stack import (
    AZURITE_CONNECTION_STRING,
    azurite_up,
    remove_azure_test_resources,
    remove_test_resources,
    stack_up,
)


@dataclass
class AwsNames:
    """Resources of this test session on the stack, unique so that runs never collide."""

    bucket: str
    table: str
    queue_prefix: str
    used: bool = False


@pytest.fixture(scope="session")
def aws_names() -> Iterator[AwsNames]:
    tag = uuid.uuid4().hex[:8]
    names = AwsNames(f"cmr-test-{tag}", f"cmr-test-{tag}", f"cmrt-{tag}-")
    yield names
    if names.used and stack_up():
        remove_test_resources(names.bucket, names.table, names.queue_prefix)


@dataclass
class AzureNames:
    """This session's container and queue prefix on Azurite: the queue prefix is
    aws_names', so that ``unique`` names fall under it on either stack."""

    container: str
    queue_prefix: str
    table: str
    used: bool = False
    created: bool = False
    table_created: bool = False


@pytest.fixture(scope="session")
def azure_names(aws_names: AwsNames) -> Iterator[AzureNames]:
    tag = uuid.uuid4().hex[:8]
    names = AzureNames(f"cmr-test-{tag}", aws_names.queue_prefix, f"cmrtest{tag}")
    yield names
    if names.used and azurite_up():
        remove_azure_test_resources(names.container, names.queue_prefix, names.table)


# On the local stack, these run in the full suite only (marked slow): a matrix of cases, or a
# large object, each seconds there; the everyday subset runs them embedded, and the stack's
# other conformance tests.
SLOW_ON_THE_STACK = {
    "test_condition",
    "test_get_range",
    "test_list_many",
    "test_update_with_only_a_condition",
    "test_item_over_the_size_limit_is_rejected",
    "test_upload_download_multipart",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        on_stack = params is not None and params.params.get("backend_name") in ("aws", "azure")
        if on_stack and getattr(item, "originalname", "") in SLOW_ON_THE_STACK:
            item.add_marker(pytest.mark.slow)


# The conformance suites run on every backend: embedded, the AWS stack, Azure (Azurite).
WITH_AZURE = ["embedded", "aws", "azure"]


def stack_of(request: pytest.FixtureRequest) -> str:
    """The backend a ``backend_name`` param names, its stack made ready (skipped when it is
    down, failed under CI=true)."""
    if request.param == "aws":
        request.getfixturevalue("aws_stack")
    elif request.param == "azure":
        request.getfixturevalue("azure_stack")
    return str(request.param)


@pytest.fixture(params=WITH_AZURE)
def backend_name(request: pytest.FixtureRequest) -> str:
    return stack_of(request)


@pytest.fixture
async def backend(
    backend_name: str, tmp_path: Path, aws_names: AwsNames, request: pytest.FixtureRequest
) -> AsyncIterator[Backend]:
    if backend_name == "embedded":
        yield embedded_backend(tmp_path / "scratch")
        return
    if backend_name == "azure":
        async for b in _azure_backend(request.getfixturevalue("azure_names")):
            yield b
        return
    aws_names.used = True
    settings = AwsSettings(
        bucket=aws_names.bucket, table=aws_names.table, queue_prefix=aws_names.queue_prefix
    )
    async with open_aws(settings) as b:
        yield b


@pytest.fixture
def unique(aws_names: AwsNames) -> Callable[[], str]:
    """Fresh names for queues, blob folders and partition keys, inside this session's prefix."""
    return lambda: f"{aws_names.queue_prefix}{uuid.uuid4().hex[:12]}"


async def _azure_backend(names: AzureNames) -> AsyncIterator[Backend]:
    """Azure's queues, blobs and table on Azurite."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import BlobServiceClient

    from cmr.backends.azure import AzureBlobs, AzureQueues, AzureTable
    from cmr.backends.embedded import EmbeddedBlobs

    names.used = True
    if not names.created:
        async with BlobServiceClient.from_connection_string(AZURITE_CONNECTION_STRING) as svc:
            with contextlib.suppress(ResourceExistsError):
                await svc.create_container(names.container)
        names.created = True
    async with AzureQueues() as queues, AzureBlobs() as blobs, AzureTable(names.table) as table:
        if not names.table_created:
            await table.create()
            names.table_created = True
        yield Backend(
            "azure",
            queues=queues,
            blobs=blobs,
            table=table,
            scratch=blobs.url(names.container, "scratch"),
            local_blobs=EmbeddedBlobs(),
        )


@pytest.fixture
async def tables(azure_names: AzureNames) -> AsyncIterator[Callable[..., Any]]:
    """Clients of this session's Azure table, each a process's own view (as many as asked):
    what tests of the Azure table's own protocol play several processes with."""
    from cmr.backends.azure import AzureTable

    azure_names.used = True
    made: list[AzureTable] = []

    def make(**kwargs: Any) -> AzureTable:
        made.append(AzureTable(azure_names.table, **kwargs))
        return made[-1]

    await make().create()
    yield make
    for t in made:
        await t.close()
