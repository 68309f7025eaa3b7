"""Command-line values of plain types, typed without pydantic.

typer (0.29) types every parameter's value, its default included, through a pydantic
``TypeAdapter`` it builds on first use: on `cmr run` that is ~27 adapters and the import of
pydantic, ~0.2 CPU-s of every command before it does anything. Most of what cmr's commands
take is plain (``str``, ``int``, ``float``, a list of ``str``, or one of these or None), and
for those the value is typed here, the way pydantic's lax mode types it; so is the value of
an option with a parser of its own (``--backend``, ``--store``, ``--lines``: its parser's
result), and an enum option's value that is already a member (a default). Anything else
goes to typer's own coercion, as before: an enum given as text, a path or file, a range,
and any value these rules do not cover, a bad one included (its error is typer's message).

The patch (:mod:`cmr.cli.typerparams`) leans on typer's internals, so it goes in only on the
typer it was checked against (``TYPER``, the version the lock files pin); on any other,
typer's own coercion stays. ``tests/engine/test_cli_coercion.py`` checks, for every
parameter of every command, that both ways give the same value of the same type, or the
same refusal.
"""

from __future__ import annotations

import re
import types
from enum import EnumMeta
from typing import Any, Union, get_args, get_origin

TYPER = "0.29.2"  # the typer whose internals this was written against and tested on
MISS = object()
# What pydantic's lax mode takes for these from a string, and no more: the rest (spaces,
# signs, underscores, exponents, "inf", non-ASCII digits) is typer's to accept or refuse.
# At most 18 digits: Python's int() refuses more than 4,300 (a ValueError, not a usage
# error), and no count or size cmr takes needs more than 18.
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,18})?")


def _unwrapped(annotation: Any) -> Any:
    """``X | None`` and ``Optional[X]`` as ``X`` (None itself never reaches the rules)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else MISS
    return annotation


def plain(annotation: Any) -> bool:
    """Whether values of this annotation are typed here."""
    annotation = _unwrapped(annotation)
    return annotation in (str, int, float) or (
        get_origin(annotation) is list and get_args(annotation) == (str,)
    )


def typed(annotation: Any, value: Any) -> Any:
    """``value`` as ``annotation`` (a :func:`plain` one), or ``MISS`` if the rules do not
    cover it."""
    annotation = _unwrapped(annotation)
    kind = type(value)
    if annotation is str:
        return value if kind is str else MISS
    if annotation is int:
        if kind is int:
            return value
        return int(value) if kind is str and _INT.fullmatch(value) else MISS
    if annotation is float:
        if kind is float:
            return value
        if kind is int:
            return float(value)
        return float(value) if kind is str and _FLOAT.fullmatch(value) else MISS
    if kind in (list, tuple) and all(type(v) is str for v in value):
        return list(value)
    return MISS


def parsed(annotation: Any, parser: Any, value: Any) -> Any:
    """A string given to an option with a parser of its own (cmr's enums, ``--store``) as
    its parser makes it, when the result is of the annotated class exactly (what typer's
    coercion then leaves as it is), or ``MISS`` (a refusal included: typer's to report)."""
    annotation = _unwrapped(annotation)
    if type(value) is not str or not isinstance(annotation, type):
        return MISS
    try:
        got = parser(value)
    except Exception:
        return MISS
    return got if type(got) is annotation else MISS


def member(annotation: Any, value: Any) -> Any:
    """An enum option's value that is already one of its members (a default, such as
    ``cmr loadgen``'s ``--retries off``) as itself, or ``MISS`` (a string given on the command
    line is typer's to match, case and all)."""
    annotation = _unwrapped(annotation)
    return value if isinstance(annotation, EnumMeta) and type(value) is annotation else MISS
