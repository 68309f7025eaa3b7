"""The AWS targets' common client: one aioboto3 client per target, calls translated.

Endpoints and credentials come only from the standard AWS settings (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_<SERVICE>``, ``AWS_PROFILE``, ...). botocore names SimpleDB's variable
``AWS_ENDPOINT_URL_SIMPLEDB``; ``AWS_ENDPOINT_URL_SDB`` is accepted as an alias.
SDK retries follow ``LoadTask.retries``: ``off`` is one attempt, ``standard``/``adaptive`` are
botocore's modes, and the attempts botocore added (``ResponseMetadata.RetryAttempts``) are
reported with each reply or failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from cmr.errors import UsageError
from cmr.loadgen.spec import Retries
from cmr.loadgen.targets.base import ClientTarget, Condition, _failed


def retry_config(retries: Retries) -> dict[str, Any]:
    """botocore's ``retries`` setting for a task's retry choice."""
    if retries == "off":
        return {"mode": "standard", "total_max_attempts": 1}
    return {"mode": retries}


def _endpoint(service: str) -> str | None:
    """An explicit endpoint only for the SDB alias; botocore reads every other variable."""
    if service == "sdb" and not os.environ.get("AWS_ENDPOINT_URL_SIMPLEDB"):
        return os.environ.get("AWS_ENDPOINT_URL_SDB") or None
    return None


def _need(resources: Mapping[str, str], name: str, target: str) -> str:
    value = resources.get(name)
    if not value:
        raise UsageError(f"target {target} needs resources[{name!r}]: run prepare() first")
    return value


class _AwsTarget(ClientTarget):
    """One aioboto3 client for the life of the target; calls translated by ``_call``."""

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self._stack = AsyncExitStack()

    def _extra_config(self) -> dict[str, Any]:
        return {}

    async def setup(self) -> None:
        from cmr.backends.aws import sessions

        session = sessions.session(region=self.resources.get("region") or None)
        config = sessions.config(
            retries=retry_config(self._retries),
            connect_timeout=self._timeouts[0],
            read_timeout=self._timeouts[1],
            # one pooled connection per concurrent operator, or requests queue in the client
            max_pool_connections=self._connections,
            **self._extra_config(),
        )
        try:
            self._client = await self._stack.enter_async_context(
                session.client(
                    self.service,
                    region_name=session.region_name or "us-east-1",
                    config=config,
                    endpoint_url=_endpoint(self.service),
                )
            )
        except Exception as exc:
            raise UsageError(f"cannot open a {self.service} client: {exc}") from exc

    async def close(self) -> None:
        await self._stack.aclose()

    async def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response: dict[str, Any] = await getattr(self._client, op)(**kwargs)
        except Exception as exc:
            raise _failed(exc, self.service) from exc
        return response


class KeyedTarget(_AwsTarget):
    """The AWS key-value targets (DynamoDB, SimpleDB): strong reads, conditional writes, and
    the version this target last saw per key, which a ``version`` condition names."""

    resource: ClassVar[str]  # what holds the keys: "table", "domain"
    consistent_reads = True
    conditional_writes = True

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.store = _need(resources, self.resource, self.name)  # the table's or domain's name
        self.condition: Condition = condition
        self._versions: dict[str, int] = {}  # the version this target last saw per key


def _s3_config() -> dict[str, Any]:
    if os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"):
        # a local endpoint cannot route virtual-hosted bucket names on a plain host:port
        return {"s3": {"addressing_style": "path"}}
    return {}
