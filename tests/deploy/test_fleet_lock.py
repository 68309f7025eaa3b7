"""Which of a wheel's requirements the fleet locks: its own and its loadgen extra's (the
fleet's default job is the load generator's), no other extra's."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from cmr.errors import FleetError
from cmr.fleet.lock import FLEET_EXTRAS, wheel_requirements


def wheel(tmp_path: Path, *requires: str) -> Path:
    """A wheel whose METADATA names these Requires-Dist, as hatchling writes them."""
    path = tmp_path / "cmr-0.1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.4\nName: cmr\nVersion: 0.1.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("cmr-0.1.0.dist-info/METADATA", meta)
    return path


def test_the_fleet_locks_the_loadgen_extra_and_no_other(tmp_path: Path) -> None:
    built = wheel(
        tmp_path,
        "msgpack<2,>=1.1",
        "colorama; sys_platform == 'win32'",
        "hdrhistogram>=0.10; extra == 'loadgen'",
        'matplotlib>=3.9; extra == "loadgen"',
        "pytest>=8.3; extra == 'dev'",
        "mrjob==0.7.4; extra == 'mrjob'",
    )
    assert FLEET_EXTRAS == ("loadgen",)
    assert wheel_requirements(built, FLEET_EXTRAS) == [
        "msgpack<2,>=1.1",
        "colorama; sys_platform == 'win32'",
        "hdrhistogram>=0.10",
        "matplotlib>=3.9",
    ]
    assert wheel_requirements(built) == ["msgpack<2,>=1.1", "colorama; sys_platform == 'win32'"]


def test_a_marker_beyond_the_extra_is_refused_not_guessed(tmp_path: Path) -> None:
    built = wheel(tmp_path, "hdrhistogram>=0.10; python_version < '3.12' and extra == 'loadgen'")
    with pytest.raises(FleetError, match="a marker beyond its extra"):
        wheel_requirements(built, FLEET_EXTRAS)
    assert wheel_requirements(built) == []  # an extra not locked: left out as before
