"""``file://`` URLs and the local paths they name: the one mapping between them.

A local input, a local output directory and the embedded backend's blobs are all named by
``file://`` URLs in plans, records and blob calls. Each reader of such a URL (the blob store
over local files, the checks of a record's places, a map task reading a local file itself)
must decode it alike, or "%2e%2e" or a non-UTF-8 name would mean one file to one of them and
another to the next; so they all decode it here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import unquote, urlparse

from cmr.errors import UsageError


@functools.lru_cache(maxsize=4096)
def file_path(url: str) -> Path:
    """The local path of a ``file://`` URL (plain paths are accepted too). Cached: a map
    task over many small files asks for each several times, and parsing costs ~10 µs."""
    if url.startswith("file://"):
        # surrogateescape: a file name that is not UTF-8 round-trips to the same bytes.
        return Path(unquote(urlparse(url).path, errors="surrogateescape"))
    if "://" in url:
        raise UsageError(f"{url!r}: the embedded backend stores blobs in local files (file://)")
    return Path(url)


def file_url(path: str | Path) -> str:
    """The ``file://`` URL of a local path (made absolute)."""
    return Path(path).absolute().as_uri()
