"""The half of :mod:`cmr.cli.coercion` that stands on typer's internals, imported only on
``coercion.TYPER``: typer's coercion contract for one parameter, answered by
:func:`cmr.cli.coercion.typed` where it covers the value, else by typer's own coercion."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typer import _coercion, core

from cmr.cli.coercion import MISS, member, parsed, plain, typed


@dataclass(frozen=True)
class _Plain(_coercion.RuntimeParam):
    """typer's coercion contract: ours for what :func:`typed`, :func:`member` and
    :func:`parsed` cover, else typer's own, built on first need. An absent option's None
    never needs it (the contract's ``coerce`` answers None, or () for a list, before asking
    either)."""

    descriptor: _coercion.TypeDescriptor
    covered: bool  # of a plain type, with no range, path check or parser of its own
    parses: bool  # with a parser of its own (cmr.cli.options'): its value, if of the class
    # typer's, once built (not compared: a cache)
    full: list[_coercion.RuntimeParam] = field(default_factory=list, compare=False)

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if self.covered:
            got = typed(self.annotation, value)
        else:  # a member as itself (a default); else text through the option's own parser
            got = member(self.annotation, value)
            if got is MISS and self.parses:
                got = parsed(self.annotation, self.parameter_info.parser, value)
        if got is not MISS:
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
        parses=descriptor.parameter_info.parser is not None,
    )


def _runtime_param(self: Any) -> _coercion.RuntimeParam:
    if self._runtime_param is None:
        self._runtime_param = runtime_param(self.type_descriptor)
    return self._runtime_param  # type: ignore[no-any-return]


def install() -> None:
    """Every typer parameter of this process types its values through :func:`runtime_param`
    from now on."""
    core._TyperParameter.get_runtime_param = _runtime_param  # type: ignore[method-assign]
