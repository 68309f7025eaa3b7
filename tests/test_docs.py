"""The documentation's commands, run as a new user runs them, so that none can silently rot.

One fresh copy of the project (the files git tracks or would track: no .venv, no .stack, no
output of earlier runs) is made for the session. In it:

- the README's quick start runs exactly as written (``<!-- quickstart -->``): setup, the
  activation step, the first job, its output; then its local-stack part
  (``<!-- quickstart-stack -->``): a job submitted with ``--detach``, served by a
  ``cmr worker`` started afterwards, waited on by ``cmr wait``;
- each page of docs/ has a first example (``<!-- first-example: embedded|stack [exit=N] -->``
  before a ``sh`` block), run in that copy with its .venv activated: on the embedded
  backend, or on the local stack where the page is about it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.stack import stack_env

# One worker runs them all when the suite runs in parallel (scripts/test.sh: --dist
# loadgroup): the fresh copy and its quick start (a .venv set up by scripts/setup.sh) are
# made once, not once per worker. That set-up alone takes a minute: the full suite's.
pytestmark = [pytest.mark.xdist_group("docs"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKER = re.compile(
    r"<!-- first-example: (?P<where>embedded|stack)(?: exit=(?P<code>\d+))? -->\s*\n"
    r"```sh\n(?P<script>.*?)```",
    re.DOTALL,
)


def block(text: str, name: str) -> str:
    """The sh block between ``<!-- name -->`` and ``<!-- /name -->``."""
    found = re.search(rf"<!-- {name} -->\s*\n```sh\n(.*?)```\s*\n<!-- /{name} -->", text, re.DOTALL)
    assert found is not None, f"README.md has no <!-- {name} --> block"
    return found.group(1)


@dataclass(frozen=True)
class Example:
    page: str
    where: str
    code: int
    script: str


def first_example(page: Path) -> Example:
    found = MARKER.search(page.read_text(encoding="utf-8"))
    assert found is not None, f"{page.name} has no <!-- first-example: ... --> sh block"
    return Example(page.name, found["where"], int(found["code"] or 0), found["script"])


def tracked(repo: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    return [name for name in listed.split("\0") if name and (repo / name).is_file()]


@pytest.fixture(scope="session")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project as a clone of it would be, uncommitted work included."""
    root = tmp_path_factory.mktemp("fresh") / "cmr"
    for name in tracked(REPO):
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return root


def user_env(stack: bool) -> dict[str, str]:
    """A user's environment: this one without the test run's own venv on PATH (a new user
    has not activated one yet), with the local stack's settings where the page needs them."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    if stack:
        env.update(stack_env())
    return env


def with_uv(env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` with uv on PATH, which docs/fleet.md asks for (`cmr fleet up` builds and locks
    the wheel with it; without it, it tries ``python -m build``, which the copy's .venv has
    not): the user's own uv, else the copy's ``.tools/bin/uv``, the hash-checked uv that the
    README's scripts/setup.sh installs when it finds none (scripts/uv.sh), installed here if
    setup.sh ran ``python3 -m uv`` instead. scripts/test.sh puts the checkout's own on the
    suite's PATH likewise: without this, the page passed there and failed in a bare
    ``pytest`` run whose PATH had no uv."""
    if shutil.which("uv", path=env.get("PATH")) is not None:
        return env
    tools = root / ".tools" / "bin"
    if not (tools / "uv").exists():
        done = sh("source scripts/uv.sh\n_uv_bootstrap", root, env)
        assert done.returncode == 0, shown(done)
    return {**env, "PATH": os.pathsep.join([str(tools), env.get("PATH", "")])}


def sh(
    script: str, cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def shown(done: subprocess.CompletedProcess[str]) -> str:
    out, err = done.stdout[-3000:], done.stderr[-3000:]
    return f"exit {done.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


@pytest.fixture(scope="session")
def quick_start(fresh: Path) -> Path:
    """The README's quick start, exactly as written, in the fresh copy: it leaves the
    copy set up (.venv) for the pages' examples."""
    script = block((fresh / "README.md").read_text(encoding="utf-8"), "quickstart")
    done = sh(script, fresh, user_env(stack=False))
    assert done.returncode == 0, shown(done)
    assert (fresh / ".venv" / "bin" / "cmr").exists()
    return fresh


def test_readme_quick_start_runs_as_written(quick_start: Path) -> None:
    out = quick_start / "out" / "wordcount"
    assert (out / "_SUCCESS").is_file()
    counts = {}
    for part in sorted(out.glob("part-*")):
        for line in part.read_text().splitlines():
            word, n = line.split("\t")
            counts[word] = int(n)
    words = [
        w for f in sorted((quick_start / "examples" / "data").rglob("*")) if f.is_file()
        for w in f.read_text().split()
    ]  # fmt: skip
    assert sum(counts.values()) == len(words)


def test_readme_quick_start_on_the_local_stack(
    quick_start: Path, aws_stack: dict[str, str]
) -> None:
    """--detach, then a worker started afterwards, then cmr wait: the client that submitted
    is long gone when the job runs."""
    script = block((quick_start / "README.md").read_text(encoding="utf-8"), "quickstart-stack")
    done = sh("source .venv/bin/activate\n" + script, quick_start, user_env(stack=True))
    assert done.returncode == 0, shown(done)
    assert "succeeded" in done.stderr + done.stdout, shown(done)
    assert (quick_start / "out" / "stack-counts" / "_SUCCESS").is_file()


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_docs_page_first_example_runs(
    page: Path, quick_start: Path, request: pytest.FixtureRequest
) -> None:
    example = first_example(page)
    if example.where == "stack":
        request.getfixturevalue("aws_stack")
    done = sh(
        "source .venv/bin/activate\n" + example.script,
        quick_start,
        with_uv(user_env(stack=example.where == "stack"), quick_start),
    )
    assert done.returncode == example.code, shown(done)
    if example.code:
        assert done.stderr.startswith("error: "), shown(done)
