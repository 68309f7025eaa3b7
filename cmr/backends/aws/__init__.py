"""The protocols on SQS, S3 and DynamoDB through aioboto3, one module per concern:

errors        the one reading of botocore failures (also used by ``cmr fleet`` and the loadgen)
calls         what the clients share: request counting, concurrent calls
sessions      one model loader and one TLS context per process, shared by every client
owner         ExpectedBucketOwner on every S3 request (the store's owner=, the fleet's account)
sqs, s3, dynamodb   the queue, blob and table protocols
reach         down or slow: the configured endpoints, by socket, before botocore loads
provisioning  ``open_aws``: clients, a fast probe, the bucket and table made if missing

Every botocore failure is translated into :mod:`cmr.errors` by
:func:`cmr.backends.aws.errors.translate`. Names load on first use (PEP 562): aioboto3
comes with the protocols or ``open_aws``'s clients, never with ``errors`` alone, and an
endpoint with nothing listening is reported before it is loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cmr.backends.aws.dynamodb import AwsTable
    from cmr.backends.aws.errors import classify, translate, translated
    from cmr.backends.aws.provisioning import open_aws
    from cmr.backends.aws.s3 import AwsBlobs
    from cmr.backends.aws.sqs import AwsQueues

    _translated = translated  # the name tests and older callers know

_WHERE = {
    "AwsBlobs": ("cmr.backends.aws.s3", "AwsBlobs"),
    "AwsQueues": ("cmr.backends.aws.sqs", "AwsQueues"),
    "AwsTable": ("cmr.backends.aws.dynamodb", "AwsTable"),
    "classify": ("cmr.backends.aws.errors", "classify"),
    "open_aws": ("cmr.backends.aws.provisioning", "open_aws"),
    "translate": ("cmr.backends.aws.errors", "translate"),
    "translated": ("cmr.backends.aws.errors", "translated"),
    "_translated": ("cmr.backends.aws.errors", "translated"),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _WHERE[name]
    return getattr(importlib.import_module(module), attr)


__all__ = [
    "AwsBlobs",
    "AwsQueues",
    "AwsTable",
    "classify",
    "open_aws",
    "translate",
    "translated",
]
