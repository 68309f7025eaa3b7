"""ExpectedBucketOwner on every S3 request of a client: S3 answers 403 to a request whose
bucket another account owns, so a bucket name that a stranger took (or re-created after ours
was deleted) is never read or written.

One botocore hook per client, for the aws backend's aioboto3 clients and ``cmr fleet``'s boto3
ones alike: every operation whose input has the parameter gets it, whoever calls it
(s3transfer's managed downloads included), so no call site can forget it.
"""

from __future__ import annotations

from typing import Any

# What S3 answers when ExpectedBucketOwner does not match (or the bucket is not readable).
DENIED_CODES = {"403", "AccessDenied"}


def expect_owner(client: Any, account: str | None) -> None:
    """Send ``account`` as ExpectedBucketOwner (and ExpectedSourceBucketOwner on copies) on
    every request of ``client``; None leaves the client as it is."""
    if not account:
        return

    def add(params: dict[str, Any], model: Any, **_kwargs: Any) -> None:
        members = model.input_shape.members if model.input_shape is not None else {}
        for name in ("ExpectedBucketOwner", "ExpectedSourceBucketOwner"):
            if name in members:
                params.setdefault(name, account)

    client.meta.events.register("before-parameter-build.s3", add)


def not_owned(bucket: str, account: str) -> str:
    """The message for a bucket S3 refused under ExpectedBucketOwner."""
    return (
        f"bucket {bucket} is not owned by account {account} (S3 refused it under "
        f"ExpectedBucketOwner={account}), or these credentials may not read it: check the "
        "bucket name and the store's owner= (the account that created the bucket)"
    )
