"""The ``backend`` fixture: every conformance test runs once per implementation."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cmr.backends.aws import open_aws
from cmr.backends.base import Backend
from cmr.backends.embedded import embedded_backend
from cmr.settings import AwsSettings
from tests.stack import remove_test_resources, stack_up


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
        on_stack = params is not None and params.params.get("backend_name") == "aws"
        if on_stack and getattr(item, "originalname", "") in SLOW_ON_THE_STACK:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["embedded", "aws"])
def backend_name(request: pytest.FixtureRequest) -> str:
    if request.param == "aws":
        request.getfixturevalue("aws_stack")
    return str(request.param)


@pytest.fixture
async def backend(backend_name: str, tmp_path: Path, aws_names: AwsNames) -> AsyncIterator[Backend]:
    if backend_name == "embedded":
        yield embedded_backend(tmp_path / "scratch")
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
