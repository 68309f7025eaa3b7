"""The fleet's dependency lock: every package the wheel needs, pinned with the hashes of its
files, for the instances' Python (3.11 on Amazon Linux 2023). An instance installs exactly
these files (``pip install --require-hashes --only-binary :all:``): nothing is resolved at
boot, and a file that differs from the one locked is refused.

The lock is made at ``cmr fleet up`` with uv from the wheel's own requirements and those of
its ``loadgen`` extra (``FLEET_EXTRAS``), preferring the versions this machine runs (the ones
the user tested with), or given with ``--lock``.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import re
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path

from cmr.errors import FleetError
from cmr.fleet.wheel import sha256_of

LOCK_PREFIX = "fleet/locks"
TARGET_PYTHON = "3.11"  # AL2023's python3.11, as the user data installs it
# The default image is x86_64; each pinned version's lock line carries the hashes of all its
# files, so an aarch64 image finds its wheels there too.
TARGET_PLATFORM = "x86_64-manylinux_2_28"
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?==\S+")
# The extras every instance installs: the fleet serves the load generator's job by default
# (params.DEFAULTS["JobsFrom"]), and its tasks measure with the loadgen extra's histograms.
FLEET_EXTRAS = ("loadgen",)
_ONLY_EXTRA = re.compile(r"""^extra\s*==\s*['"]([A-Za-z0-9._-]+)['"]$""")


def lock_key(lock: Path) -> str:
    """Content-addressed, like the wheel's: the instance checks the lock against it."""
    return f"{LOCK_PREFIX}/{sha256_of(lock)}/requirements.txt"


def wheel_requirements(wheel: Path, extras: Sequence[str] = ()) -> list[str]:
    """The wheel's Requires-Dist: its own, and those of ``extras`` (without their marker);
    the other extras' left out."""
    try:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = email.parser.Parser().parsestr(z.read(name).decode("utf-8"))
    except (OSError, zipfile.BadZipFile, StopIteration, UnicodeDecodeError) as exc:
        raise FleetError(f"{wheel} is not a readable wheel: {exc}") from None
    wanted = []
    for entry in meta.get_all("Requires-Dist") or []:
        requirement, _, marker = (part.strip() for part in entry.partition(";"))
        if "extra" not in marker:
            wanted.append(entry)
        elif (only := _ONLY_EXTRA.match(marker)) is not None:
            if only[1] in extras:
                wanted.append(requirement)
        elif any(extra in marker for extra in extras):
            # e.g. `(python_version < "3.12") and extra == 'loadgen'`: not guessed at
            raise FleetError(f"{wheel}: cannot lock {entry!r} (a marker beyond its extra)")
    return wanted


def _installed_pins(project: str) -> list[str]:
    """name==version of every distribution this Python has, the project itself left out."""
    pins = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != project.lower():
            pins.add(f"{name}=={dist.version}")
    return sorted(pins)


def compile_lock(
    wheel: Path, outdir: Path, project: str = "cmr", extras: Sequence[str] = FLEET_EXTRAS
) -> Path:
    """Lock the wheel's requirements and its ``extras``' with uv (``UV_OFFLINE=1`` resolves
    from its cache)."""
    uv = shutil.which("uv")
    if uv is None:
        raise FleetError(
            "uv is needed to lock the fleet's dependencies with their hashes: install it "
            "(pip install uv), or pass --lock FILE (a `pip install --require-hashes` file)"
        )
    requirements = outdir / "requirements.in"
    requirements.write_text("\n".join(wheel_requirements(wheel, extras)) + "\n")
    # Constraints apply only to packages the wheel needs: the versions run here win.
    constraints = outdir / "constraints.txt"
    constraints.write_text("\n".join(_installed_pins(project)) + "\n")
    lock = outdir / "requirements.txt"
    cmd = [
        uv, "pip", "compile", "--quiet", "--generate-hashes", "--no-header", "--no-annotate",
        "--only-binary", ":all:", "--python-version", TARGET_PYTHON,
        "--python-platform", TARGET_PLATFORM, "--constraint", str(constraints),
        str(requirements), "--output-file", str(lock),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not lock.is_file():
        raise FleetError(
            f"locking the wheel's dependencies failed (uv pip compile); fix it or pass "
            f"--lock FILE:\n{done.stderr[-2000:]}"
        )
    check_lock(lock)
    return lock


def check_lock(lock: Path) -> None:
    """A lock pip accepts under --require-hashes: each requirement pinned (==) with hashes."""
    try:
        text = lock.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(f"cannot read the lock {lock}: {exc}") from None
    # A requirement and its continuation lines ("\\" at the end) are one entry.
    entries = [e.strip() for e in re.sub(r"\\\n", " ", text).splitlines()]
    entries = [e for e in entries if e and not e.startswith("#")]
    if not entries:
        raise FleetError(f"the lock {lock} names no requirement")
    for entry in entries:
        if not _REQUIREMENT.match(entry) or "--hash=sha256:" not in entry:
            shown = entry if len(entry) <= 80 else entry[:80] + "..."
            raise FleetError(
                f"the lock {lock} has {shown!r}: every line must pin one version (==) with "
                "its --hash=sha256: values (uv pip compile --generate-hashes writes such a file)"
            )
