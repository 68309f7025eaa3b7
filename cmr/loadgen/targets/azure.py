"""The Azure targets' common client: one pooled aiohttp session per target, calls translated.

The account, its endpoints and its key come only from ``AZURE_STORAGE_CONNECTION_STRING``
(:func:`cmr.backends.azure.clients.connection_string`): Azurite is Azure with other
endpoints in that string, never a code path of its own. SDK retries follow
``LoadTask.retries``: ``off`` is one attempt; ``standard`` is the storage SDKs' exponential
retry as cmr's Azure backend bounds it (:data:`cmr.backends.azure.clients.RETRY`);
``adaptive`` is the same, for Azure's SDKs have no client-side rate limiting. The storage
SDKs report no retry count: every request a call sends is counted by the client's request
hook (after the SDK's retry policy), and a call's retries are its requests beyond those it
meant to send.

Errors are read by cmr's one reading of Azure's (:mod:`cmr.backends.azure.errors`), as
the AWS targets read botocore's through :mod:`cmr.backends.aws.errors`; the jam report's
classes are then: a failed If-Match / If-None-Match (412) ``conditional_failed``; 503
ServerBusy and 500 OperationTimedOut (Azure's "slow down") ``throttled``; any other 5xx
``unavailable``; a connect or read timeout ``timeout``; anything else ``other``.

The SDKs come with the ``azure`` extra: without it a target is refused with one line
naming the extra (:func:`need_sdk`), never a bare ImportError in a map task.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections import Counter
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, ClassVar

from cmr.errors import UsageError
from cmr.loadgen.spec import Retries
from cmr.loadgen.targets.base import ClientTarget, ErrorClass, OpFailed, error_class

INSTALL = "pip install 'cmr[azure]'"
SDKS = {"azure-table": "azure.data.tables", "azure-blob": "azure.storage.blob"}
DISTRIBUTIONS = {
    "azure.data.tables": "azure-data-tables",
    "azure.storage.blob": "azure-storage-blob",
}

# The requests the current call has sent: set around each call, read by the client's hook.
# Each operator of the driver is a task of its own, so concurrent calls never share one.
_SENT: ContextVar[list[int] | None] = ContextVar("cmr_loadgen_azure_sent", default=None)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (azure) is not there at all
        return False


def missing_sdk(target: str) -> str | None:
    """One line saying that ``target`` needs the azure extra, when its SDK is missing."""
    module = SDKS.get(target)
    if module is None or _installed(module):
        return None
    return (
        f"target {target} needs the azure extra ({DISTRIBUTIONS[module]} is not installed): "
        f"{INSTALL}"
    )


def need_sdk(target: str) -> None:
    said = missing_sdk(target)
    if said:
        raise UsageError(said)


def retry_options(retries: Retries) -> dict[str, Any]:
    """The storage SDK's retry settings for a task's retry choice."""
    from cmr.backends.azure.clients import RETRY

    if retries == "off":
        return {"retry_total": 0}
    return {k: v for k, v in RETRY.items() if k not in ("connection_timeout", "read_timeout")}


def failed(
    service: str, exc: BaseException, retries: int, kind: ErrorClass | None = None
) -> OpFailed:
    """An azure-core failure as the driver's OpFailed."""
    from cmr.backends.azure.errors import error_code

    return OpFailed(
        kind or error_class(service, exc),
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        retries,
        service=service,
        code=error_code(exc),
    )


class AzureTarget(ClientTarget):
    """One service client for the life of the target, on a session of its own whose pool
    holds a connection per concurrent operator (aiohttp's default, 100, would queue more)."""

    service: ClassVar[str]  # cmr's name for it in errors and counts: "table", "blob"
    consistent_reads = False  # Azure storage reads are always strong: one kind of read
    conditional_writes = True

    def __init__(self, resources: Mapping[str, str], **options: Any) -> None:
        super().__init__(resources, **options)
        self.calls: Counter[str] = Counter()  # requests sent, by Azure's operation name
        self._session: Any = None

    def _open(self, conn: str, options: dict[str, Any]) -> Any:
        """The service client of the connection string, with these pipeline options."""
        raise NotImplementedError

    async def setup(self) -> None:
        import aiohttp
        from azure.core.pipeline.transport import AioHttpTransport

        from cmr.backends.azure.clients import Counting, connection_string

        conn = connection_string()  # before the session: an unset setting leaves nothing open
        counting = Counting(self.service, self.calls)

        def hook(request: Any) -> None:
            counting(request)
            sent = _SENT.get()
            if sent is not None:
                sent[0] += 1

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connections),
            auto_decompress=False,  # as azure-core's own session: the SDK decodes bodies
            trust_env=True,
        )
        transport = AioHttpTransport(
            session=self._session,
            session_owner=False,
            connection_timeout=self._timeouts[0],
            read_timeout=self._timeouts[1],
        )
        options = {"transport": transport, "raw_request_hook": hook}
        try:
            self._client = self._open(conn, {**options, **retry_options(self._retries)})
        except ValueError as exc:  # the SDK's word for a connection string it cannot read
            await self.close()
            raise UsageError(f"cannot open an Azure {self.service} client: {exc}") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @contextlib.contextmanager
    def _sending(self) -> Iterator[list[int]]:
        """Count the requests of the calls made inside (``[n]``)."""
        sent = [0]
        token = _SENT.set(sent)
        try:
            yield sent
        finally:
            _SENT.reset(token)
