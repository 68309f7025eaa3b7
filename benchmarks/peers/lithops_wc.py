"""Word count with Lithops (https://lithops-cloud.github.io): localhost backend and storage.

    python lithops_wc.py --workers 2 --scratch DIR --output DIR FILE...

``FunctionExecutor.map_reduce`` over line-aligned byte ranges of the input (cut like the
baseline's: about total / (workers x 8) bytes, 1-8 MiB): each map call reads its range
from the local file and returns a ``Counter``; one reduce call merges them. The localhost
backend runs the calls in ``--workers`` processes of this interpreter; its storage (call
payloads and results) lives under ``$TMPDIR/lithops-*``, a scratch directory that the
benchmark wipes itself, so Lithops' data cleaner (a process left running after exit) is
off. The configuration is passed in code: no ~/.lithops/config is read.

Output: ``part-00000`` of ``word<TAB>count`` lines under ``--output``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from byte_ranges import chunk_size, line_ranges


def count_range(path: str, start: int, end: int) -> Counter[str]:
    """The map function: the words of one byte range."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return Counter(data.decode("utf-8", "replace").split())


def merge(results: list[Counter[str]]) -> Counter[str]:
    """The reduce function."""
    total: Counter[str] = Counter()
    for part in results:
        total.update(part)
    return total


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    import lithops

    config = {
        "lithops": {
            "backend": "localhost",
            "storage": "localhost",
            "log_level": "WARNING",
            "data_cleaner": False,  # no cleaner process after exit: the benchmark wipes TMPDIR
        },
        "localhost": {"runtime": sys.executable, "worker_processes": a.workers},
    }
    chunk = chunk_size(a.files, a.workers)
    ranges = [r for p in a.files for r in line_ranges(p, chunk)]
    fexec = lithops.FunctionExecutor(config=config)
    fexec.map_reduce(count_range, ranges, merge)
    counts: Counter[str] = fexec.get_result()

    a.output.mkdir(parents=True, exist_ok=True)
    with (a.output / "part-00000").open("wb") as out:
        out.writelines(b"%s\t%d\n" % (w.encode("utf-8"), n) for w, n in counts.items())


if __name__ == "__main__":
    main(sys.argv[1:])
