"""cmr.cli.coercion types plain option values without pydantic: for every parameter of
every command, its way and typer's own give the same value of the same type, or the same
refusal; and a whole `cmr run` no longer imports pydantic."""

from __future__ import annotations

from collections.abc import Iterator
from enum import EnumMeta
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
from typer import _coercion
from typer._click import Context
from typer._click.exceptions import ClickException

import cmr.cli
from cmr.cli import coercion, typerparams
from cmr.cli.loadgen import loadgen_app
from cmr.fleet import fleet_app
from tests.engine.test_cli_startup import loaded, under

STRINGS = ["0", "7", "-3", "007", "1.5", "-0.25", "1.", ".5", "abc", "", " 5", "+5", "1_000",
           "1e3", "inf", "nan", "-", "-0", "1.0", "9" * 18, "9" * 19, "9" * 4301,
           "1." + "5" * 30, "\u0661\u0662", "\uff11\uff12", "\ud800", "a\x00b"]  # fmt: skip
OTHERS: list[Any] = [0, 5, -2, 1.5, True, False, b"5", 10**30]
PARSEABLE = ["embedded", "aws", "lf", "universal", "aws://b/t?prefix=p-&region=eu-west-1", "off",
             "both", "get", "put", "standard", "adaptive", "legacy"]  # fmt: skip
LISTS: list[Any] = [(), ("a",), ("a", "b c"), ["x"], ("1", "2")]


def _params() -> Iterator[tuple[str, Any]]:
    groups = {
        "cmr": typer.main.get_group(cmr.cli.app),
        "cmr loadgen": typer.main.get_group(loadgen_app),
        "cmr fleet": typer.main.get_group(fleet_app),
    }
    for prefix, group in groups.items():
        for name, command in group.commands.items():
            for param in command.params:
                if hasattr(param, "type_descriptor"):
                    yield f"{prefix} {name} {param.name}", param


PARAMS = list(_params())
COVERED = [(n, p) for n, p in PARAMS if typerparams.covered(p.type_descriptor)]


CTX = Context(typer.main.get_command(cmr.cli.app))


def _outcome(coerce: Any, value: Any, param: Any) -> tuple[str, Any]:
    ctx = CTX
    try:
        got = coerce(value, param=param, ctx=ctx)
    except ClickException as exc:
        return "refused", exc.format_message()
    except Exception as exc:  # a parser's own refusal (cmr's UsageError)
        return type(exc).__name__, str(exc)
    return type(got).__name__, repr(got)  # repr: nan is nan


def test_most_parameters_are_covered_and_the_patch_is_in() -> None:
    assert len(COVERED) >= 60, [n for n, _ in COVERED]
    # The typer the lock files pin is the one the patch was written against, and it is in.
    assert typer.__version__ == coercion.TYPER
    assert typer.core._TyperParameter.get_runtime_param is typerparams._runtime_param


@pytest.mark.parametrize(("name", "param"), PARAMS, ids=[n for n, _ in PARAMS])
def test_values_come_out_as_typer_gives_them(name: str, param: Any) -> None:
    ours = typerparams.runtime_param(param.type_descriptor)
    theirs = _coercion.build_runtime_param(param.type_descriptor)
    values: list[Any] = [param.default, *STRINGS, *PARSEABLE, *OTHERS, *LISTS]
    for kind in (param.type_descriptor.annotation, *get_args(param.type_descriptor.annotation)):
        if isinstance(kind, EnumMeta):
            values += list(kind)  # members, as a default is
    for value in values:
        a = _outcome(ours.coerce, value, param)
        b = _outcome(theirs.coerce, value, param)
        assert a == b, (name, value)


def test_a_whole_run_with_options_of_each_kind_imports_no_pydantic(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a b a\n")
    wordcount = Path(__file__).resolve().parents[2] / "examples" / "wordcount.py"
    _, modules = loaded(
        "run", str(wordcount), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out"),
        "--reducers", "2", "--store", "embedded", "--lines", "lf",
    )  # fmt: skip
    assert sorted((tmp_path / "out").glob("part-*"))  # the job ran, and succeeded
    assert under(modules, ("pydantic",)) == []
