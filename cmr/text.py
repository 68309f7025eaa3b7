"""Text from outside (a message, a record, an exception, a file name) made inert for a
terminal or a log: every control character but tab and newline, and the bidirectional
overrides, shown as its escape (``\\x1b``), so an ESC sequence can neither clear the screen,
set the title nor hide what follows, and U+202E cannot reverse a line."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
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
