"""Command-line values of plain types, typed without pydantic.

typer (0.29) types every parameter's value, its default included, through a pydantic
``TypeAdapter`` it builds on first use: on `cmr run` that is ~27 adapters and the import of
pydantic, ~0.2 CPU-s of every command before it does anything. Most of what cmr's commands
take is plain (``str``, ``int``, ``float``, a list of ``str``, or one of these or None), and
for those the value is typed here, the way pydantic's lax mode types it. Anything else goes
to typer's own coercion, as before: an enum, a path or file, a range, a custom parser, and
any value these rules do not cover, a bad one included (its error is typer's message).

``tests/engine/test_cli_coercion.py`` checks, for every parameter of every command, that
both ways give the same value of the same type.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin

from typer import _coercion, core

_MISS = object()
# What pydantic's lax mode takes for these from a string, and no more: the rest (spaces,
# signs, underscores, exponents, "inf") is typer's to accept or refuse.
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def _unwrapped(annotation: Any) -> Any:
    """``X | None`` and ``Optional[X]`` as ``X`` (None itself never reaches the rules)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else _MISS
    return annotation


def plain(annotation: Any) -> bool:
    """Whether values of this annotation are typed here."""
    annotation = _unwrapped(annotation)
    return annotation in (str, int, float) or (
        get_origin(annotation) is list and get_args(annotation) == (str,)
    )


def typed(annotation: Any, value: Any) -> Any:
    """``value`` as ``annotation`` (a :func:`plain` one), or ``_MISS`` if the rules do not
    cover it."""
    annotation = _unwrapped(annotation)
    kind = type(value)
    if annotation is str:
        return value if kind is str else _MISS
    if annotation is int:
        if kind is int:
            return value
        return int(value) if kind is str and _INT.fullmatch(value) else _MISS
    if annotation is float:
        if kind is float:
            return value
        if kind is int:
            return float(value)
        return float(value) if kind is str and _FLOAT.fullmatch(value) else _MISS
    if kind in (list, tuple) and all(type(v) is str for v in value):
        return list(value)
    return _MISS


@dataclass(frozen=True)
class _Plain(_coercion.RuntimeParam):
    """typer's coercion contract: ours for what :func:`typed` covers, else typer's own,
    built on first need. An absent option's None never needs it (the contract's ``coerce``
    answers None, or () for a list, before asking either)."""

    descriptor: _coercion.TypeDescriptor
    covered: bool  # of a plain type, with no range, path check or parser of its own
    full: list[_coercion.RuntimeParam] = field(default_factory=list)  # typer's, once built

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if self.covered:
            got = typed(self.annotation, value)
            if got is not _MISS:
                return got
        if not self.full:
            self.full.append(_coercion.build_runtime_param(self.descriptor))
        return self.full[0]._coerce_value(value, param=param, ctx=ctx)


def covered(descriptor: _coercion.TypeDescriptor) -> bool:
    """Whether a parameter's values are typed here (when :func:`typed` covers the value)."""
    info = descriptor.parameter_info
    return (
        plain(descriptor.annotation)
        and not descriptor.is_file
        and not descriptor.is_path
        and not descriptor.is_choice
        and info.min is None
        and info.max is None
        and info.parser is None
    )


def runtime_param(descriptor: _coercion.TypeDescriptor) -> _coercion.RuntimeParam:
    """What types one parameter's values (typer's contract)."""
    return _Plain(
        parameter_info=descriptor.parameter_info,
        annotation=descriptor.annotation,
        descriptor=descriptor,
        covered=covered(descriptor),
    )


def _runtime_param(self: Any) -> _coercion.RuntimeParam:
    if self._runtime_param is None:
        self._runtime_param = runtime_param(self.type_descriptor)
    return self._runtime_param  # type: ignore[no-any-return]


def install() -> bool:
    """Type plain values here from now on, in this process. False (typer's coercion stays)
    if typer is not the version whose internals this was written against."""
    param = getattr(core, "_TyperParameter", None)
    if param is None or not hasattr(param, "get_runtime_param"):
        return False
    if not all(hasattr(_coercion, n) for n in ("RuntimeParam", "build_runtime_param")):
        return False
    param.get_runtime_param = _runtime_param
    return True
