"""Every mistake in ``cases.py``, made the way a new user makes it: the ``cmr`` command in a
fresh directory. Each must get its answer in time, in one ``error:`` line that names the
culprit, with no traceback but the user's own frames, and without writing or destroying
any output. ``pytest tests/usage -q`` runs them all."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from tests.everyday import spread
from tests.usage.cases import CASES, Case
from tests.usage.harness import fill, part_lines, run_case

TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


# Each case is a `cmr` process of its own: the everyday subset runs one in twelve of them,
# spread over the sections of cases.py; the full suite all.
@pytest.mark.parametrize("case", spread(CASES, [c.id for c in CASES], every=12))
def test_a_mistake_gets_a_clear_answer_at_once(
    case: Case, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if case.needs_stack:
        request.getfixturevalue("aws_stack")
    got = run_case(case, tmp_path, dict(os.environ))
    shown = got.shown()
    assert math.isfinite(got.seconds), f"no answer within {case.seconds} s\n{shown}"
    assert got.code == case.code, shown
    names = [fill(n, got.values) for n in case.names]
    if case.keep_output:
        assert any(name.startswith("out/part-") for name in got.before), got.before

    if case.code == 0:
        assert "Traceback" not in got.text, shown
        for name in names:
            assert name in got.text, shown
        if case.expect_lines is not None:
            lines = part_lines(tmp_path / "out")
            if "--reducers" in got.argv and got.argv[got.argv.index("--reducers") + 1] == "1":
                assert lines == list(case.expect_lines), shown  # one part: its order too
            else:
                assert sorted(lines) == sorted(case.expect_lines), shown
        return

    # One error line that names the culprit.
    errors = [line for line in got.text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, shown
    for name in names:
        assert name in errors[0], f"{name!r} is not named in the error line\n{shown}"
    # No traceback but the user's own frames.
    frames = [m.group(1) for line in got.text.splitlines() if (m := FRAME.match(line))]
    if case.user_frames:
        assert frames, f"the user's frames are missing\n{shown}"
        assert all(f.endswith(case.user_frames) for f in frames), shown
    else:
        assert "Traceback" not in got.text and not frames, shown
    # Nothing written, nothing destroyed.
    assert got.after == got.before, shown


def test_the_troubleshooting_page_lists_every_case() -> None:
    section = TROUBLESHOOTING.read_text(encoding="utf-8")
    missing = [c.what for c in CASES if c.what not in section]
    assert not missing, f"docs/troubleshooting.md does not list: {missing}"


def test_there_are_at_least_sixty_cases_each_named_once() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) >= 60
    assert len(set(ids)) == len(ids)
