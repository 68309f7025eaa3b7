"""The pool's processes: what they see of the worker, and that they die with it.

Pool processes are forks of a fork server (started once per worker process, with cmr's
task modules loaded) where there is one. A fork inherits the server's state of the moment
it started; these check that a pool process sees the worker's working directory, import
path and environment as of the pool's start, as a spawned one would, and that a worker
killed outright takes its pool processes (and the server) with it at once, even in the
middle of a long task.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cmr.pool import CpuPool


def _what_a_task_sees(module: str) -> tuple[str, str | None, str]:
    return os.getcwd(), os.environ.get("CMR_TEST_POOL_SEES"), importlib.import_module(module).WHO


def test_a_pool_process_sees_the_worker_as_it_is_when_the_pool_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = CpuPool(1)  # the fork server (if any) starts here, before the changes below
    first.submit(os.getpid).result()
    first.shutdown()

    code = tmp_path / "code"
    code.mkdir()
    (code / "pool_sees_me.py").write_text("WHO = 'the job module'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setenv("CMR_TEST_POOL_SEES", "set after the first pool")
    pool = CpuPool(1)
    try:
        got = pool.submit(_what_a_task_sees, "pool_sees_me").result(timeout=30)
    finally:
        pool.shutdown()
    assert got == (str(tmp_path), "set after the first pool", "the job module")


WORKER = """
import os, sys, time
from cmr.pool import CpuPool

if __name__ == "__main__":
    pool = CpuPool(2)
    pids = [pool.submit(os.getpid).result() for _ in range(8)]
    for _ in range(2):
        pool.submit(time.sleep, 120)  # both processes busy with a long task
    from multiprocessing import forkserver
    server = forkserver._forkserver._forkserver_pid
    print(" ".join(map(str, sorted(set(pids)) + ([server] if server else []))), flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_worker_takes_its_busy_pool_processes_with_it(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    worker = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert worker.stdout is not None
        pids = [int(p) for p in worker.stdout.readline().split()]
        assert len(pids) >= 2, pids
        assert all(_alive(p) for p in pids)
        time.sleep(0.5)  # both tasks under way
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in pids if _alive(p)]
    finally:
        worker.kill()
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
    for p in left:  # do not leave them to sleep out their two minutes
        os.kill(p, signal.SIGKILL)
    assert left == [], f"pool processes outlived their killed worker: {left}"
