"""The protocols on SQS, S3 and DynamoDB through aioboto3, one module per concern:

errors        the one reading of botocore failures (also used by ``cmr fleet`` and the loadgen)
calls         what the clients share: request counting, concurrent calls
owner         ExpectedBucketOwner on every S3 request (the store's owner=, the fleet's account)
sqs, s3, dynamodb   the queue, blob and table protocols
provisioning  ``open_aws``: clients, a fast probe, the bucket and table made if missing

Every botocore failure is translated into :mod:`cmr.errors` by
:func:`cmr.backends.aws.errors.translate`. Importing this package loads aioboto3; callers on
the embedded backend import it only when the aws backend is asked for.
"""

from __future__ import annotations

from cmr.backends.aws.dynamodb import AwsTable
from cmr.backends.aws.errors import classify, translate, translated
from cmr.backends.aws.provisioning import open_aws
from cmr.backends.aws.s3 import AwsBlobs
from cmr.backends.aws.sqs import AwsQueues

# The name tests and older callers know.
_translated = translated

__all__ = [
    "AwsBlobs",
    "AwsQueues",
    "AwsTable",
    "classify",
    "open_aws",
    "translate",
    "translated",
]
