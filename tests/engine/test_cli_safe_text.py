"""Text from outside (error messages, job records, exception texts, file names) reaches the
terminal inert: never read as Rich markup, control characters shown as escapes, never
obeyed; the command still ends with its one ``error:`` line and exit 1."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import typer
from typer.testing import CliRunner

from cmr import lifecycle
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cli import app
from cmr.cli.exits import exit_codes
from cmr.cli.options import safe_text
from cmr.records import JobState
from cmr.settings import AwsSettings

# Markup that would crash or restyle, a trailing backslash Rich's escape() doubles, and the
# escapes that clear the screen, set the window title and ring the bell.
HOSTILE = "[/x] [bold]b\\[/x \x1b[2J\x1b]0;pwn\x07 \x9b31m\r\u202e\\"
SHOWN = "[/x] [bold]b\\[/x \\x1b[2J\\x1b]0;pwn\\x07 \\x9b31m\\r\\u202e\\"
NAME, NAME_SHOWN = HOSTILE.replace("/", "~"), SHOWN.replace("/", "~")  # as a file name


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (HOSTILE, SHOWN),
        ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
        ("nul\x00 del\x7f bs\x08 isolate\u2066", "nul\\x00 del\\x7f bs\\x08 isolate\\u2066"),
        ("naïve ∑ 文字", "naïve ∑ 文字"),  # printable text of any script is left alone
    ],
)
def test_safe_text_shows_controls_as_escapes_and_is_never_markup(raw: str, shown: str) -> None:
    assert safe_text(raw).plain == shown
    assert safe_text(raw).spans == []  # no style came from the text itself


# `cmr run` and `cmr.run` configure structlog (under CliRunner, onto its stderr): restored
# after each test (tests/engine/conftest.py).
pytestmark = pytest.mark.usefixtures("logs_restored")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result.exit_code, result.stdout + result.stderr


def _inert(text: str, *, crashed: bool = False) -> None:
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\x9b" not in text
    assert "\r" not in text
    assert "\u202e" not in text
    assert crashed or "Traceback" not in text  # cmr's own error path shows none


def test_an_error_message_with_markup_and_escapes_prints_as_text(tmp_path: Path) -> None:
    missing = str(tmp_path / HOSTILE)
    code, text = _cli(
        "run", "examples/wordcount.py", "--input", missing, "--output", str(tmp_path / "o")
    )
    assert code == 1
    _inert(text)
    # The name holds "[", a glob character: a name that does not exist is a pattern (Hadoop's
    # rule for input paths), and the answer names it, inert, as typed.
    assert f"error: input pattern {tmp_path}/{SHOWN} matches no files" in text


def test_a_failed_jobs_reason_prints_as_text(tmp_path: Path) -> None:
    job = tmp_path / "hostile.py"
    job.write_text(
        "import cmr\n\n"
        "class Hostile(cmr.Job):\n"
        "    def map(self, key, line):\n"
        f"        raise ValueError({HOSTILE!r})\n"
        "    def reduce(self, key, values):\n"
        "        yield key, 0\n"
    )
    (tmp_path / "in.txt").write_text("one line\n")
    code, text = _cli(
        "run", str(job), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o"),
        "--max-task-attempts", "1", "--no-progress",
    )  # fmt: skip
    assert code == 1
    # What the error printer wrote (the log lines before it are cmr.logs' to make inert). A
    # failed job's reason is its task's traceback.
    printed = text[text.index("error: job") :]
    _inert(printed, crashed=True)
    assert "failed: " in printed
    assert f"ValueError: {SHOWN}" in printed  # the task's traceback, from the job record


def test_a_job_files_import_error_prints_as_text(tmp_path: Path) -> None:
    job = tmp_path / "broken.py"
    job.write_text(f"raise ValueError({HOSTILE!r})\n")
    (tmp_path / "in.txt").write_text("x\n")
    code, text = _cli(
        "run", str(job), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 1
    _inert(text)
    assert f"ValueError: {SHOWN}" in text


def test_an_unexpected_errors_text_prints_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    # The printer of the "a bug in cmr" path, fed an exception from anywhere.
    with pytest.raises(typer.Exit) as ended, exit_codes({}):
        raise RuntimeError(HOSTILE)
    assert ended.value.exit_code == 1
    text = capsys.readouterr().err
    _inert(text)
    assert f"error: unexpected RuntimeError: {SHOWN}" in text


@pytest.mark.usefixtures("aws_stack")
@pytest.mark.slow
async def test_status_shows_a_hostile_error_reason_from_the_table_as_text(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = tmp_path / f"in-{NAME}"  # the input column shows this name
    data.mkdir()
    (data / "a.txt").write_text("a b\n")
    result = await run_on(
        be, "examples/wordcount.py", str(data), str(tmp_path / "o"), reducers=1, workers=0,
        detach=True, aws=settings,
    )  # fmt: skip
    spec, _ = await lifecycle.load_spec(be, result.job_id)
    # What anyone who can write the table could leave as a job's error reason.
    assert await lifecycle.end(be, spec, JobState.FAILED, reason=HOSTILE)
    store = f"aws://{settings.bucket}/{settings.table}?prefix={settings.queue_prefix}"
    env = {**os.environ, "COLUMNS": "400"}  # no wrapping: one cell, one line
    try:
        shown = {}
        for view, args in (("one", [result.job_id]), ("list", [])):
            got = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "cmr", "status", *args, "--store", store],
                capture_output=True, text=True, env=env, timeout=120, check=False,
            )  # fmt: skip
            assert got.returncode == 0, got.stderr
            _inert(got.stdout + got.stderr)
            shown[view] = got.stdout
        assert f"error: {SHOWN}" in shown["one"]  # the reason, from the table
        assert f"in-{NAME_SHOWN}" in shown["list"]  # the input column
    finally:
        await lifecycle.cleanup(be, spec, JobState.FAILED)


def test_log_lines_are_inert(capsys: pytest.CaptureFixture[str]) -> None:
    """A rejected message's reason or a job's error quoted in a log line cannot reach the
    terminal as escapes either."""
    from cmr import logs

    logs.configure()
    try:
        structlog.get_logger().warning("rejected a message", reason=HOSTILE)
    finally:
        structlog.reset_defaults()
    line = capsys.readouterr().err
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b[2J" in line
