"""structlog set up once by the CLI or ``cmr.run``: key=value lines on stderr."""

from __future__ import annotations

import logging
import sys

import structlog

from cmr.text import inert_log_values

# The level configured last: `cmr run` hands it to the workers it starts, so that its
# terminal shows what its verbosity asks for, whoever logged it.
_configured = [logging.WARNING]


def level() -> int:
    return _configured[0]


def configure(level: int = logging.WARNING) -> None:
    _configured[0] = level
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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
