"""URLs of a cloud store's blobs: ``s3://BUCKET/KEY`` and ``azure://ACCOUNT/CONTAINER/KEY``.

Where the engine asks of a store URL what it asks of a local path (which directory holds
it, whether one lies inside another), both schemes answer alike: the *root* (the bucket,
or an account's container) is the drive, the key below it the path, "a prefix is a
directory" as the input listing has it.
"""

from __future__ import annotations

from pathlib import Path

SCHEMES = ("s3://", "azure://")


def is_store_url(url: str) -> bool:
    return url.startswith(SCHEMES)


def split(url: str) -> tuple[str, str]:
    """(root, key) of a store URL: ``("s3://b", "a/b")``, ``("azure://acct/c", "a/b")``."""
    scheme = next(s for s in SCHEMES if url.startswith(s))
    rest = url.removeprefix(scheme)
    depth = 2 if scheme == "azure://" else 1  # an Azure container is unique in its account
    parts = rest.split("/", depth)
    root = "/".join(parts[:depth])
    key = parts[depth] if len(parts) > depth else ""
    return scheme + root, key


def root_prefix(url: str) -> str:
    """The root of a store URL as a prefix: ``s3://b/``, ``azure://acct/c/``."""
    return split(url)[0] + "/"


def as_path(url: str) -> Path:
    """A store URL as a path (``s3://b/a/b`` -> ``/s3/b/a/b``) for comparing places: one
    inside another, or the same; both schemes apart, so never each other's."""
    scheme = next(s for s in SCHEMES if url.startswith(s))
    return Path("/", scheme.removesuffix("://"), url.removeprefix(scheme).strip("/"))
