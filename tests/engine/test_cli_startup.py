"""`cmr --help` and `cmr run --help` stay cheap: the load generator, the fleet and their
heavy libraries are imported only when their command is run (the issue: `cmr --help` took
3-7 s on a loaded machine, importing loadgen and fleet to print one line each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cmr.cli

# Run as the `cmr` script runs: the modules loaded by the time the help is printed.
PROBE = """
import json, runpy, sys
sys.argv = ["cmr", *json.loads(sys.argv[1])]
try:
    runpy.run_module("cmr", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""
HEAVY = ("cmr.loadgen", "cmr.cli.loadgen", "cmr.cli.loadtest", "cmr.fleet")
THIRD_PARTY = ("matplotlib", "hdrh", "aioboto3", "boto3", "botocore", "pydantic")


def loaded(*args: str) -> tuple[str, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    return done.stdout, set(modules)


def under(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("args", [("--help",), ("run", "--help")])
def test_help_imports_neither_loadgen_nor_fleet(args: tuple[str, ...]) -> None:
    out, modules = loaded(*args)
    assert "Usage:" in out
    assert under(modules, HEAVY) == []
    assert under(modules, THIRD_PARTY) == []


def test_help_lists_every_command_with_its_help() -> None:
    out, _ = loaded("--help")
    flat = " ".join(out.replace("│", " ").split())
    for name in ("run", "worker", "status", "wait", "cancel", "cleanup", "loadgen", "fleet"):
        assert f" {name} " in flat, name
    assert "Load tests and consistency measurements of a store" in flat
    assert "Run a worker fleet on EC2" in flat


def test_lazy_help_is_the_apps_own() -> None:
    from cmr.cli.loadgen import loadgen_app
    from cmr.fleet import fleet_app

    apps = {"loadgen": loadgen_app.info.help, "fleet": fleet_app.info.help}
    assert apps == cmr.cli.LAZY_HELP


@pytest.mark.parametrize("name", ["loadgen", "fleet"])
def test_lazy_commands_still_answer_help(name: str) -> None:
    got = CliRunner().invoke(cmr.cli.app, [name, "--help"])
    assert got.exit_code == 0, got.output
    assert "Commands" in got.output
    assert cmr.cli.LAZY_HELP[name].split()[0] in got.output


def test_a_run_loads_no_renderer_that_cmr_does_not_use(tmp_path: Path) -> None:
    """structlog loads rich's traceback and pretty-printer (with pygments and attrs) for
    renderers cmr never uses: a whole `cmr run`, which logs, loads none of them; a logged
    exception still shows its traceback, plainly; rich's traceback stays importable."""
    (tmp_path / "in.txt").write_text("a b a\n")
    wordcount = Path(__file__).resolve().parents[2] / "examples" / "wordcount.py"
    _, modules = loaded(
        "run", str(wordcount), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out"), "-v"
    )
    assert sorted((tmp_path / "out").glob("part-*"))  # the job ran, and logged
    assert "structlog" in modules
    assert under(modules, UNUSED_RENDERERS) == []
    logged = subprocess.run(
        [sys.executable, "-c", LOG_AN_EXCEPTION],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback (most recent call last)" in logged.stderr, logged.stderr
    assert "ZeroDivisionError: division by zero" in logged.stderr
    assert logged.stdout.split() == ["[]", "Traceback"]
    # A program using cmr as a library keeps structlog whole (its rich tracebacks too).
    library = "import cmr.api, structlog.dev; print(structlog.dev.rich is not None)"
    whole = subprocess.run(
        [sys.executable, "-c", library], check=True, capture_output=True, text=True, timeout=120
    )
    assert whole.stdout.strip() == "True", whole.stderr


UNUSED_RENDERERS = ("rich.traceback", "rich.pretty", "pygments", "attr", "better_exceptions")
LOG_AN_EXCEPTION = f"""
import sys
from cmr import logs
logs.lean[0] = True  # as the `cmr` command sets it
logs.configure()
try:
    1 / 0
except ZeroDivisionError:
    logs.get_logger("t").error("failed", exc_info=True)
print(sorted(m for m in sys.modules if m.startswith({UNUSED_RENDERERS!r})))
import rich.traceback
print(rich.traceback.Traceback.__name__)
"""
