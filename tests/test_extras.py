"""What `scripts/setup.sh` installs, the README's first command: what a word count imports,
and no more. The load generator's libraries are the `loadgen` extra: without it `cmr
loadgen` says on one line what to install (exit 2), and `scripts/setup.sh loadgen` adds it.

Run as a new user runs it, in a copy of the project (no .venv) set up by `scripts/setup.sh`
itself, with uv's cache standing in for PyPI (as tests/deploy does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What setup.sh and the word count read in a checkout
COPIED = [
    "pyproject.toml",
    "README.md",
    "requirements.txt",
    "requirements-loadgen.txt",
    "requirements-azure.txt",
    "scripts",
    "cmr",
    "examples",
]
# The loadgen extra's distributions and what they bring (requirements-loadgen.txt's own)
EXTRA_ONLY = {"hdrhistogram", "matplotlib", "pillow", "fonttools", "contourpy", "kiwisolver"}
INSTALL = "pip install 'cmr[loadgen]' (in a checkout: scripts/setup.sh loadgen)"
JAM = ["loadgen", "jam", "--target", "sim", "--tasks", "1", "--readers", "2", "--writers", "2"]
JAM += ["--items", "2", "--duration", "0.5", "--json", "out/jam.json"]


def user_env() -> dict[str, str]:
    """This environment without the test run's venv on PATH (a new user has not activated
    one); uv installs from its cache, offline."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env["UV_OFFLINE"] = "1"
    return env


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=root, env=user_env(), capture_output=True, text=True, timeout=600, check=False
    )


def shown(done: subprocess.CompletedProcess[str]) -> str:
    out, err = done.stdout[-3000:], done.stderr[-3000:]
    return f"exit {done.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def normal(name: str) -> str:
    """A distribution's name as PEP 503 compares them (pydantic_core is pydantic-core)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: Path) -> set[str]:
    """The distributions a lock pins for this platform (none of its win32-only ones)."""
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+( ; [^\\]+)?", lock.read_text(), re.M)
    return {normal(name) for name, marker in pins if "win32" not in marker}


def installed(root: Path) -> set[str]:
    probe = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    )
    done = run(root, ".venv/bin/python", "-c", probe)
    assert done.returncode == 0, shown(done)
    return {normal(name) for name in json.loads(done.stdout)}


@pytest.mark.slow
def test_setup_installs_what_a_word_count_needs_and_loadgen_on_request(tmp_path: Path) -> None:
    root = tmp_path / "cmr"
    for name in COPIED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, root / name)

    done = run(root, "bash", "scripts/setup.sh")
    assert done.returncode == 0, shown(done)
    # exactly the runtime lock (and cmr): none of the load generator's libraries
    runtime = locked(root / "requirements.txt")
    assert installed(root) == runtime | {"cmr"}
    assert runtime & EXTRA_ONLY == set()
    assert locked(root / "requirements-loadgen.txt") >= EXTRA_ONLY
    for module in ("matplotlib", "hdrh"):
        done = run(root, ".venv/bin/python", "-c", f"import {module}")
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, shown(done)

    done = run(root, ".venv/bin/cmr", "run", "examples/wordcount.py",
               "--input", "examples/data", "--output", "out/wordcount")  # fmt: skip
    assert done.returncode == 0, shown(done)
    assert "succeeded" in done.stderr, shown(done)
    assert (root / "out" / "wordcount" / "_SUCCESS").is_file()

    # The help still answers; a load test is refused on one line that says what to install.
    for argv in (["--help"], ["loadgen", "--help"], ["loadgen", "jam", "--help"]):
        done = run(root, ".venv/bin/cmr", *argv)
        assert done.returncode == 0, shown(done)
    for plots in ([], ["--plots", "out/plots"]):
        done = run(root, ".venv/bin/cmr", *JAM, *plots)
        missing = "hdrhistogram and matplotlib are" if plots else "hdrhistogram is"
        flag = " --plots" if plots else ""
        assert done.returncode == 2, shown(done)
        assert done.stderr == (
            f"error: cmr loadgen{flag} needs the loadgen extra ({missing} not installed): "
            f"{INSTALL}\n"
        ), shown(done)
        assert not (root / "out" / "jam.json").exists()
    # A worker without the extra that is handed a load task: its error says the same.
    done = run(root, ".venv/bin/python", "-c", "import cmr.loadgen.job")
    assert done.returncode != 0, shown(done)
    assert f"No module named 'hdrh'; the load generator needs the loadgen extra: {INSTALL}" in (
        done.stderr
    ), shown(done)

    # Azure's SDKs are the azure extra: a run on Azure says so on one line, and nothing runs.
    done = run(root, ".venv/bin/cmr", "run", "examples/wordcount.py", "--input",
               "examples/data", "--output", "out/azure", "--store", "azure")  # fmt: skip
    assert done.returncode == 1, shown(done)
    assert done.stderr == (
        "error: the azure backend needs the azure extra (No module named 'azure'): "
        "pip install 'cmr[azure]' (in a checkout: scripts/setup.sh azure)\n"
    ), shown(done)

    done = run(root, "bash", "scripts/setup.sh", "loadgen")
    assert done.returncode == 0, shown(done)
    assert installed(root) == locked(root / "requirements-loadgen.txt") | {"cmr"}
    done = run(root, ".venv/bin/cmr", *JAM, "--plots", "out/plots")
    assert done.returncode == 0, shown(done)
    assert json.loads((root / "out" / "jam.json").read_text())["ops"], shown(done)
    assert (root / "out" / "plots" / "jam-latency.png").stat().st_size > 0

    done = run(root, "bash", "scripts/setup.sh", "azure")
    assert done.returncode == 0, shown(done)
    assert installed(root) >= locked(root / "requirements-azure.txt") | {"cmr"}
    done = run(root, ".venv/bin/python", "-c", "import cmr.backends.azure.opening")
    assert done.returncode == 0, shown(done)
