"""Azure Blob storage: get = Get Blob (a download), put = Put Blob (an overwriting upload).

Blob reads are always strong, so "consistent" and eventual reads are the same call and are
reported as "plain", as s3's are. Blobs are named by the load's keys as they are (under
the run's prefix); a value is its decimal text. Conditions are the ETag's, in one request:

- ``"absent"``: ``If-None-Match`` an ETag no blob ever has (``"cmr-never"``), the blob
  counterpart of seed 000's fictitious attribute: the service evaluates a precondition
  that always holds, so concurrent writers never fail each other.
- ``"version"``: ``If-Match`` the ETag this target last saw for the key (read or written),
  ``If-None-Match: *`` (create only) when it has seen none. A failure (412 ConditionNotMet,
  409 BlobAlreadyExists) is followed by Get Blob Properties, which refreshes the ETag as
  DynamoDB's failure returns the item: that request is part of the failed put's latency.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.blob.aio import ContainerClient

from cmr.backends.azure.errors import BLOB_MISSING, error_code
from cmr.loadgen.targets.aws import _need
from cmr.loadgen.targets.azure import AzureTarget, failed
from cmr.loadgen.targets.base import Condition, Reply, _int, error_class

NEVER_ETAG = '"cmr-never"'  # Azure's ETags are "0x..." hex: this one matches no blob


class AzureBlobTarget(AzureTarget):
    service = "blob"
    name = "azure-blob"

    def __init__(
        self, resources: Mapping[str, str], *, condition: Condition = "absent", **options: Any
    ) -> None:
        super().__init__(resources, **options)
        self.container = _need(resources, "container", self.name)
        self.condition: Condition = condition
        self._etags: dict[str, str] = {}  # the ETag this target last saw per key

    def _open(self, conn: str, options: dict[str, Any]) -> ContainerClient:
        return ContainerClient.from_connection_string(conn, self.container, **options)

    async def get(self, key: str, consistent: bool = False) -> Reply:
        with self._sending() as sent:
            try:
                download = await self._client.download_blob(key)
                data = await download.readall()
            except ResourceNotFoundError as exc:
                if error_code(exc) not in BLOB_MISSING:  # the container is gone: a failure
                    raise failed(self.service, exc, sent[0] - 1) from exc
                # a key nobody wrote yet reads as nothing, as DynamoDB's missing item does
                self._etags.pop(key, None)
                return Reply(None, sent[0] - 1)
            except AzureError as exc:
                raise failed(self.service, exc, sent[0] - 1) from exc
        self._etags[key] = download.properties.etag
        return Reply(_int(data), sent[0] - 1)

    def _condition(self, key: str) -> dict[str, Any]:
        if self.condition == "absent":
            return {"etag": NEVER_ETAG, "match_condition": MatchConditions.IfModified}
        seen = self._etags.get(key)
        if seen is None:
            return {"match_condition": MatchConditions.IfMissing}
        return {"etag": seen, "match_condition": MatchConditions.IfNotModified}

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        condition = self._condition(key) if conditional else {}
        with self._sending() as sent:
            try:
                # the blob's client, not the container's: its answer carries the new ETag
                got = await self._client.get_blob_client(key).upload_blob(
                    str(value).encode(), overwrite=True, **condition
                )
            except AzureError as exc:
                kind = error_class(self.service, exc)
                if kind == "conditional_failed":
                    await self._refresh(key)
                    raise failed(self.service, exc, max(0, sent[0] - 2), kind) from exc
                raise failed(self.service, exc, sent[0] - 1, kind) from exc
        self._etags[key] = got["etag"]
        return Reply(None, sent[0] - 1)

    async def _refresh(self, key: str) -> None:
        """Learn the key's current ETag after a lost condition (best effort)."""
        try:
            props = await self._client.get_blob_client(key).get_blob_properties()
        except AzureError:
            self._etags.pop(key, None)
            return
        self._etags[key] = props.etag
