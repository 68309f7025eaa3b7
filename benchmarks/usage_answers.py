"""How long each mistake of ``tests/usage/cases.py`` takes to get its answer, and whether
the answer was the right one (exit status and culprit named in the ``error:`` line), for
this tree and, in the same sitting, for another checkout of cmr (``--baseline DIR``, e.g.
a ``git worktree`` of the commit before issue 13).

    python benchmarks/usage_answers.py [--baseline /tmp/cmr-old] [--only ID ...] [--json out.json]

Cases that need the local stack run when it is up (``eval "$(scripts/stack.sh env)"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.stack import stack_env, stack_up
from tests.usage.cases import CASES, Case
from tests.usage.harness import Outcome, fill, run_case

ROOT = Path(__file__).resolve().parent.parent


def _right(case: Case, got: Outcome) -> bool:
    if got.code != case.code or not math.isfinite(got.seconds):
        return False
    names = [fill(n, got.values) for n in case.names]
    if case.code == 0:
        return all(n in got.text for n in names)
    errors = [line for line in got.text.splitlines() if line.startswith("error:")]
    return len(errors) == 1 and all(n in errors[0] for n in names) and got.after == got.before


def _measure(case: Case, tree: Path) -> tuple[float, bool]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    if case.needs_stack:
        env.update(stack_env())  # as the test's aws_stack fixture does
    with tempfile.TemporaryDirectory(prefix="cmr-usage-") as tmp:
        try:
            got = run_case(case, Path(tmp), env)
        except AssertionError:
            return math.nan, False  # the case's set-up run failed on this tree
        return got.seconds, _right(case, got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another cmr checkout, timed alongside")
    ap.add_argument("--only", nargs="*", default=[], help="case ids")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    up = stack_up()
    trees = {"now": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    rows: list[dict[str, Any]] = []
    for case in CASES:
        if (args.only and case.id not in args.only) or (case.needs_stack and not up):
            continue
        row: dict[str, Any] = {"id": case.id, "what": case.what}
        for name, tree in trees.items():
            seconds, right = _measure(case, tree)
            row[name] = {
                "seconds": None if not math.isfinite(seconds) else round(seconds, 2),
                "right": right,
            }
        rows.append(row)
        cells = "  ".join(f"{n}: {row[n]}" for n in trees)
        print(f"{case.id:28s} {cells}", flush=True)
    for name in trees:
        count = sum(1 for r in rows if r[name]["right"])
        print(f"{name}: {count}/{len(rows)} right")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
