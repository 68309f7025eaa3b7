"""What fenced publication costs: this tree against an earlier commit, in one sitting.

    .venv/bin/python benchmarks/publication.py --size-mb 200 --baseline-ref 5fe6ef4 --repeat 3
    .venv/bin/python benchmarks/publication.py --size-mb 20 --backends aws   # the local stack
    .venv/bin/python benchmarks/publication.py --job grep --backends aws       # big parts

For each side ("before": ``--baseline-ref``, checked out into a temporary git worktree;
"after": this working tree) and each backend, a child process runs word count over the same
corpus (``benchmarks/wordcount.py``'s) with its workers in that process, so every request
is counted, and reports:

* ``seconds``: the whole job, submit to the job's end as the runner sees it;
* ``publish_s``: the publication of the parts inside it. Before: the wall time from the
  first part copy (download + upload through local disk) to the last, by the finalizer that
  succeeded. After: the ``publish`` call that wrote the manifest (server-side copies, then
  the conditional ``_SUCCESS``);
* ``requests``: every request of the job, by operation (submit, tasks, publication,
  cleanup), and their total.

The output is checked word for word against a plain ``Counter`` of the corpus. ``--job grep``
runs ``examples/grep.py`` with a pattern most lines match instead, so that the parts are
nearly as large as the input (word count's are well under 1 MB at any input size): what a
publisher copies then matters. Its output is checked by the count of matching lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

# Runs inside the child, with PYTHONPATH pointing at one side's tree. It uses only what both
# sides share (run_on, Worker, cpu_pool, open_backend, the settings) and patches the one
# function of each side that publishes, to time it.
CHILD = r"""
import asyncio, json, sys, time
from cmr import api
from cmr.settings import AwsSettings, WorkerSettings
from cmr.worker import Worker

backend, src, out, bucket, job, params = sys.argv[1:7]
spans = []

def timed(module, name):
    inner = getattr(module, name)
    async def wrapper(*args, **kwargs):
        t0 = time.monotonic()
        result = await inner(*args, **kwargs)
        spans.append((t0, time.monotonic()))
        return result
    setattr(module, name, wrapper)

try:
    try:
        import cmr.finalize as finishing  # the module that calls publish
    except ImportError:
        from cmr import janitor as finishing  # where it was before cmr.finalize
    timed(finishing, "publish")
    side = "after"
except ImportError:
    from cmr import lifecycle
    timed(lifecycle, "_copy")
    side = "before"

async def main():
    aws = AwsSettings(bucket=bucket, table=bucket, queue_prefix=bucket + "-")
    ws = WorkerSettings(poll_s=0.1 if backend == "embedded" else 1.0)
    async with api.open_backend(backend, aws) as be:
        before = be.calls()
        workers = []
        with api.cpu_pool(ws.processes) as pool:
            tasks = []
            def start(job_id):
                if backend != "embedded":
                    workers.append(Worker(be, ws, pool, only_job=job_id))
                    tasks.append(asyncio.create_task(workers[-1].run()))
            t0 = time.monotonic()
            try:
                result = await api.run_on(
                    be, job, src, out, aws=aws, params=json.loads(params),
                    workers=1 if backend == "embedded" else 0,
                    worker_settings=ws, on_submit=start, overwrite=True,
                )
            finally:
                for w in workers:
                    w.done.set()
                await asyncio.gather(*tasks, return_exceptions=True)
            seconds = time.monotonic() - t0
        calls = be.calls() - before
        texts = [(await be.blobs.get(p)).decode() if "://" in p and not p.startswith("file://")
                 else open(p, encoding="utf-8").read() for p in result.parts]
    if side == "before":
        publish_s = max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0.0
    else:
        publish_s = max(e - s for s, e in spans) if spans else 0.0
    print(json.dumps({"side": side, "seconds": seconds, "publish_s": publish_s,
                      "requests": dict(calls), "total": sum(calls.values()),
                      "parts": texts, "job": result.job_id}))

asyncio.run(main())
"""


def worktree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="cmr-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), ref],
        check=True,
        capture_output=True,
    )
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
        check=False,
        capture_output=True,
    )


JOBS = {  # name: (job file, params)
    "wordcount": ("examples/wordcount.py", {}),
    "grep": ("examples/grep.py", {"pattern": "e"}),
}


def one(tree: Path, backend: str, src: Path, out: str, bucket: str, job: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    path, params = JOBS[job]
    got = subprocess.run(
        [sys.executable, "-c", CHILD, backend, str(src), out, bucket, path, json.dumps(params)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if got.returncode != 0:
        raise RuntimeError(f"{tree} {backend}: {got.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    return row


def counted(texts: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in texts:
        for line in text.splitlines():
            word, _, n = line.rpartition("\t")
            counts[word] += int(n)
    return counts


def matched(texts: list[str]) -> int:
    """How many lines grep's output holds (``source<TAB>[line, ...]`` per source)."""
    return sum(
        len(json.loads(line.split("\t", 1)[1]))
        for text in texts
        for line in text.split("\n")  # (not splitlines: values may hold U+2028 and such)
        if line
    )


def lines_with_e(files: list[Path]) -> int:
    return sum(1 for f in files for line in f.open("rb") if b"e" in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline-ref", default="5fe6ef4", help="the commit to compare with")
    ap.add_argument("--backends", default="embedded", help="embedded,aws")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--job", choices=sorted(JOBS), default="wordcount")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from wordcount import baseline, corpus

    src = corpus(a.size_mb, a.seed)
    files = sorted(p for p in src.iterdir() if p.is_file())
    want: object = baseline(files) if a.job == "wordcount" else lines_with_e(files)
    check = counted if a.job == "wordcount" else matched
    base = worktree(a.baseline_ref)
    rows: list[dict[str, Any]] = []
    try:
        for backend in a.backends.split(","):
            for trial in range(a.repeat):
                for side, tree in (("before", base), ("after", ROOT)):
                    bucket = f"cmr-pub-{side}-{trial}-{int(time.time())}"
                    out = (
                        str(Path(tempfile.mkdtemp(prefix="cmr-pub-out-")) / "out")
                        if backend == "embedded"
                        else f"s3://{bucket}/out/"
                    )
                    row = one(tree, backend, src, out, bucket, a.job)
                    texts = row.pop("parts")
                    row["output_mb"] = sum(len(t.encode()) for t in texts) / 1e6
                    exact = check(texts) == want
                    row.update(backend=backend, trial=trial, exact=exact)
                    rows.append(row)
                    print(
                        f"{backend:8} {side:6} trial {trial}: {row['seconds']:7.2f} s, "
                        f"publish {row['publish_s'] * 1000:8.1f} ms, {row['total']:5} requests, "
                        f"output {row['output_mb']:.1f} MB"
                        f"{'' if exact else '  OUTPUT DIFFERS'}",
                        flush=True,
                    )
    finally:
        drop_worktree(base)
    print()
    print("| backend | side | best s | publish ms (best trial) | requests | exact |")
    print("|---|---|---:|---:|---:|---|")
    for backend in a.backends.split(","):
        for side in ("before", "after"):
            mine = [r for r in rows if r["backend"] == backend and r["side"] == side]
            best = min(mine, key=lambda r: r["seconds"])
            pub = min(r["publish_s"] for r in mine)
            print(
                f"| {backend} | {side} | {best['seconds']:.2f} | {pub * 1000:.1f} | "
                f"{best['total']} | {all(r['exact'] for r in mine)} |"
            )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
