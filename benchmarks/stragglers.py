"""One slow worker among four: how long a job takes with it, with and without backup
attempts for stragglers, against the same job with no slow worker (issue 30).

    scripts/stack.sh start
    .venv/bin/python benchmarks/stragglers.py [--mb 40] [--repeats 2] [--slowdown 10]
        [--workers 4] [--reducers 4] [--split-bytes 2000000] [--json F]

Each run submits ``cmr run examples/wordcount.py --store aws://... --detach`` on the first
``--mb`` MB of the real-text corpus, starts ``--workers`` ``cmr worker --job`` processes
(one CPU process each), and waits with ``cmr wait``. In a slowed run one worker (and its
CPU pool) runs under a SIGSTOP duty cycle: stopped for (1 - 1/slowdown) of every
PERIOD_S, so it makes 1/slowdown of its progress; nothing else differs. Runs of three kinds
alternate: no slow worker; one slowed, backups on (the default); one slowed, every worker
run with --no-backups. Reported: seconds from submit to the end of ``cmr
wait``, and whether the output equals a sequential count of the same text. Emulators'
figures (LocalStack and moto on the same 2 cores): the ratio is the point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from benchmarks.clouds import first_mb, output_of, sequential_count  # noqa: E402

PERIOD_S = 1.0  # one stop-and-go cycle of the slow worker
HEAD_START_S = 3.0  # the first worker alone this long (in both kinds of run): it holds tasks


def descendants(pid: int) -> list[int]:
    """pid and every process below it (its CPU pool, the pool's resource tracker)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            text = Path(f"/proc/{p}/task/{p}/children").read_text()
        except OSError:
            continue
        todo += [int(c) for c in text.split()]
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


@contextlib.contextmanager
def duty_cycle(pid: int, slowdown: float) -> Iterator[None]:
    """Stop ``pid``'s process tree for (1 - 1/slowdown) of every PERIOD_S until the block
    ends; it is left running."""
    done = threading.Event()
    go_s = PERIOD_S / slowdown

    def cycle() -> None:
        while not done.is_set():
            tree = descendants(pid)
            signal_all(tree, signal.SIGSTOP)
            if done.wait(PERIOD_S - go_s):
                signal_all(tree, signal.SIGCONT)
                return
            signal_all(tree, signal.SIGCONT)
            done.wait(go_s)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)
        signal_all(descendants(pid), signal.SIGCONT)


@dataclass
class Run:
    kind: str  # "plain" (no slow worker), "backups", "no-backups" (one slowed)
    seconds: float
    ok: bool
    job: str
    maps: int = 0
    partitions: int = 0
    slow_attempts: int = 0  # task attempts the slowed worker started (the job's timeline)
    slow_committed: int = 0  # of which committed (they counted)
    backups_map: int = 0  # backup attempts other workers started (the job's record)
    backups_reduce: int = 0
    attempts: list[dict[str, object]] | None = None  # the timeline, times from the submit
    slow_pid: int = 0


def show(run: Run, slow_pid_prefix: str) -> None:
    """The run's timeline, one line an attempt (seconds since the first start)."""
    rows = run.attempts or []
    t0 = min((float(a["started"]) for a in rows), default=0.0)  # type: ignore[arg-type]
    for a in rows:
        end = a["ended"]
        took = f"{float(end) - t0:6.1f}" if end is not None else "     -"  # type: ignore[arg-type]
        who = "SLOW" if str(a["worker"]).startswith(slow_pid_prefix) else str(a["worker"])[:10]
        print(
            f"   {a['kind']:>6} {a['task']:>3} {who:>10} {float(a['started']) - t0:6.1f} "  # type: ignore[arg-type]
            f"{took} {a['outcome']}{' backup' if a['backup'] else ''}",
            file=sys.stderr,
        )


def cmr(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cmr", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )


def timeline(store: str, job: str) -> list[dict[str, object]]:
    """The job's attempts, as the dashboard reads them (cmr.attempts)."""
    import asyncio

    from cmr import attempts
    from cmr.api import open_backend
    from cmr.settings import Store

    where = Store.parse(store)

    async def read() -> list[dict[str, object]]:
        async with open_backend(where.backend, where.aws) as be:
            return [a.to_json() for a in await attempts.attempts(be, job)]

    return asyncio.run(read())


def one_run(
    data: Path,
    out: Path,
    store: str,
    workers: int,
    reducers: int,
    split_bytes: int,
    slowdown: float | None,
    backups: bool,
) -> Run:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    started = time.monotonic()
    submitted = cmr(
        "run", str(REPO / "examples" / "wordcount.py"), "--input", str(data),
        "--output", str(out), "--store", store, "--reducers", str(reducers), "--detach",
        "--split-mb", str(split_bytes / 1_000_000), env=env,
    )  # fmt: skip
    if submitted.returncode != 0:
        raise SystemExit(f"submit failed:\n{submitted.stderr[-3000:]}")
    job = submitted.stdout.strip().splitlines()[-1]
    argv = [sys.executable, "-m", "cmr", "worker", "--store", store, "--job", job]
    argv += ["--processes", "1", "--map-slots", "1", "--reduce-slots", "1", "-v"]
    if not backups:
        argv.append("--no-backups")
    kind = "plain" if not slowdown else "backups" if backups else "no-backups"
    logs = [out.parent / f"worker-{kind}-{i}.log" for i in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, log in enumerate(logs):
            with log.open("wb") as err:
                procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err))
            if i == 0:
                # The worker to be slowed starts alone (in every kind of run): it takes its
                # share of tasks before the others come, as a slow machine of a fleet would.
                time.sleep(HEAD_START_S)
        slow = duty_cycle(procs[0].pid, slowdown) if slowdown else contextlib.nullcontext()
        with slow:
            waited = cmr("wait", job, "--store", store, env=env)
        seconds = time.monotonic() - started
        if waited.returncode != 0:
            raise SystemExit(f"job {job} did not succeed:\n{waited.stderr[-3000:]}")
    finally:
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(60)  # a --job worker stops once its job is cleaned up
            if p.poll() is None:
                p.kill()
                p.wait()
    status = json.loads(cmr("status", job, "--json", "--store", store, env=env).stdout)
    attempts = timeline(store, job)
    slowed = [a for a in attempts if str(a["worker"]).startswith(f"w{procs[0].pid}-")]
    return Run(
        kind,
        round(seconds, 2),
        True,
        job,
        int(status["progress"]["maps"]),
        int(status["progress"]["reduces"]),
        len(slowed),
        sum(1 for a in slowed if a["outcome"] == "committed"),
        int(status.get("backups_map", 0)),
        int(status.get("backups_reduce", 0)),
        attempts,
        procs[0].pid,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--reducers", type=int, default=4)
    # Many tasks a worker: the slowed one takes its share (a job of as many maps as
    # workers could leave it none).
    ap.add_argument("--split-bytes", type=int, default=2_000_000)
    ap.add_argument("--data", type=Path, default=HERE / "data" / "realtext-200mb-seed1")
    ap.add_argument("--scratch", type=Path, default=HERE / "out" / "stragglers")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--timelines", action="store_true", help="print each run's attempts")
    ap.add_argument(
        "--kinds",
        default="plain,backups,no-backups",
        help="which kinds of run, in this order (default: all three)",
    )
    args = ap.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"no corpus at {args.data}: make it with benchmarks/realtext.py")
    args.scratch.mkdir(parents=True, exist_ok=True)
    data = first_mb(args.data, args.mb, args.scratch / f"input-{args.mb:g}mb")
    reference = sequential_count(data)
    tag = uuid.uuid4().hex[:8]
    store = f"aws://cmr-strag-{tag}/cmr-strag-{tag}?prefix=cmrs{tag}-"
    runs: list[Run] = []
    try:
        for _ in range(args.repeats):
            for kind in args.kinds.split(","):
                slowdown = None if kind == "plain" else args.slowdown
                backups = kind != "no-backups"
                out = args.scratch / "out"
                run = one_run(
                    data,
                    out,
                    store,
                    args.workers,
                    args.reducers,
                    args.split_bytes,
                    slowdown,
                    backups,
                )
                run.ok = output_of(out) == reference
                runs.append(run)
                print(json.dumps({k: v for k, v in asdict(run).items() if k != "attempts"}))
                if args.timelines:
                    show(run, "w" + str(run.slow_pid) + "-")
    finally:
        from tests.stack import remove_test_resources

        with contextlib.suppress(Exception):
            remove_test_resources(f"cmr-strag-{tag}", f"cmr-strag-{tag}", f"cmrs{tag}-")

    def mean(kind: str) -> float:
        took = [r.seconds for r in runs if r.kind == kind]
        return sum(took) / len(took)

    ratios = {k: round(mean(k) / mean("plain"), 3) for k in ("backups", "no-backups")}
    for kind in ("plain", "backups", "no-backups"):
        took = " / ".join(f"{r.seconds:.1f}" for r in runs if r.kind == kind)
        print(f"{kind:>10}: {took} s" + (f" ({ratios[kind]:.2f}x)" if kind in ratios else ""))
    if args.json:
        doc = {
            "mb": args.mb,
            "slowdown": args.slowdown,
            "workers": args.workers,
            "runs": [asdict(r) for r in runs],
            "ratios": ratios,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
