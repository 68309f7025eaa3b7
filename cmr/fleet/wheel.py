"""The project's wheel, which every fleet instance installs: where the checkout is, how the
wheel is built, and its content-addressed key in the bucket."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from cmr.errors import FleetError

TEMPLATE = "deploy/fleet.yaml"
WHEEL_PREFIX = "fleet/wheels"


def project_root(start: Path | None = None) -> Path:
    """The nearest directory up from ``start`` holding both pyproject.toml and the template."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / TEMPLATE).is_file():
            return d
    raise FleetError(f"no project with {TEMPLATE} at or above {here}: run from the cmr checkout")


def build_wheel(root: Path, outdir: Path) -> Path:
    """Build the project's wheel with uv (offline-capable) or, failing that, ``python -m build``."""
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "build", "--wheel", "--out-dir", str(outdir), str(root)]
    else:
        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(root)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(outdir.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise FleetError(f"building the wheel failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return wheels[-1]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel_key(wheel: Path) -> str:
    """Content-addressed key: a changed wheel is a new key, so the stack update rolls it out,
    and the whole sha256 in it is what every instance checks the wheel against before it
    installs it."""
    return f"{WHEEL_PREFIX}/{sha256_of(wheel)}/{wheel.name}"


def wheel_modules(wheel: Path) -> set[str]:
    """The dotted names of every module and package the wheel installs, read from its file
    list (nothing imported): what a fleet's --jobs-from can name."""
    names: set[str] = set()
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            parts = member.split("/")
            if not member.endswith(".py") or parts[0].endswith((".dist-info", ".data")):
                continue
            parts[-1] = parts[-1].removesuffix(".py")
            if parts[-1] == "__init__":
                parts.pop()
            # Each enclosing package too (namespace packages have no __init__.py).
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


def not_in_wheel(wheel: Path, modules: Iterable[str]) -> list[str]:
    """The modules of ``modules`` the wheel does not install."""
    have = wheel_modules(wheel)
    return [m for m in modules if m not in have]
