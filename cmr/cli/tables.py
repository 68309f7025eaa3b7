"""Tables whose identifiers are never cut: a job id or an instance id is copied from a table
into the next command, so one shown as ``20260101-0…`` is worse than none.

Identifier columns are ``no_wrap`` with room for their longest value; the other columns fold
(down to their header's width). On a terminal the table fits the screen that way when it
can, and is printed wider than the screen (the terminal wraps the lines; every character
stays) when it cannot; anywhere else (a pipe, a file, a CI log) there is no screen to fit,
and the table is printed at its natural width however wide.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table


def keep_whole(table: Table, column: int, values: Iterable[str]) -> None:
    """Make ``column`` an identifier column: never wrapped, never cut, as wide as its longest
    value (or its header)."""
    col = table.columns[column]
    col.no_wrap = True
    col.overflow = "ignore"
    col.min_width = max((len(v) for v in values), default=0) or None
    for other in table.columns:
        if other is not col and not other.no_wrap:
            other.overflow = "fold"  # the others give way, but keep their header readable
            other.min_width = max(other.min_width or 0, len(str(other.header))) or None


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` on ``console`` without cutting an identifier (see the module doc)."""
    if console.is_terminal:
        # Each column's least width, a border and a space either side of each cell, and a
        # character of slack per column for rich's rounding.
        need = sum(c.min_width or 1 for c in table.columns) + 4 * len(table.columns) + 1
    else:
        wide_open = console.options.update_width(1 << 16)
        need = console.measure(table, options=wide_open).maximum
    if need <= console.width and console.is_terminal:
        console.print(table)
        return
    wide = Console(
        file=console.file,
        width=max(console.width, need),
        color_system="auto" if console.is_terminal else None,
        force_terminal=console.is_terminal,
        soft_wrap=False,
        highlight=False,
    )
    wide.print(table)
