"""SQS: put = SendMessage, get = ReceiveMessage then DeleteMessage; one queue, keys ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cmr.errors import NotFound
from cmr.loadgen.targets.aws import _AwsTarget, _need
from cmr.loadgen.targets.base import OpFailed, Reply, _int, _retries_of


class SQSTarget(_AwsTarget):
    service = "sqs"
    name = "sqs"

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.queue = _need(resources, "queue", self.name)
        self._url = ""

    async def setup(self) -> None:
        await super().setup()
        try:
            self._url = str((await self._call("get_queue_url", QueueName=self.queue))["QueueUrl"])
        except OpFailed as exc:
            await self.close()
            raise NotFound(f"no SQS queue {self.queue!r}: {exc}") from exc

    async def get(self, key: str, consistent: bool = False) -> Reply:
        got = await self._call(
            "receive_message", QueueUrl=self._url, MaxNumberOfMessages=1, WaitTimeSeconds=0
        )
        retries = _retries_of(got)
        messages = got.get("Messages") or []
        if not messages:
            return Reply(None, retries)
        try:
            deleted = await self._call(
                "delete_message", QueueUrl=self._url, ReceiptHandle=messages[0]["ReceiptHandle"]
            )
        except OpFailed as exc:
            exc.retries += retries
            raise
        return Reply(_int(messages[0]["Body"].encode()), retries + _retries_of(deleted))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        got = await self._call("send_message", QueueUrl=self._url, MessageBody=str(value))
        return Reply(None, _retries_of(got))
