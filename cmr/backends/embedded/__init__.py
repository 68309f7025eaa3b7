"""In-process queues, table and a local-directory blob store.

The default backend of ``cmr run``: no network, no services, yet the semantics the engine
relies on are modelled, not idealised: at-least-once delivery with visibility timeouts and
per-delivery receipts (a stale receipt deletes nothing, as SQS allows), message size limits,
atomic conditional writes, and blobs that are plain files.

All state lives on instances; one backend (``embedded_backend``) is shared by the client and
the in-process workers of a run. Requests are counted as AWS would bill them by the
:class:`~cmr.backends.middleware.Counting` middleware the factory puts around the services.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from cmr.backends.base import EMBEDDED, Backend
from cmr.backends.embedded.blobs import (
    INLINE_READ_BYTES,
    EmbeddedBlobs,
    _into_dir,
    prefix_path,
)
from cmr.backends.embedded.queues import MAX_MESSAGE_BYTES, SQS_BODY_LIMIT, Clock, EmbeddedQueues
from cmr.backends.embedded.table import (
    MAX_ITEM_BYTES,
    TOKENS_KEPT,
    EmbeddedTable,
    holds,
    item_bytes,
)
from cmr.backends.middleware import Counting, wrap
from cmr.fileurls import file_url

__all__ = [
    "INLINE_READ_BYTES",
    "MAX_ITEM_BYTES",
    "MAX_MESSAGE_BYTES",
    "SQS_BODY_LIMIT",
    "TOKENS_KEPT",
    "Clock",
    "EmbeddedBlobs",
    "EmbeddedQueues",
    "EmbeddedTable",
    "_into_dir",
    "embedded_backend",
    "holds",
    "item_bytes",
    "prefix_path",
    "temporary_backend",
]


def embedded_backend(
    scratch: str | Path,
    *,
    queues: EmbeddedQueues | None = None,
    table: EmbeddedTable | None = None,
) -> Backend:
    """The embedded backend with its scratch data under the directory ``scratch``, its
    requests counted. Pass ``queues`` or ``table`` to keep a handle on them (a test's clock)."""
    services = Backend(
        "embedded",
        queues if queues is not None else EmbeddedQueues(),
        EmbeddedBlobs(),
        table if table is not None else EmbeddedTable(),
        file_url(scratch),
        capabilities=EMBEDDED,
        local_blobs=EmbeddedBlobs(),  # its own: the client's look at a local output is no request
    )
    return wrap(services, Counting())


@contextlib.asynccontextmanager
async def temporary_backend(prefix: str = "cmr-scratch-") -> AsyncIterator[Backend]:
    """An embedded backend whose scratch directory is made now and removed on exit."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    try:
        yield embedded_backend(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
