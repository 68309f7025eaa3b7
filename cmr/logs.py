"""What cmr writes for a person to read: structlog set up once by the CLI or ``cmr.run``
(key=value lines on stderr), and text from outside made inert first.

Text from outside (a message, a record, an exception, a file name) is made inert for a
terminal or a log: every control character but tab and newline, and the bidirectional
overrides, shown as its escape (``\\x1b``), so an ESC sequence can neither clear the screen,
set the title nor hide what follows, and U+202E cannot reverse a line. Every log line's
strings go through it (``inert_log_values``), and the CLI's tables through ``inert``."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from types import ModuleType
from typing import Any

_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def inert(value: object) -> str:
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], str(value))


def inert_log_values(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: every string in a log line is inert (values often quote a
    stranger's message or a job's error)."""
    return {k: inert(v) if isinstance(v, str) else v for k, v in event.items()}


# What structlog imports for renderers cmr never uses (it logs plain lines, its tracebacks
# plain): rich's traceback and pretty-printer (which load pygments and attrs) and
# better_exceptions. ~0.1 CPU-s of every `cmr` process that logs (hundreds a test run).
_UNUSED = ("rich.console", "rich.traceback", "rich.pretty", "better_exceptions")
# Set by the `cmr` command only: a program that uses cmr as a library keeps structlog whole
# (structlog decides at its import what it has, for the whole process).
lean = [False]


def structlog_module() -> ModuleType:
    """structlog; in the `cmr` command, imported without the renderers above: each import
    of one fails while structlog loads (it takes that as the library being absent), then
    works again for others (typer shows its help with rich's console)."""
    loaded = sys.modules.get("structlog")
    if loaded is not None:
        return loaded
    blocked = [name for name in _UNUSED if name not in sys.modules] if lean[0] else []
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import structlog
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return structlog


def get_logger(name: str) -> Any:
    return structlog_module().get_logger(name)


# The level configured last: `cmr run` hands it to the workers it starts, so that its
# terminal shows what its verbosity asks for, whoever logged it.
_configured = [logging.WARNING]


def level() -> int:
    return _configured[0]


def configure(level: int = logging.WARNING) -> None:
    _configured[0] = level
    # Here, not at the top: the CLI's tables need ``inert`` and not structlog.
    structlog = structlog_module()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            inert_log_values,
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_to_stderr,
        cache_logger_on_first_use=False,
    )


def _to_stderr(*_: Any) -> Any:
    """A logger writing to ``sys.stderr`` as it is when the logger is made, not as it was
    when logging was configured: a process that swaps stderr (a test harness, a caller of
    ``cmr.cli`` in-process) and closes the old one would otherwise have every later log
    line fail on a closed file."""
    return structlog_module().PrintLogger(sys.stderr)
