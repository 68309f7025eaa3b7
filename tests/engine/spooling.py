"""A reducer's spools written as the reducer writes them, for tests that call
cmr.cpu.reducing.run_reduce (or cmr.cpu.fixedsort) directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack


def spool_files(where: Path, groups: list[list[tuple[Any, Any]]]) -> list[str]:
    """One spool per group, its pairs packed one after the other (as batches arrive)."""
    packer = msgpack.Packer(use_bin_type=True)
    paths = []
    for i, pairs in enumerate(groups):
        path = where / f"spool-{i}"
        path.write_bytes(b"".join(packer.pack(p) for p in pairs))
        paths.append(str(path))
    return paths
