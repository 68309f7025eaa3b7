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


def _run(script: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` written to ``script`` and run as a worker's main program, in ``cwd``; it
    must exit 0."""
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], check=False, cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


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
    pids = list(pool._pool._processes)  # both, however the tasks below are shared
    for _ in range(2):
        pool.submit(time.sleep, 120)  # both processes busy with a long task
    from multiprocessing import forkserver
    server = forkserver._forkserver._forkserver_pid
    print(" ".join(map(str, sorted(pids) + ([server] if server else []))), flush=True)
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
        assert len(pids) in (2, 3), pids  # the pool's two, and the fork server if any
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


PROBE = """
import sys

def where(name):
    return sys.modules[name].__file__ if name in sys.modules else __import__(name).__file__
"""

SHADOWED = """
import json
from cmr.pool import CpuPool
from probe import where

if __name__ == "__main__":
    pool = CpuPool(1)
    print(json.dumps([where("json"), pool.submit(where, "json").result(timeout=60)]))
    pool.shutdown()
"""


def test_a_module_in_the_working_directory_does_not_replace_the_pools_own(tmp_path: Path) -> None:
    """A user's json.py in the directory a worker runs in is not the json of its pool
    processes (nor does it run in the fork server): they import what the worker imports,
    from its import path. Python 3.11's fork server put its working directory first."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "json.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n"
        "raise SystemExit('a user script named json.py')\n"
    )
    script = tmp_path / "code" / "worker.py"
    script.parent.mkdir()
    (script.parent / "probe.py").write_text(PROBE)
    done = _run(script, SHADOWED, here)
    worker, pool = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert worker == pool, (worker, pool)
    assert not (here / "RAN").exists()


FORKED = """
import multiprocessing, os, sys
from cmr.pool import CpuPool

def in_a_fork(q):
    pool = CpuPool(1)
    q.put(pool.submit(os.getpid).result(timeout=60) != os.getpid())
    pool.shutdown()

if __name__ == "__main__":
    first = CpuPool(1)  # this process's fork server starts
    first.submit(os.getpid).result()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=in_a_fork, args=(q,))
    child.start()
    print("fork:", q.get(timeout=60), flush=True)
    child.join(30)
    print("exit:", child.exitcode, flush=True)
    first.shutdown()
"""


def test_a_process_forked_from_a_worker_starts_a_pool_of_its_own(tmp_path: Path) -> None:
    """A fork of a worker whose fork server runs inherits the worker's record of it, which
    it cannot use (the server is not its child): it starts its own."""
    script = tmp_path / "forked.py"
    done = _run(script, FORKED, tmp_path)
    assert done.stdout.splitlines() == ["fork: True", "exit: 0"], done.stdout + done.stderr


def test_a_users_own_fork_server_preload_is_kept(tmp_path: Path) -> None:
    code = (
        "import multiprocessing as mp\n"
        "from cmr.pool import CpuPool\n"
        "if __name__ == '__main__':\n"
        "    mp.set_forkserver_preload(['xml.dom.minidom'])\n"
        "    pool = CpuPool(1)\n"
        "    from multiprocessing import forkserver\n"
        "    print(forkserver._forkserver._preload_modules[0])\n"
        "    pool.shutdown()\n"
    )
    script = tmp_path / "preload.py"
    done = _run(script, code, tmp_path)
    assert done.stdout.strip() == "xml.dom.minidom"


STOPPED = """
import os, resource, time
from cmr import poolstart
from cmr.pool import CpuPool
from probe import burn

def children():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime

if __name__ == "__main__":
    before = children()
    pool = CpuPool(1)
    burned = pool.submit(burn, 0.5).result(timeout=60)
    pool.shutdown()
    poolstart.stop_server()
    counted = children() - before
    again = CpuPool(1)  # and a pool starts after it
    other = again.submit(os.getpid).result(timeout=60) != os.getpid()
    again.shutdown()
    print(burned >= 0.5, counted >= 0.5, other)
"""

BURN = """
import time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return time.process_time()
"""


def test_a_stopped_fork_server_counts_its_pool_processes_cpu_time(tmp_path: Path) -> None:
    """Benchmarks measure a run's CPU time by RUSAGE_CHILDREN: the fork server, not the
    worker, reaps the pool's processes, so it is ended and waited for first. (In a process
    of its own: ending the server ends every pool of the process, as a test's.)"""
    (tmp_path / "probe.py").write_text(BURN)
    script = tmp_path / "stopped.py"
    done = _run(script, STOPPED, tmp_path)
    assert done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr
