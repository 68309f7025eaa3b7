"""The project's wheel, which every fleet instance installs: where the checkout is, how the
wheel is built, and its content-addressed key in the bucket."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
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
