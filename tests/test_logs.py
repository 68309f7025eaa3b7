"""cmr's log lines go to stderr as it is when they are written, whoever swapped it since
logging was configured."""

from __future__ import annotations

import io
import sys

import pytest

from cmr import logs


def test_a_log_line_goes_to_the_stderr_of_now_not_of_configure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A process that configured logging while stderr was another file (a test harness's
    capture, a CLI invoked in-process) and closed that file since: every later log line
    failed with "I/O operation on closed file" (a reducer's warning, in the full suite)."""
    swapped = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    before = sys.stderr
    sys.stderr = swapped
    try:
        logs.configure()
    finally:
        sys.stderr = before
    swapped.close()
    logs.get_logger("cmr.test").warning("still heard", partition=3)
    err = capsys.readouterr().err
    assert "still heard" in err and "partition=3" in err
