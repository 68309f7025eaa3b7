"""Small files benchmark: the same bytes as N small files and as one file, word count on
the embedded backend; many small files must run at >= 1/1.5 of one file's MB/s.

    .venv/bin/python benchmarks/smallfiles.py [--size-mb 100] [--files 4000] [--repeat 3]
        [--seed 1] [--json out.json]

Both inputs come from one seeded corpus (word count's Zipf line pool): the one file is the
corpus; the small files are the same bytes cut at line ends into ``--files`` pieces of
about equal size, so their concatenation is the one file byte for byte. Each cmr output
is checked word for word against a ``Counter`` of the corpus. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog
from rich.console import Console
from rich.table import Table

import cmr.logs
from cmr.api import run_async

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from growth import compare, count_words, exit_status  # noqa: E402  (benchmarks/ is not a package)
from wordcount import cpu_seconds, line_pool, write_results  # noqa: E402

JOB = f"{HERE.parent / 'examples' / 'wordcount.py'}:WordCount"
MB = 1_000_000
GOAL = 1 / 1.5
console = Console(width=None if sys.stdout.isatty() else 200)


def corpora(size_mb: float, files: int, seed: int, root: Path = HERE / "data") -> tuple[Path, Path]:
    """(one file, directory of ``files`` small files) holding the same bytes."""
    base = root / f"smallfiles-{size_mb:g}mb-seed{seed}"
    one, many = base / "one.txt", base / f"many-{files}"
    if not one.exists():
        rng = random.Random(seed)
        pool = line_pool(rng)
        mean = sum(map(len, pool)) / len(pool)
        data = b"".join(rng.choices(pool, k=round(size_mb * MB / mean)))
        base.mkdir(parents=True, exist_ok=True)
        tmp = one.with_name(f".one.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.rename(one)
    if not many.is_dir():
        data = one.read_bytes()
        tmp_dir = base / f".many-{files}.{os.getpid()}.tmp"
        tmp_dir.mkdir()
        start = 0
        for i in range(files):
            # Cut after the first newline at or past the i-th equal share (the last piece
            # takes the rest): every piece holds whole lines, none is empty.
            target = len(data) * (i + 1) // files
            end = len(data) if i == files - 1 else data.find(b"\n", max(target, start) - 1) + 1
            if end <= start:
                end = len(data)
            (tmp_dir / f"{i // 100:03d}" / f"f{i:05d}.txt").parent.mkdir(exist_ok=True)
            (tmp_dir / f"{i // 100:03d}" / f"f{i:05d}.txt").write_bytes(data[start:end])
            start = end
            if start >= len(data):
                break
        tmp_dir.rename(many)
    return one, many


@dataclass
class Row:
    name: str
    files: int
    mb: float
    seconds: float | None = None  # the fastest trial
    trials: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    maps: int = 0
    mb_s: float | None = None
    exact: bool | None = None


def trial(row: Row, path: Path, out: Path, want: Counter[str]) -> None:
    cpu, wall = cpu_seconds(), time.perf_counter()
    result = asyncio.run(run_async(JOB, str(path), str(out), overwrite=True))
    row.trials.append(time.perf_counter() - wall)
    row.cpu_s.append(cpu_seconds() - cpu)
    row.maps = int(result.record["maps_done"])
    if row.exact is None:  # the same input gives the same output; check it once
        diff = compare(Counter(want), result.parts)
        row.exact = not diff
        if diff:
            console.print(f"[bold red]MISMATCH for {row.name}:[/]\n" + "\n".join(diff))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved trials; fastest counts")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--data", type=Path, default=HERE / "data", help=argparse.SUPPRESS)
    ap.add_argument("--out-root", type=Path, default=HERE / "out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not structlog.is_configured():
        cmr.logs.configure()

    one, many = corpora(args.size_mb, args.files, args.seed, args.data)
    small = sorted(p for p in many.rglob("*") if p.is_file())
    if b"".join(p.read_bytes() for p in small) != one.read_bytes():
        raise SystemExit("the small files do not hold the same bytes as the one file")
    mb = one.stat().st_size / MB
    want = count_words([one])
    rows = [Row("one file", 1, mb), Row(f"{len(small)} small files", len(small), mb)]
    load_before = os.getloadavg()
    for _ in range(args.repeat):
        trial(rows[0], one, args.out_root / f"{one.parent.name}-one", want)
        trial(rows[1], many, args.out_root / f"{one.parent.name}-many", want)
    load_after = os.getloadavg()
    for r in rows:
        r.seconds = min(r.trials)
        r.mb_s = r.mb / r.seconds
    ratio = (rows[1].mb_s or 0) / (rows[0].mb_s or 1)
    cpu_ratio = min(rows[0].cpu_s) / min(rows[1].cpu_s)

    t = Table(
        title=f"small files: word count, {mb:.1f} MB, embedded, {os.cpu_count()} cores, "
        f"best of {args.repeat}"
    )
    for c in ("input", "files", "map tasks", "seconds", "MB/s", "CPU s", "exact", "trials (s)"):
        t.add_column(c, justify="left" if c in ("input", "exact", "trials (s)") else "right")
    for r in rows:
        t.add_row(
            r.name,
            str(r.files),
            str(r.maps),
            f"{r.seconds:.2f}",
            f"{r.mb_s:.1f}",
            f"{min(r.cpu_s):.1f}",
            {None: "-", True: "[green]yes[/]", False: "[bold red]NO[/]"}[r.exact],
            " ".join(f"{s:.2f}" for s in r.trials),
        )
    console.print(t)
    met = ratio >= GOAL
    console.print(
        f"small files MB/s / one file MB/s = {ratio:.2f} (goal >= {GOAL:.2f}: "
        f"{'met' if met else 'NOT met'}); CPU s one/small = {cpu_ratio:.2f}"
    )
    console.print(f"load average: before {load_before}, after {load_after}")
    if args.json:
        write_results(
            args.json,
            {
                "load_average_before": load_before,
                "load_average_after": load_after,
                "rows": [asdict(r) for r in rows],
                "ratio": ratio,
                "cpu_ratio": cpu_ratio,
                "goal": GOAL,
                "met": met,
            },
        )
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
