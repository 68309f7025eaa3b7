"""``cmr loadgen ... --json -``: the results as one JSON document on stdout (the tables on
stderr), for a pipe into jq or another program; the same document as ``--json FILE``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_jam_prints_its_json_alone_on_stdout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cmr", "loadgen", "jam", "--target", "sim", "--tasks", "1",
         "--readers", "2", "--writers", "2", "--ops", "100", "--json", "-"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # nothing but the document
    assert (data["target"], data["tasks"]) == ("sim", 1)
    assert sum(o["count"] for o in data["ops"]) == 100
    assert "Median (ms)" in proc.stderr and "get eventual" in proc.stderr  # the table
    assert "results:" not in proc.stderr
    assert not (tmp_path / "-").exists()  # not a file named '-'
