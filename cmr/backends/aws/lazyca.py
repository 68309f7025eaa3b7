"""aiohttp, imported without reading the system's CA bundle twice.

When it is imported, aiohttp builds two TLS contexts for connections that are given none
of their own (``ssl=True`` and ``ssl=False``), and each reads the system's CA bundle: ~90 ms
of CPU apiece, measured here, in every process that imports aioboto3. That was a sixth of
an idle ``cmr worker``'s start on the local stack, and the suite starts hundreds of aws
processes. cmr's own connections never use those two contexts: a client of an ``https://``
endpoint is given a context of its own (:class:`cmr.backends.aws.sessions.SharedTLS`, or
aiobotocore's), and a client of an ``http://`` endpoint makes no TLS connection.

So those two read the bundle just before they first make a connection (anyone else's code
in the process may still use them), not at import. The patch lasts only while aiohttp's
module runs. A context another thread asks for the bundle in that window gets it the same
way; one that connected within the window would have had none, and trusted nothing (it
fails closed, never open).
"""

from __future__ import annotations

import ssl
import sys
import threading
from typing import Any


class _CAsOnFirstUse(ssl.SSLContext):
    """An SSLContext whose default CA paths are read just before its first connection."""

    _lock = threading.Lock()

    def _load(self) -> None:
        with self._lock:
            if not self.__dict__.get("_cmr_cas_read"):
                ssl.SSLContext.set_default_verify_paths(self)
                self.__dict__["_cmr_cas_read"] = True

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self._load()
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self._load()
        return super().wrap_socket(*args, **kwargs)


def import_aiohttp() -> None:
    """Import aiohttp (once per process) with its default contexts' CA bundle read lazily."""
    if "aiohttp" in sys.modules:
        return
    asked: list[ssl.SSLContext] = []

    def later(self: ssl.SSLContext) -> None:
        asked.append(self)

    real = ssl.SSLContext.set_default_verify_paths  # inherited, or someone's override
    own = vars(ssl.SSLContext).get("set_default_verify_paths")  # an override to put back
    ssl.SSLContext.set_default_verify_paths = later  # type: ignore[method-assign]
    try:
        import aiohttp  # noqa: F401  # what this module is for
    finally:
        if own is None:
            del ssl.SSLContext.set_default_verify_paths  # the inherited one shows again
        else:
            ssl.SSLContext.set_default_verify_paths = own  # type: ignore[method-assign]
    for context in asked:
        if type(context) is ssl.SSLContext:
            context.__class__ = _CAsOnFirstUse
        else:  # a subclass of someone else's: read now, as asked
            real(context)


import_aiohttp()
