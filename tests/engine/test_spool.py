"""A worker's local spool (map spools, reduce spill runs) never outlives it: removed however
the worker stops, and, when it was killed and could not, by the next worker to start in the
same place. (Before: a crashed or cancelled worker left its directory, and a killed one's
stayed forever; the suite alone left thousands in /tmp.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cmr import submit
from cmr.api import job_ref
from cmr.backends.base import Backend
from cmr.pool import cpu_pool
from cmr.runtime import Runtime, WorkerCrashed
from cmr.settings import AwsSettings, WorkerSettings
from cmr.spool import LOCK, Spool, sweep
from cmr.submit import JobOptions
from cmr.worker import Worker

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = str(REPO / "examples" / "wordcount.py")

HOLDER = """
import sys, time
from cmr.spool import Spool
s = Spool(sys.argv[1])
open(s.path + "/run-1.spill", "wb").write(b"x" * 4096)
print(s.path, flush=True)
time.sleep(600)
"""


def _spools(under: Path) -> list[Path]:
    return sorted(p for p in under.iterdir() if p.name.startswith("cmr-"))


def _holder(under: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that made a spool (with a spill run in it) and lives until killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(under)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


async def test_a_crashed_worker_removes_its_spool(embedded: Backend, tmp_path: Path) -> None:
    """A worker crashing with a reduce's pairs spooled (its spool is not empty) removes the
    directory as it stops."""
    spill = tmp_path / "spill"
    spill.mkdir()
    (tmp_path / "in.txt").write_text("a b\nb c\n" * 50)
    spec = await submit.submit(
        embedded,
        job_ref(WORDCOUNT),
        str(tmp_path / "in.txt"),
        str(tmp_path / "out"),
        JobOptions(partitions=1),
        queue_prefix="cmr-",
        parallelism=1,
    )
    seen: list[list[str]] = []

    async def crash(rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == "reduce.output_written":
            seen.append(
                sorted(str(p.relative_to(rt.spool_dir)) for p in Path(rt.spool_dir).rglob("*"))
            )
            raise WorkerCrashed(step)

    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(spill), jobs_from=(str(REPO),))
    with cpu_pool(1) as pool:
        worker = Worker(embedded, ws, pool, only_job=spec.job_id, hook=crash)
        assert _spools(spill) == [Path(worker.spool.path)]
        with pytest.raises(BaseExceptionGroup) as crashed:
            await asyncio.wait_for(worker.run(), 120)
    assert crashed.group_contains(WorkerCrashed)
    assert seen and any(name.startswith("reduce-0-") for name in seen[0]), seen  # it was in use
    assert _spools(spill) == []


async def test_a_cancelled_worker_removes_its_spool(embedded: Backend, tmp_path: Path) -> None:
    ws = WorkerSettings(processes=1, poll_s=0.1, spill_dir=str(tmp_path))
    with cpu_pool(1) as pool:
        worker = Worker(embedded, ws, pool)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)
        assert len(_spools(tmp_path)) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _spools(tmp_path) == []


async def test_a_starting_worker_removes_the_spools_of_killed_ones(
    embedded: Backend, tmp_path: Path
) -> None:
    """Two processes hold spools with spill runs; one is killed (SIGKILL: no code of its
    runs). A worker starting there removes the dead one's spool only: the living one's,
    and a directory with no lock file (not a spool it can prove dead), stay."""
    dead, dead_spool = _holder(tmp_path)
    alive, alive_spool = _holder(tmp_path)
    foreign = tmp_path / "cmr-not-a-spool"
    foreign.mkdir()
    (foreign / "keep").write_text("x")
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(30)
        assert (dead_spool / "run-1.spill").exists()  # the kill left it
        ws = WorkerSettings(processes=1, spill_dir=str(tmp_path))
        with cpu_pool(1) as pool:
            worker = Worker(embedded, ws, pool)
            mine = Path(worker.spool.path)
            assert _spools(tmp_path) == sorted([alive_spool, foreign, mine])
            assert (alive_spool / "run-1.spill").exists() and (foreign / "keep").exists()
            assert sweep(str(tmp_path)) == []  # the new worker's own is alive too
            worker.done.set()
            await asyncio.wait_for(worker.run(), 60)
        assert _spools(tmp_path) == sorted([alive_spool, foreign])
    finally:
        for proc in (dead, alive):
            proc.kill()
            proc.wait(30)
            assert proc.stdout is not None
            proc.stdout.close()
    assert [Path(p) for p in sweep(str(tmp_path))] == [alive_spool]  # once its holder died
    assert _spools(tmp_path) == [foreign]


@pytest.mark.slow  # a real worker on the local stack
async def test_a_killed_cmr_worker_s_spool_is_removed_by_the_next_worker(
    aws: tuple[Backend, AwsSettings], embedded: Backend, tmp_path: Path
) -> None:
    """A real `cmr worker` (its spill directory: $TMPDIR) killed outright, SIGKILL to its
    process group: nothing of it runs to remove its spool. The next worker to start there
    does."""
    _, s = aws
    names = ["--bucket", s.bucket, "--table", s.table, "--queue-prefix", s.queue_prefix]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cmr", "worker", "--backend", "aws", *names,
        "--idle-exit", "120", "--processes", "1",
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(600):
            spools = [p for p in _spools(tmp_path) if (p / LOCK).exists()]
            if spools or proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert len(spools) == 1, (spools, proc.returncode)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
    assert spools[0].exists()  # the kill left it
    with cpu_pool(1) as pool:
        worker = Worker(embedded, WorkerSettings(processes=1, spill_dir=str(tmp_path)), pool)
        assert _spools(tmp_path) == [Path(worker.spool.path)]
        worker.done.set()
        await asyncio.wait_for(worker.run(), 60)
    assert _spools(tmp_path) == []


def test_a_sweep_follows_no_link_and_takes_no_stranger_directory(tmp_path: Path) -> None:
    """In a shared /tmp another user can plant names: a link named like a spool to a
    directory with an unlocked lock file, or a directory with the wrong mode. A sweep
    removes nothing through either (it never follows the link)."""
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    (precious / LOCK).write_text("")
    (precious / "data").write_text("keep me")
    spill = tmp_path / "spill"
    spill.mkdir()
    (spill / "cmr-link").symlink_to(precious)
    loose = spill / "cmr-loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    (loose / LOCK).write_text("")
    (loose / "data").write_text("keep me")
    assert sweep(str(spill)) == []
    assert (precious / "data").read_text() == "keep me" and (precious / LOCK).exists()
    assert (loose / "data").exists()


def test_a_dead_spool_in_a_setgid_directory_is_swept(tmp_path: Path) -> None:
    """A team's spill directory is often setgid (its files get the team's group): its
    spools are made 2700, and are still known as spools."""
    spill = tmp_path / "team"
    spill.mkdir()
    spill.chmod(0o2770)
    dead, dead_spool = _holder(spill)
    try:
        dead.kill()
        dead.wait(30)
        assert dead_spool.stat().st_mode & 0o7777 == 0o2700
        assert [Path(p) for p in sweep(str(spill))] == [dead_spool]
    finally:
        assert dead.stdout is not None
        dead.stdout.close()


def test_a_spool_is_never_seen_unlocked(tmp_path: Path) -> None:
    """Spools of a living process are never swept, and each goes when closed."""
    made = [Spool(str(tmp_path)) for _ in range(20)]
    try:
        assert sweep(str(tmp_path)) == []
        assert all((Path(s.path) / LOCK).exists() for s in made)
    finally:
        for s in made:
            s.close()
    assert _spools(tmp_path) == []
