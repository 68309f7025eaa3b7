"""The virtual clock (cmr.virtualtime): waits on timers take no real time; waits on threads
and the CPU pool take the real time they take, and no timer fires early because of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmr import clock
from cmr.api import cpu_pool
from cmr.backends.embedded import EmbeddedQueues, embedded_backend
from cmr.pool import CpuPool
from cmr.virtualtime import in_virtual_time, run

HOUR = 3600.0


@pytest.fixture(scope="module")
def pool() -> Iterator[CpuPool]:
    with cpu_pool(1) as p:
        yield p


def test_hours_of_sleep_take_milliseconds() -> None:
    async def sleep_hours() -> tuple[float, float]:
        start, wall = clock.monotonic(), clock.wall()
        await asyncio.gather(*(asyncio.sleep(h * HOUR) for h in (1, 5, 24)))
        return clock.monotonic() - start, clock.wall() - wall

    began = time.monotonic()
    slept, dated = run(sleep_hours())
    assert time.monotonic() - began < 5  # milliseconds, on a machine not starved
    assert slept == pytest.approx(24 * HOUR, abs=0.5)
    assert dated == pytest.approx(24 * HOUR, abs=0.5)  # records are dated in the same time


@in_virtual_time
async def test_timers_fire_in_order_at_their_times() -> None:
    start = clock.monotonic()
    fired: list[tuple[str, float]] = []

    async def after(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        fired.append((name, clock.monotonic() - start))

    delays = {"lease": 2.0, "pause": 3.5, "poll": 0.25, "give-up": 12.0, "renew": 2 / 3}
    await asyncio.gather(*(after(n, s) for n, s in delays.items()))
    assert [n for n, _ in fired] == sorted(delays, key=delays.__getitem__)
    for name, at in fired:
        assert at == pytest.approx(delays[name], abs=0.05), name


async def _lease_kept_while(work: asyncio.Future[object]) -> tuple[float, int]:
    """Virtual seconds the work took, and how many of a 10 s lease's timers fired."""
    start = clock.monotonic()
    expired = 0

    async def lease() -> None:
        nonlocal expired
        await asyncio.sleep(10)
        expired += 1

    timer = asyncio.create_task(lease())
    await work
    took = clock.monotonic() - start
    timer.cancel()
    return took, expired


@in_virtual_time
async def test_a_thread_at_work_holds_the_clock_to_real_time() -> None:
    took, expired = await _lease_kept_while(asyncio.ensure_future(asyncio.to_thread(time.sleep, 1)))
    assert expired == 0
    assert 0.9 < took < 9  # the real second (and the machine's delays), not the lease's 10


@in_virtual_time
async def test_no_jump_while_a_result_comes_back_from_a_thread() -> None:
    """A thread's result reaches the loop in a second call after its work ends; a loop
    that jumped in between (the thread waiting for the GIL) fired timers early."""

    async def many_small_calls() -> None:
        for _ in range(300):
            await asyncio.to_thread(sum, range(100))

    took, expired = await _lease_kept_while(asyncio.ensure_future(many_small_calls()))
    assert expired == 0, f"the lease ran out during {took:.1f} s of virtual time"


def test_a_lease_is_not_lost_while_the_pool_computes(pool: CpuPool) -> None:
    """A message leased for 2 s, then 1.5 s of real computing in the pool: a second
    receiver long-polling the queue meanwhile must not get it (on a clock that jumped to
    the end of the lease, it would)."""
    queues = EmbeddedQueues()

    async def compete() -> tuple[bool, list[bytes]]:
        await queues.create("q", visibility_s=2)
        await queues.send("q", [b"task"])
        (held,) = await queues.receive("q")
        rival = asyncio.create_task(queues.receive("q", wait_s=20))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(pool, time.sleep, 1.5)
        answered = rival.done()
        await queues.delete_messages("q", [held.receipt])  # the task is done: nobody gets it
        return answered, [m.body for m in await rival]

    answered, got = run(compete())
    assert not answered and got == []


def test_a_pause_past_the_lease_loses_it(tmp_path: Path) -> None:
    """The other half: when every task waits (a worker paused past its lease), the clock
    jumps, and the lease runs out as it would in real time, at once."""
    be = embedded_backend(tmp_path)

    async def pause_past_the_lease() -> tuple[float, list[bytes]]:
        await be.queues.create("q", visibility_s=2)
        await be.queues.send("q", [b"task"])
        await be.queues.receive("q")
        start = clock.monotonic()
        got = await be.queues.receive("q", wait_s=20)  # a rival waits; we "pause"
        return clock.monotonic() - start, [m.body for m in got]

    began = time.monotonic()
    waited, got = run(pause_past_the_lease())
    assert got == [b"task"]
    assert waited == pytest.approx(2.0, abs=0.05)
    assert time.monotonic() - began < 5  # milliseconds, on a machine not starved


def test_on_asyncio_s_own_loop_the_clock_is_the_real_one() -> None:
    async def read() -> tuple[float, float, float, float]:
        return clock.monotonic(), time.monotonic(), clock.wall(), time.time()

    mono, real_mono, wall, real_wall = asyncio.run(read())
    assert abs(mono - real_mono) < 0.01 and abs(wall - real_wall) < 0.01
