"""docs/security.md's threat model table names only tests that exist.

Each row's "backed by" cell lists pytest node ids; they are collected (``--collect-only``,
no test runs) and every one must be among them, so the table cannot lean on a test that
was renamed, removed or never written.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "security.md"
CAPABILITIES = (
    "queue writer",
    "queue reader and writer",
    "bucket writer",
    "table writer",
    "input-directory writer",
    "a worker's credentials",
)
NODE = re.compile(r"`(tests/[\w/]+\.py::[^`\s]+)`")


def rows() -> dict[str, list[str]]:
    """The table's rows: capability -> the node ids its "backed by" cell names."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(r"<!-- threat-model -->\n(.*?)<!-- /threat-model -->", text, re.DOTALL)
    assert found is not None, "docs/security.md has no <!-- threat-model --> table"
    lines = [line for line in found.group(1).splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["capability", "can", "cannot", "backed by"], header
    table = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, line
        name = re.search(r"\*\*(.+?)\*\*", cells[0])
        assert name is not None, f"a row names no capability in bold: {cells[0]}"
        table[name.group(1)] = NODE.findall(cells[3])
    return table


def collected(files: set[str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *files],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def test_every_capability_has_a_row_backed_by_tests() -> None:
    table = rows()
    assert tuple(table) == CAPABILITIES
    for name, ids in table.items():
        assert ids, f"the row {name!r} names no test"


@pytest.mark.slow
def test_every_test_the_table_names_exists() -> None:
    ids = {i for named in rows().values() for i in named}
    have = collected({i.split("::", 1)[0] for i in ids})
    # A test named without its parameters stands for all of them.
    missing = sorted(
        i for i in ids if i not in have and not any(h.startswith(i + "[") for h in have)
    )
    assert missing == [], f"docs/security.md names tests that do not exist: {missing}"
