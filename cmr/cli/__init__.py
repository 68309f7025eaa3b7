"""The ``cmr`` command.

    cmr run | worker | status | wait | cancel | cleanup     cmr.cli.run, .worker, .jobs
    cmr dashboard                                           cmr.cli.dashboard
    cmr loadgen ...                                         cmr.cli.loadgen
    cmr fleet ...                                           cmr.fleet

Each sub-app is imported only when its name is on the command line (``cmr fleet`` brings
boto3, ``cmr loadgen`` the load generators): ``cmr run`` pays for neither, and ``cmr --help``
lists them from the one-line help kept here (tests/engine/test_cli_startup.py checks it
against the apps').
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

from cmr.cli import coercion, dashboard, jobs, run, worker
from cmr.cli.exits import command_line_errors, exit_codes

if typer.__version__ == coercion.TYPER:  # plain option values typed without pydantic
    from cmr.cli import typerparams

    typerparams.install()

# name -> (module, attribute) of a typer sub-app, loaded on first use
LAZY = {"loadgen": ("cmr.cli.loadgen", "loadgen_app"), "fleet": ("cmr.fleet", "fleet_app")}
# name -> the sub-app's help, for `cmr --help` to list it without importing it
LAZY_HELP = {
    "loadgen": "Load tests and consistency measurements of a store (DynamoDB, S3, SQS, "
    "SimpleDB, Azure Table and Blob storage, or the simulated 'sim'), run as cmr jobs: map "
    "tasks drive traffic, reducers merge it.",
    "fleet": "Run a worker fleet on EC2: up, scale, status, logs, down (deploy/fleet.yaml).",
}


class CmrGroup(TyperGroup):
    """The top-level group: loads sub-apps on demand, and ends every command through the
    one exception-to-exit handler."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in LAZY if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in LAZY or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        if ctx.meta.get("cmr.listing"):
            # only its name and help are shown: a stand-in, not kept
            return TyperGroup(name=cmd_name, help=LAZY_HELP[cmd_name])
        module, attr = LAZY[cmd_name]
        # built as app.add_typer would have built it (no completion options of its own)
        holder = typer.Typer(add_completion=False)
        holder.add_typer(getattr(importlib.import_module(module), attr), name=cmd_name)
        command = typer.main.get_group(holder).commands[cmd_name]
        self.commands[cmd_name] = command
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        ctx.meta["cmr.listing"] = True
        try:
            super().format_help(ctx, formatter)
        finally:
            ctx.meta.pop("cmr.listing", None)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            # Absent, typer coerces its None through pydantic (0.4 s of imports on every
            # `cmr run ...`) only to get None back; a bool default skips that.
            option.default = False
        return option

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        # The top level's own options (a sub-command's are parsed within invoke)
        with command_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with exit_codes(ctx.meta):
            return super().invoke(ctx)


app = typer.Typer(
    cls=CmrGroup,
    add_completion=False,
    no_args_is_help=True,
    help="cmr: masterless MapReduce on queues (SQS), blobs (S3) and a table "
    "(DynamoDB), or all of it in-process.",
)
app.command("run")(run.run)
app.command("worker")(worker.worker)
for command in (jobs.status, jobs.wait, jobs.cancel, jobs.cleanup):
    app.command()(command)
app.command("dashboard")(dashboard.dashboard)


def main() -> None:
    from cmr import logs

    logs.lean[0] = True  # a command, not a library: structlog without what cmr never uses
    app()


__all__ = ["app", "main"]
