"""Word count with a Dask bag (https://docs.dask.org/en/stable/bag.html), processes scheduler.

    python dask_wc.py --workers 2 --scratch DIR --output DIR FILE...

``dask.bag.read_text`` with ``blocksize`` (about total / (workers x 8) bytes, 1-8 MiB, like
the baseline's chunks), ``linedelimiter="\\n"`` and ``errors="replace"``: Dask cuts each
file into blocks at b"\\n" and decodes every block with Python's own UTF-8 codec, so lines
and characters are exactly the baseline's. Then Dask's word count idiom:
``.map(str.split).flatten().frequencies()`` - a per-partition count and a tree reduction
of the partial counts - computed on the ``processes`` scheduler with ``--workers``
processes (its pool starts inside the timed run).

Output: ``part-00000`` of ``word<TAB>count`` lines under ``--output``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path


def block_size(files: list[str], workers: int) -> int:
    total = sum(Path(p).stat().st_size for p in files)
    return max(1 << 20, min(8 << 20, total // (workers * 8)))


def line_words(line: str) -> list[str]:
    """The words of one decoded line (Dask leaves its b"\\n" on it: whitespace)."""
    return line.split()


def count_lines(lines: list[str]) -> Counter[str]:
    """What the bag computes, without Dask: for checking the word definition."""
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(line_words(line))
    return counts


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    import dask
    import dask.bag as db

    lines = db.read_text(
        a.files,
        blocksize=block_size(a.files, a.workers),
        encoding="utf-8",
        errors="replace",
        linedelimiter="\n",
    )
    freqs = lines.map(line_words).flatten().frequencies()
    with dask.config.set(scheduler="processes", num_workers=a.workers):
        counts = freqs.compute()

    a.output.mkdir(parents=True, exist_ok=True)
    with (a.output / "part-00000").open("wb") as out:
        out.writelines(b"%s\t%d\n" % (w.encode("utf-8"), n) for w, n in counts)


if __name__ == "__main__":
    main(sys.argv[1:])
