"""Start-up cost of the CLI: ``cmr run --help`` and a small embedded word count.

Run from a checkout; ``--tree DIR`` measures another source tree (e.g. a ``git worktree``
of an older commit) with this venv's packages, so two trees are compared in one sitting::

    git worktree add /tmp/before HEAD~5
    .venv/bin/python benchmarks/startup.py --tree /tmp/before --label before --json a.json
    .venv/bin/python benchmarks/startup.py --label after --json b.json

Each command runs ``--repeat`` times as a fresh process (``python -m cmr ...``, so the tree's
own ``cmr`` is imported); the table shows the median and the fastest wall time. Also
reported: whether boto3 was imported by the embedded run (``-X importtime``) and how many
modules each command imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)  # ahead of the venv's editable install
    env.pop("AWS_ENDPOINT_URL", None)
    return env


def _timed(cmd: list[str], tree: Path, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=_env(tree), cwd=tree, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def _imports(cmd: list[str], tree: Path) -> tuple[int, bool]:
    """(modules imported, was boto3 among them) for one run under ``-X importtime``."""
    proc = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]],
        env=_env(tree),
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    names = [
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line and "cumulative" not in line
    ]
    return len(names), any(n == "boto3" or n.startswith("boto3.") for n in names)


def measure(tree: Path, repeat: int) -> dict[str, object]:
    py = sys.executable
    out = Path(tempfile.mkdtemp(prefix="cmr-startup-"))
    try:
        help_cmd = [py, "-m", "cmr", "run", "--help"]
        wc_cmd = [
            py,
            "-m",
            "cmr",
            "run",
            "examples/wordcount.py",
            "--input",
            "examples/data",
            "--output",
            str(out / "wc"),
            "--overwrite",
        ]
        rows: dict[str, object] = {}
        for name, cmd in (("run --help", help_cmd), ("embedded word count", wc_cmd)):
            times = _timed(cmd, tree, repeat)
            modules, boto3 = _imports(cmd, tree)
            rows[name] = {
                "median_s": statistics.median(times),
                "min_s": min(times),
                "times_s": times,
                "modules": modules,
                "imports_boto3": boto3,
            }
        return rows
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="source tree to measure")
    ap.add_argument("--label", default="", help="name of this tree in the table")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = measure(args.tree.resolve(), args.repeat)
    label = args.label or str(args.tree)
    print("| tree | command | median s | fastest s | modules | imports boto3 |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        assert isinstance(r, dict)
        print(
            f"| {label} | `cmr {name}` | {r['median_s']:.3f} | {r['min_s']:.3f} | "
            f"{r['modules']} | {'yes' if r['imports_boto3'] else 'no'} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"label": label, "tree": str(args.tree), "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
