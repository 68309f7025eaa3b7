"""How a cmr command ends: the one place exceptions become messages and exit codes.

A cmr error is a sentence for the user: one ``error:`` line, exit 1 (a value out of range
is one: the command line parsed). A command line that does not parse (an unknown option, a
missing one, a value of the wrong type) is one ``error:`` line too, naming the option, exit
2 as is usual for usage errors. A failed job shows the reason its record gives (the task's
traceback), exit 1. Ctrl-C exits 130. Anything else is a bug: a short message, and its
traceback with ``-v``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import typer
from rich.text import Text

# typer vendors click and re-exports only some of its exceptions; usage errors are these
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer._click.exceptions import UsageError as CommandLineError

from cmr.cli.options import err, fail, safe_text
from cmr.errors import CmrError, JobFailed

T = TypeVar("T")
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
USAGE = 2  # the command line does not parse (click's code, and the shells' custom)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped a command (after it cancelled what it had started)."""


def ended(exc: JobFailed) -> str:
    return "cancelled" if exc.reason.startswith("cancelled") else "failed"


def usage_line(exc: CommandLineError) -> str:
    """Click's message about a command line, on one line, with where to look: its own
    rendering is a usage block and a framed box over several lines."""
    text = " ".join(exc.format_message().split()).rstrip(".")
    if exc.ctx is not None:
        text += f" (see `{exc.ctx.command_path} --help`)"
    return text


@contextlib.contextmanager
def command_line_errors() -> Iterator[None]:
    """One ``error:`` line, exit 2, for a command line that does not parse."""
    try:
        yield
    except NoArgsIsHelpError:
        raise  # `cmr` alone: the help is the answer
    except CommandLineError as exc:
        fail(usage_line(exc), code=USAGE)


@contextlib.contextmanager
def exit_codes(meta: dict[str, Any]) -> Iterator[None]:
    """Turn whatever a command raised into its message and exit code (``meta``: the
    invocation's shared click ``Context.meta``, where ``-v`` is noted)."""
    try:
        with command_line_errors():
            yield
    except (typer.Exit, typer.Abort, ClickException):
        raise  # typer's and click's own: they know how to end
    except JobFailed as exc:
        # The reason's first line says what went wrong: it goes on the error line; the
        # user's traceback frames, if any, follow below it.
        fail(f"job {exc.job_id} {ended(exc)}: {exc.reason}")
    except CmrError as exc:
        fail(str(exc))
    except (Interrupted, KeyboardInterrupt):
        fail("interrupted", code=INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (`cmr ... | head`): nothing to say. Point stdout at devnull so
        # the interpreter's last flush does not fail again (Python's docs, "SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from None
    except Exception as exc:
        if meta.get("cmr.verbose"):
            raise
        err.print(
            Text.assemble(
                ("error:", "bold red"),
                " unexpected ",
                safe_text(f"{type(exc).__name__}: {exc}"),
                "\n(a bug in cmr: run again with -v for the traceback, and report it)",
            ),
            highlight=False,
        )
        raise typer.Exit(1) from None


def interruptible(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; SIGINT or SIGTERM cancels it (it cleans up as it unwinds) and
    raises Interrupted."""

    async def runner() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await main
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(runner())
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise Interrupted from None
