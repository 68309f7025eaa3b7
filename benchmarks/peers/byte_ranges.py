"""Line-aligned byte ranges of input files, for the peers that read ranges themselves
(Lithops, Spark). Standard library only: it runs in every peer's venv, imported from the
runner's own directory."""

from __future__ import annotations

import itertools
import os
from pathlib import Path


def line_ranges(path: str | os.PathLike[str], chunk: int) -> list[tuple[str, int, int]]:
    """Byte ranges of about ``chunk`` bytes covering the file, each ending after a b"\\n"
    (the last one at the end of the file), each naming the file as a str."""
    size = Path(path).stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        pos = chunk
        while pos < size:
            f.seek(pos)
            while (block := f.read(1 << 16)) and b"\n" not in block:
                pos += len(block)
            if not block:
                break
            pos += block.index(b"\n") + 1
            if pos >= size:
                break
            cuts.append(pos)
            pos += chunk
    cuts.append(size)
    return [(str(path), a, b) for a, b in itertools.pairwise(cuts) if b > a]


def chunk_size(files: list[str], workers: int) -> int:
    total = sum(Path(p).stat().st_size for p in files)
    return max(1 << 20, min(8 << 20, total // (workers * 8)))
