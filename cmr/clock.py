"""The time of cmr's protocol code: the running event loop's.

Leases, polls, give-up times and the dates written into records are all read here, so the
engine and the embedded backend can run on a loop whose time is virtual
(:class:`cmr.virtualtime.VirtualTimeLoop`, which skips the waits where every task sleeps).
On asyncio's own loops nothing changes: ``loop.time()`` is ``time.monotonic()``, and
:func:`wall` is ``time.time()``. Code that means real time (the CLI's progress rates, the
load generator, provisioning AWS) keeps reading the ``time`` module.
"""

from __future__ import annotations

import asyncio
import time

from cmr.virtualtime import VirtualTimeLoop


def monotonic() -> float:
    """Seconds on the running loop's clock (``time.monotonic()`` outside a loop): what
    leases, deadlines and timeouts are measured with, and what ``asyncio.sleep`` waits on."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def wall() -> float:
    """Epoch seconds, for dates stored in records and manifests: ``time.time()``, moved on
    by the time a virtual loop skipped, so a record's dates agree with its loop's leases."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return time.time()
    if isinstance(loop, VirtualTimeLoop):
        return time.time() + loop.skipped_s
    return time.time()
