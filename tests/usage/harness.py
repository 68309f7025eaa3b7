"""Run one case of ``cases.py`` the way a user would: the ``cmr`` command in a fresh
directory, with nothing of an earlier session (no ~/.aws, no remembered store). Shared by
the test (``test_mistakes.py``) and the benchmark of times to the answer
(``benchmarks/usage_answers.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.usage.cases import GOOD, Case, closed_port


@dataclass
class Outcome:
    argv: list[str]
    code: int
    text: str  # stdout, then stderr
    seconds: float  # to the answer; inf when there was none within the case's bound
    before: dict[str, bytes]  # the output files in place before the case ran
    after: dict[str, bytes]
    values: dict[str, str]  # what the placeholders of the case stood for

    def shown(self) -> str:
        return f"`cmr {' '.join(self.argv)}` said (exit {self.code}):\n{self.text}"


def fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def published(tmp: Path) -> dict[str, bytes]:
    """Every output file under the case's directory: manifests and parts."""
    return {
        str(p.relative_to(tmp)): p.read_bytes()
        for p in sorted(tmp.rglob("*"))
        if p.is_file() and (p.name == "_SUCCESS" or p.name.startswith("part-"))
    }


def part_lines(out: Path) -> list[str]:
    lines: list[str] = []
    for part in sorted(out.glob("part-*")):
        lines.extend(part.read_text(encoding="utf-8").splitlines())
    return lines


def _cmr(argv: list[str], tmp: Path, env: dict[str, str], seconds: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cmr", *argv],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"") + (exc.stderr or b"")
        text = said.decode(errors="replace") if isinstance(said, bytes) else said
        return -1, text, float("inf")
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def run_case(case: Case, tmp: Path, base_env: dict[str, str]) -> Outcome:
    """Set the case up in ``tmp`` (empty) and run it; ``base_env`` is the environment (the
    local stack's settings for a case that needs it; PYTHONPATH to time another tree)."""
    tmp = tmp.resolve()
    values = {
        "job": str(tmp / "job.py"),
        "good": str(tmp / "good.py"),
        "in": str(tmp / "in"),
        "out": str(tmp / "out"),
        "tmp": str(tmp),
        "closed": closed_port(),
        "tag": uuid.uuid4().hex[:8],
    }
    env = {k: v for k, v in base_env.items() if k != "CMR_STORE"}
    env.update(
        HOME=str(tmp / "home"),  # no ~/.aws, no state of an earlier run
        XDG_STATE_HOME=str(tmp / "state"),
        COLUMNS="100",
        NO_COLOR="1",
        TERM="dumb",
    )
    env.update({k: fill(v, values) for k, v in case.env.items()})
    (tmp / "good.py").write_text(GOOD)
    if case.source:
        (tmp / "job.py").write_text(case.source)
    if case.setup is not None:
        case.setup(tmp)
    if case.before:
        code, text, _ = _cmr([fill(a, values) for a in case.before], tmp, env, 60)
        if code != 0:
            raise AssertionError(f"the case's first command failed:\n{text}")
    before = published(tmp)
    argv = [fill(a, values) for a in case.argv]
    code, text, seconds = _cmr(argv, tmp / case.cwd, env, case.seconds)
    return Outcome(argv, code, text, seconds, before, published(tmp), values)
