"""What every cmr command shares, declared once: the consoles, the one-line error exit,
verbosity, and the store (which backend, and where in it).

Groups of options shared by several commands are frozen dataclasses whose fields carry
their typer options; ``@shared(name, Cls)`` adds those fields to a command's parameters and
hands the command one ``Cls`` instance instead (``StoreFlags`` here, the load tests' flags
in ``cmr.cli.loadgen``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Annotated, Any, NoReturn, TypeVar, get_type_hints

import typer
from rich.console import Console
from rich.text import Text

from cmr.errors import UsageError
from cmr.logs import inert
from cmr.settings import AwsSettings, BackendName, Store

err = Console(stderr=True, soft_wrap=True)  # an error message must stay greppable
out = Console()

F = TypeVar("F", bound=Callable[..., Any])
STORE_ENV = "CMR_STORE"
_AWS = AwsSettings()  # the defaults, shown in help texts


# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that
# make a terminal show text in another order than it is stored ("Trojan Source").
def safe_text(value: object) -> Text:
    """Text that came from outside (an error message, a job record, an exception, a file
    name, a log line), made inert for a terminal: Rich never reads it as markup (``[/x]``
    is shown, not parsed), and every control character is shown as its escape (``\\x1b``):
    an ESC sequence can neither clear the screen, set the title, move the cursor nor hide
    what follows. Plain ``str`` callers use ``safe_text(x).plain``."""
    return Text(inert(value))


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one ``error:`` line (no traceback) and exit with ``code``."""
    # Text from services, user code, records and paths: shown as it is, never obeyed.
    err.print(Text.assemble(("error:", "bold red"), " ", safe_text(message)), highlight=False)
    raise typer.Exit(code)


def _remember_verbosity(ctx: typer.Context, value: int) -> int:
    # ctx.meta is shared by every context of one invocation: the exit handler, which runs in
    # the top-level group, reads it to decide whether an unexpected error shows its traceback.
    ctx.meta["cmr.verbose"] = value
    return value


Verbose = Annotated[
    int,
    typer.Option(
        "--verbose", "-v", count=True, callback=_remember_verbosity, help="more log output"
    ),
]

# Single options for commands that name only part of a store (``cmr fleet``).
Bucket = Annotated[str, typer.Option(help="S3 bucket for staging, scratch and output")]
TableName = Annotated[str, typer.Option("--table", help="DynamoDB table for job state")]
QueuePrefix = Annotated[str, typer.Option(help="prefix of every queue cmr creates")]
Region = Annotated[str | None, typer.Option(help="AWS region (default: AWS config)")]
Profile = Annotated[str | None, typer.Option(help="AWS profile (default: AWS config)")]


E = TypeVar("E", bound=Enum)


def choice(kind: type[E], flag: str) -> Callable[[str], E]:
    """A parser of one of ``kind``'s values. A wrong one is a cmr UsageError, not click's:
    one ``error:`` line and exit 1, as every other refused setting."""

    def parse(text: str) -> E:
        try:
            return kind(text)
        except ValueError:
            names = ", ".join(str(k.value) for k in kind)
            raise UsageError(f"unknown {flag} {text!r}: use one of {names}") from None

    return parse


def choice_option(kind: type[Enum], flag: str, help: str, **extra: Any) -> Any:
    """A typer option taking one of ``kind``'s values (see ``choice``)."""
    metavar = "[" + "|".join(str(k.value) for k in kind) + "]"
    return typer.Option(flag, parser=choice(kind, flag), metavar=metavar, help=help, **extra)


def _parse_store(text: str) -> Store:
    try:
        return Store.parse(text)
    except UsageError as exc:
        if os.environ.get(STORE_ENV) == text:  # say where a value nobody typed came from
            raise UsageError(f"{exc} (from ${STORE_ENV})") from None
        raise


@dataclass(frozen=True)
class StoreFlags:
    """``--store`` (or $CMR_STORE), and the older flags that name one part of it: they stay,
    hidden, and a part given that way overrides the same part of the store."""

    store: Annotated[
        Store | None,
        typer.Option(
            parser=_parse_store,
            envvar=STORE_ENV,
            metavar="STORE",
            help="embedded (in-process), or aws://BUCKET/TABLE?prefix=P&region=R&profile=N"
            "&owner=ACCOUNT (S3 then refuses a bucket another account owns); parts left out: "
            f"{_AWS.bucket}, {_AWS.table}, {_AWS.queue_prefix}, the AWS config's, no owner check",
        ),
    ] = None
    backend: Annotated[
        BackendName | None,
        choice_option(BackendName, "--backend", "see --store", hidden=True),
    ] = None
    bucket: Annotated[str | None, typer.Option(hidden=True, help="the store's bucket")] = None
    table: Annotated[str | None, typer.Option(hidden=True, help="the store's table")] = None
    queue_prefix: Annotated[
        str | None, typer.Option(hidden=True, help="the store's queue prefix")
    ] = None
    region: Annotated[str | None, typer.Option(hidden=True, help="the store's region")] = None
    profile: Annotated[str | None, typer.Option(hidden=True, help="the store's profile")] = None

    def resolve(self, default: BackendName, *, create: bool = True) -> Store:
        """The store these flags name; ``default`` when neither --store, $CMR_STORE nor
        --backend says which backend."""
        base = self.store or Store(default)
        parts = {
            name: getattr(self, name)
            for name in ("bucket", "table", "queue_prefix", "region", "profile")
            if getattr(self, name) is not None
        }
        return Store(self.backend or base.backend, replace(base.aws, **parts, create=create))


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default


def shared(name: str, cls: type[Any]) -> Callable[[F], F]:
    """Add the fields of dataclass ``cls`` (each annotated with its typer option) to the
    command's parameters, and pass them to it as one ``cls`` instance, as ``name``."""
    hints = get_type_hints(cls, include_extras=True)
    added = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[f.name],
            default=_default(f),
        )
        for f in dataclasses.fields(cls)
    ]

    def decorate(command: F) -> F:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        kept = [p for p in own if p.name != name]
        clash = {p.name for p in kept} & {p.name for p in added}
        assert len(kept) == len(own) - 1, f"{command.__name__} takes no {name}"
        assert not clash, f"{command.__name__}: {clash} declared twice"

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            group = cls(**{p.name: kwargs.pop(p.name) for p in added})
            return command(**kwargs, **{name: group})

        # typer reads the parameters from the signature and their types from __annotations__
        params = [*kept, *added]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


def key_values(pairs: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict (a later KEY wins)."""
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(
                f"{pair!r} is not KEY=VALUE: write {flag} NAME=VALUE", param_hint=flag
            )
        found[key] = value
    return found


def check_range(flag: str, value: float | None, low: float, high: float, why: str) -> None:
    """Refuse an option's value outside [low, high], naming the flag and the reason for the
    range; None (not given) passes."""
    if value is not None and not low <= value <= high:  # NaN too
        raise UsageError(f"{flag} must be between {low:,} and {high:,} ({why}); got {value}")


def machine_memory_mb() -> int:
    """This machine's memory, MB (what a memory budget given here must fit in)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):  # not every platform names these
        return 1024 * 1024  # 1 TB: no machine this runs on has more


def configure_logs(level: int) -> None:
    from cmr import logs  # structlog costs a tenth of a second: not for --help

    logs.configure(level)
