"""Reading a split whose last line is long: cmr.split.read_split's time and peak RSS.

    PYTHONPATH=. .venv/bin/python benchmarks/long_line.py [--mib 16 32 64]

Each size runs in a fresh process (its peak RSS is its own): a file of one line of that
many MiB (no newline, sparse) read as split [0, 1) of the embedded blob store, with the
bound set past the line (the whole line is read). Before issue 26 the line grew by
``data += more`` per 64 KiB round, quadratic in its length (16, 32, 64 MiB: 7.1, 31.0,
87.1 s); now its pieces, growing to 4 MiB, are joined once.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1024 * 1024


def one(mib: int) -> None:
    from cmr.backends.embedded import EmbeddedBlobs
    from cmr.fileurls import file_url
    from cmr.split import read_split
    from cmr.wire import Range

    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "line.txt")
        with path.open("wb") as f:
            f.truncate(mib * MIB)
        r = Range(file_url(path), 0, 1, "line.txt")

        async def read() -> tuple[int, float]:
            t = time.perf_counter()
            data = await read_split(EmbeddedBlobs(), r, max_record=2 * mib * MIB)
            # Not the bytes out of asyncio.run: its task's repr would copy them, 4x.
            return len(data), time.perf_counter() - t

        size, took = asyncio.run(read())
        assert size == mib * MIB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{mib:>5} MiB line: {took:7.2f} s, peak RSS {peak:5.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one)
        return
    for mib in args.mib:
        subprocess.run([sys.executable, __file__, "--one", str(mib)], check=True)


if __name__ == "__main__":
    main()
