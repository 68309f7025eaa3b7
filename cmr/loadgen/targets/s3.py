"""S3: GetObject / PutObject, every read and write "plain" (S3 is strongly consistent)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cmr.loadgen.targets.aws import _AwsTarget, _need, _s3_config
from cmr.loadgen.targets.base import OpFailed, Reply, _failed, _int, _retries_of


class S3Target(_AwsTarget):
    service = "s3"
    name = "s3"

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.bucket = _need(resources, "bucket", self.name)

    def _extra_config(self) -> dict[str, Any]:
        return _s3_config()

    async def get(self, key: str, consistent: bool = False) -> Reply:
        try:
            got = await self._call("get_object", Bucket=self.bucket, Key=key)
            async with got["Body"] as body:
                data = await body.read()
        except OpFailed as exc:
            # a key nobody wrote yet reads as nothing, as DynamoDB's missing item does
            if exc.code in ("NoSuchKey", "404"):
                return Reply(None, exc.retries)
            raise
        except Exception as exc:
            raise _failed(exc, self.service) from exc
        return Reply(_int(data), _retries_of(got))

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        got = await self._call("put_object", Bucket=self.bucket, Key=key, Body=str(value).encode())
        return Reply(None, _retries_of(got))
