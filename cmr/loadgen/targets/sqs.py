"""SQS: put = SendMessage, get = ReceiveMessage then DeleteMessage; one queue, keys ignored.

With a run id (``resources["run"]``, which ``prepare`` always sets) every message sent
carries it as the ``cmr-loadgen-run`` attribute, and a received message without it is not
the run's: it is released at once (visibility 0), never deleted, and the get reads nothing.
A queue the user named may hold messages of others; the load must not consume them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cmr.errors import NotFound
from cmr.loadgen.targets.aws import _AwsTarget, _need
from cmr.loadgen.targets.base import OpFailed, Reply, _int, _retries_of
from cmr.loadgen.targets.resources import MARKER, run_of


class SQSTarget(_AwsTarget):
    service = "sqs"
    name = "sqs"

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.queue = _need(resources, "queue", self.name)
        self.run = resources.get("run")
        self._url = ""

    async def setup(self) -> None:
        await super().setup()
        try:
            self._url = str((await self._call("get_queue_url", QueueName=self.queue))["QueueUrl"])
        except OpFailed as exc:
            await self.close()
            raise NotFound(f"no SQS queue {self.queue!r}: {exc}") from exc

    async def get(self, key: str, consistent: bool = False) -> Reply:
        marked: dict[str, Any] = {"MessageAttributeNames": [MARKER]} if self.run else {}
        got = await self._call(
            "receive_message",
            QueueUrl=self._url,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=0,
            **marked,
        )
        retries = _retries_of(got)
        messages = got.get("Messages") or []
        if not messages:
            return Reply(None, retries)
        message = messages[0]
        ours = not self.run or run_of(message) == self.run
        try:
            if ours:
                done = await self._call(
                    "delete_message", QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"]
                )
            else:
                done = await self._call(
                    "change_message_visibility",
                    QueueUrl=self._url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=0,
                )
        except OpFailed as exc:
            exc.retries += retries
            raise
        value = _int(message["Body"].encode()) if ours else None
        return Reply(value, retries + _retries_of(done))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        marked: dict[str, Any] = {}
        if self.run:
            marked["MessageAttributes"] = {MARKER: {"DataType": "String", "StringValue": self.run}}
        got = await self._call("send_message", QueueUrl=self._url, MessageBody=str(value), **marked)
        return Reply(None, _retries_of(got))
