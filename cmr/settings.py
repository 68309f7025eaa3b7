"""Settings: built once (by the CLI or ``cmr.run``) and passed down; no globals.

The defaults of where cmr keeps things on AWS live here, in ``AwsSettings``, and nowhere
else: the CLI's help and the store URL refer to these fields.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, get_args, get_type_hints
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from cmr.errors import UsageError

MIN_MESSAGE_BYTES = 1024


def default_cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


class BackendName(StrEnum):
    embedded = "embedded"  # in-process: lives and dies with `cmr run`
    aws = "aws"  # SQS, S3 and DynamoDB (or the local stack)
    azure = "azure"  # Azure Queue, Blob and Table storage (or the local stack's Azurite)


class LineEnds(StrEnum):
    """What ends an input line (a job's ``lines``, ``cmr run --lines``)."""

    lf = "lf"  # \n only: a \r before it stays in the line
    universal = "universal"  # \r\n and a lone \r end lines too: Windows (and old Mac) text


class ShuffleMode(StrEnum):
    """How map output reaches the reducers (``cmr run --shuffle``; cmr.bulk)."""

    auto = "auto"  # the blob store for a large input on a billed store (cmr.bulk.AUTO_BLOB_BYTES)
    queue = "queue"  # tagged batches in one queue per partition
    blob = "blob"  # one object per map attempt, named by its commit record


@dataclass(frozen=True)
class AwsSettings:
    """Where a cloud backend keeps things. Endpoints and credentials are never here: they
    come from the cloud's standard settings (AWS_ENDPOINT_URL*, AWS_PROFILE, AWS_REGION ...;
    AZURE_STORAGE_CONNECTION_STRING). On Azure, ``bucket`` is the blob container,
    ``account`` the storage account (checked against the connection string's), and
    ``region``, ``profile`` and ``owner`` have no meaning."""

    bucket: str = "cmr-data"
    table: str = "cmr"
    queue_prefix: str = "cmr-"
    region: str | None = None
    profile: str | None = None
    retries: str = "standard"  # botocore retry mode: legacy | standard | adaptive
    max_attempts: int = 6
    create: bool = True  # create the bucket and table when missing
    # The account that must own every bucket cmr touches: S3 refuses a request whose bucket
    # another account owns (ExpectedBucketOwner), so a bucket name taken by a stranger is
    # never read or written. None: not checked (local endpoints; the fleet always sets it).
    owner: str | None = None
    account: str | None = None  # Azure's storage account (the store URL's host)

    def __post_init__(self) -> None:
        if self.owner is not None and not _ACCOUNT.fullmatch(self.owner):
            raise UsageError(
                f"owner {self.owner!r} is not an AWS account id: give the 12 digits of the "
                "account that owns the bucket"
            )


_ACCOUNT = re.compile(r"[0-9]{12}")
# The store URL's query keys, each an AwsSettings field.
_STORE_QUERY = {
    "prefix": "queue_prefix",
    "region": "region",
    "profile": "profile",
    "owner": "owner",
}


_AZURE_QUERY = {"prefix": "queue_prefix"}
_AZURE_NAMES = {
    # Azure's naming rules (a wrong name is refused by the service with a 400 that names
    # no rule): containers and queues 3-63 of a-z 0-9 and single hyphens, starting with a
    # letter or digit; tables 3-63 letters and digits, starting with a letter.
    "container": re.compile(r"(?=.{3,63}\Z)[a-z0-9]+(-[a-z0-9]+)*"),
    "table": re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}"),
    "prefix": re.compile(r"([a-z0-9]+-?)*"),
}
AZURE_PREFIX_MAX = 20  # 63 - len("<32-char job id>-s12-p00000")
_AZURE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
AZURE_STORE = "azure://ACCOUNT/CONTAINER/TABLE?prefix=P"


def _check_azure(text: str, settings: AwsSettings) -> None:
    """The names of an Azure store, as Azure's rules allow them."""
    named = {
        "container": settings.bucket,
        "table": settings.table,
        "prefix": settings.queue_prefix,
    }
    for what, value in named.items():
        if not _AZURE_NAMES[what].fullmatch(value):
            raise UsageError(
                f"store {text!r}: {what} {value!r} is not a name Azure allows ("
                + {
                    "container": "3-63 lowercase letters, digits and single hyphens",
                    "table": "3-63 letters and digits, starting with a letter",
                    "prefix": "lowercase letters, digits and single hyphens",
                }[what]
                + ")"
            )
    if len(settings.queue_prefix) > AZURE_PREFIX_MAX:
        raise UsageError(
            f"store {text!r}: prefix {settings.queue_prefix!r} is longer than "
            f"{AZURE_PREFIX_MAX} characters (an Azure queue name holds 63, and a job's "
            "queue names add up to 43 to it)"
        )
    if settings.account is not None and not _AZURE_ACCOUNT.fullmatch(settings.account):
        raise UsageError(
            f"store {text!r}: account {settings.account!r} is not an Azure storage account "
            "name (3-24 lowercase letters and digits)"
        )


def _query_parts(
    text: str, query: str, names: dict[str, str], known: str, parts: dict[str, Any]
) -> None:
    """A store URL's query into ``parts`` (AwsSettings fields, by ``names``): each key known,
    given once, not empty."""
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in names:
            raise UsageError(f"store {text!r}: unknown setting {key!r}; {known}")
        if names[key] in parts:
            raise UsageError(f"store {text!r}: {key} is given twice")
        if not value:
            raise UsageError(f"store {text!r}: {key} is empty (leave it out for the default)")
        parts[names[key]] = value


def _parse_azure(text: str) -> Store:
    url = urlsplit("azure://" if text == BackendName.azure else text)
    parts: dict[str, Any] = {}
    if url.netloc:
        parts["account"] = unquote(url.netloc)
    path = [unquote(p) for p in url.path.strip("/").split("/") if p]
    if len(path) > 2:
        raise UsageError(f"store {text!r}: use {AZURE_STORE} (no more parts after TABLE)")
    for name, value in zip(("bucket", "table"), path, strict=False):
        parts[name] = value
    known = (
        f"known on Azure: {', '.join(_AZURE_QUERY)} (credentials and endpoints come from "
        "AZURE_STORAGE_CONNECTION_STRING)"
    )
    _query_parts(text, url.query, _AZURE_QUERY, known, parts)
    settings = AwsSettings(**parts)
    _check_azure(text, settings)
    return Store(BackendName.azure, settings)


@dataclass(frozen=True)
class Store:
    """Which backend, and (for a cloud) where in it: one value, written as a URL.

    ``embedded``, ``aws://BUCKET/TABLE?prefix=P&region=R&profile=N`` or
    ``azure://ACCOUNT/CONTAINER/TABLE?prefix=P``, where every part may be left out
    (``aws``, ``aws://BUCKET``, ``azure``) to take AwsSettings' default (on Azure, the
    account is then the connection string's)."""

    backend: BackendName = BackendName.embedded
    aws: AwsSettings = AwsSettings()

    @staticmethod
    def parse(text: str) -> Store:
        text = text.strip()
        if text == BackendName.embedded:
            return Store(BackendName.embedded)
        if text == BackendName.azure or text.startswith("azure://"):
            return _parse_azure(text)
        if text != BackendName.aws and not text.startswith("aws://"):
            raise UsageError(
                f"store {text!r}: use embedded, aws://BUCKET/TABLE?prefix=P&region=R&profile=N "
                f"or {AZURE_STORE}"
            )
        url = urlsplit("aws://" if text == BackendName.aws else text)
        parts: dict[str, Any] = {}
        if url.netloc:
            parts["bucket"] = unquote(url.netloc)
        if url.path.strip("/"):
            parts["table"] = unquote(url.path.strip("/"))
        known = f"known: {', '.join(_STORE_QUERY)}"
        _query_parts(text, url.query, _STORE_QUERY, known, parts)
        return Store(BackendName.aws, AwsSettings(**parts))

    @property
    def url(self) -> str:
        """The URL ``parse`` reads back into this store (``create`` and the SDK's retry
        settings are not part of it)."""
        if self.backend == BackendName.embedded:
            return "embedded"
        a = self.aws
        if self.backend == BackendName.azure:
            prefix = urlencode({"prefix": a.queue_prefix})
            return f"azure://{quote(a.account or '')}/{quote(a.bucket)}/{quote(a.table)}?{prefix}"
        query = {k: getattr(a, f) for k, f in _STORE_QUERY.items() if getattr(a, f) is not None}
        return f"aws://{quote(a.bucket)}/{quote(a.table)}?{urlencode(query)}"


def default_poll_s(free_requests: bool) -> float:
    """A worker's long-poll wait where nobody chose one. In-process queues and table cost
    nothing to poll: short waits, prompt reactions (a reducer learns of a map's commit, which
    no message announces, only by asking). A remote store bills each request, and SQS rounds
    a long poll up to whole seconds."""
    return 0.1 if free_requests else 1.0


@dataclass(frozen=True)
class WorkerSettings:
    map_slots: int = field(default_factory=default_cores)  # map tasks run at once
    reduce_slots: int = field(default_factory=default_cores)  # reduce tasks held at once
    processes: int = field(default_factory=default_cores)  # CPU pool for user code
    memory_mb: int = 512  # reducer budget before spilling to local disk
    idle_exit_s: float | None = None  # exit after this long with nothing to do
    poll_s: float = 1.0  # long-poll wait on queues (SQS rounds it up to whole seconds)
    # Idle waits back off to this: an idle slot's long poll, a reducer's table polls while
    # no commit is expected. Longer: fewer requests while idle, later notice of a map that
    # sent nothing to a partition. None: 5 x poll_s (5 s on SQS).
    idle_poll_s: float | None = None
    spill_dir: str | None = None
    # How often a worker checks a running job that none of its slots got a message of in
    # that long: are its task messages still there, is it due to be finalized (cmr.janitor).
    janitor_s: float = 60.0
    # Idle slots back up stragglers (cmr.backup): a task far slower than its finished peers
    # gets a second attempt here; the first committed attempt wins.
    backups: bool = True
    # The shuffle. Defaults are cmr's; ``message_bytes=7 * 1024, compress=False,
    # use_combiner=False`` mimics the 2009 implementation (SQS's 8 KB limit then, no zstd,
    # no combiner), for comparing costs. Readers accept every combination, whoever sent it.
    message_bytes: int | None = None  # largest shuffle message; None: the queue's own limit
    compress: bool = True  # zstd-compress shuffle batches (off: plain msgpack bodies)
    use_combiner: bool = True  # run the job's combine (if it has one) in map and reduce
    # What jobs this worker serves (cmr.admission): directories and module names its job
    # code may come from (empty: the current directory), and URL prefixes its outputs and
    # inputs may lie under (empty: the bucket of its own store).
    jobs_from: tuple[str, ...] = ()
    outputs_under: tuple[str, ...] = ()
    inputs_under: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Settings cross a process boundary as JSON (`cmr worker --settings-json`): every
        # value is checked here, once, whoever built them.
        for name in ("map_slots", "reduce_slots", "processes"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.memory_mb < 0:
            raise UsageError(
                f"memory_mb must be 0 (spill everything) or more; got {self.memory_mb}"
            )
        for name in ("poll_s", "janitor_s", "idle_poll_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise UsageError(f"{name} must be a positive number of seconds; got {value}")
        if self.idle_exit_s is not None and not 0 <= self.idle_exit_s < float("inf"):
            raise UsageError(f"idle_exit_s must be 0 seconds or more; got {self.idle_exit_s}")
        if self.message_bytes is not None and self.message_bytes < MIN_MESSAGE_BYTES:
            raise UsageError(
                f"message_bytes must be at least {MIN_MESSAGE_BYTES} (a batch's tag and "
                f"header need room); got {self.message_bytes}"
            )

    @property
    def idle_wait_s(self) -> float:
        return max(self.poll_s, 5 * self.poll_s if self.idle_poll_s is None else self.idle_poll_s)

    def shuffle_bytes(self, queue_limit: int) -> int:
        """The size shuffle batches are packed to: ours, never above the queue's limit."""
        return min(queue_limit, self.message_bytes or queue_limit)

    def to_json(self) -> str:
        """Every field, as ``from_json`` reads it back: how `cmr run` hands its settings to
        the `cmr worker` processes it starts."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> WorkerSettings:
        """Settings written by ``to_json``; a missing field takes its default, an unknown or
        mistyped one is refused."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"worker settings are not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError("worker settings must be a JSON object")
        hints = get_type_hints(WorkerSettings)
        for key, value in data.items():
            if key not in hints:
                raise UsageError(f"worker settings: unknown field {key!r}")
            if hints[key] == tuple[str, ...]:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise UsageError(f"worker settings: {key} must be a list of strings")
                data[key] = tuple(value)
                continue
            if not any(_is(value, t) for t in get_args(hints[key]) or (hints[key],)):
                kind = hints[key] if isinstance(hints[key], type) else str(hints[key])
                name = getattr(kind, "__name__", kind)
                raise UsageError(f"worker settings: {key}={value!r} is not of type {name}")
        return WorkerSettings(**data)


def _is(value: object, kind: Any) -> bool:
    """JSON's view of a type: bool is not a number, an int is a float."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)
