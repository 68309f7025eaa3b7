"""The protocols on Azure Storage (issue 29), one module per concern:

errors    the one reading of azure-core failures into :mod:`cmr.errors`
clients   AZURE_STORAGE_CONNECTION_STRING, the SDK's bounded retries, request counting
blobs     the blob protocol on Blob storage (``azure://ACCOUNT/CONTAINER/KEY`` URLs)
queues    the queue protocol on Queue storage
table     the table protocol on Table storage, with transactions across partitions

Clients are made from Azure's standard setting alone: Azurite (the local stack) is Azure
with other endpoints in the connection string, never a code path of its own. Names load
on first use (PEP 562): the Azure SDKs come with the protocols, never with the package
alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cmr.backends.azure.blobs import AzureBlobs
    from cmr.backends.azure.errors import classify, translate, translated
    from cmr.backends.azure.queues import AzureQueues
    from cmr.backends.azure.table import AzureTable

_WHERE = {
    "AzureBlobs": ("cmr.backends.azure.blobs", "AzureBlobs"),
    "AzureQueues": ("cmr.backends.azure.queues", "AzureQueues"),
    "AzureTable": ("cmr.backends.azure.table", "AzureTable"),
    "classify": ("cmr.backends.azure.errors", "classify"),
    "translate": ("cmr.backends.azure.errors", "translate"),
    "translated": ("cmr.backends.azure.errors", "translated"),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _WHERE[name]
    return getattr(importlib.import_module(module), attr)


__all__ = ["AzureBlobs", "AzureQueues", "AzureTable", "classify", "translate", "translated"]
