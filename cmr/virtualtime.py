"""An asyncio event loop whose clock skips the time in which nothing can happen.

A lease test waits: a paused worker sleeps past its 2 s lease, a reducer polls every
quarter of a second, a client gives up after minutes. On :class:`VirtualTimeLoop` those
waits cost no real time. Its clock runs at the real rate, and *jumps* to the next timer
when every task waits on one: the selector reports no I/O within ``autojump_threshold``
real seconds and no executor work is in flight (trio's ``MockClock(autojump_threshold)``,
with one difference that matters for leases: a task waiting on a thread or on the CPU pool
is not "waiting on a timer". While such work runs, time flows at the real rate, as it
would in production, so lease renewals keep beating while the pool computes and a lease
is lost only when a worker really stops renewing it.

So a run on this loop is a run on a real loop in which every idle stretch happened to be
instant: the same interleavings can happen, in the same order of timers. What cannot be
seen is I/O from outside the process that arrives later than the threshold (a socket to a
real server): use it where the loop waits only on its own timers, threads and pools (the
embedded backend and in-process workers).

Use it as a loop factory (``asyncio.Runner(loop_factory=VirtualTimeLoop)``, or
pytest-asyncio's ``pytest_asyncio_loop_factories`` hook), through :func:`run`, or on a
test function with :func:`in_virtual_time`. Protocol code reads time through
:mod:`cmr.clock`, which follows the running loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import selectors
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar, TypeVarTuple

_T = TypeVar("_T")
_P = ParamSpec("_P")
_Ts = TypeVarTuple("_Ts")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` jumps to the next timer when every task waits
    on a timer (see the module's text). ``skipped_s``: the seconds jumped over so far."""

    def __init__(self, autojump_threshold: float = 0.0) -> None:
        self.autojump_threshold = autojump_threshold
        self.skipped_s = 0.0
        # Executor calls not yet finished (threads, the CPU pool): time does not jump over
        # them, because in real time their results would come before a later timer.
        self._in_flight = 0
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        super().__init__(_JumpingSelector(selectors.DefaultSelector(), self))

    def time(self) -> float:
        return time.monotonic() + self.skipped_s

    def set_default_executor(self, executor: Any) -> None:
        super().set_default_executor(executor)
        self._threads = executor

    def run_in_executor(
        self,
        executor: concurrent.futures.Executor | None,
        func: Callable[[*_Ts], _T],
        *args: *_Ts,
    ) -> asyncio.Future[_T]:
        # asyncio's own, but each call counted in flight (_InFlight) while it runs.
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        if executor is None:
            if self._threads is None:
                self.set_default_executor(
                    concurrent.futures.ThreadPoolExecutor(thread_name_prefix="asyncio")
                )
            executor = self._threads
        assert executor is not None
        work = executor.submit(func, *args)
        result = asyncio.wrap_future(work, loop=self)
        self._in_flight += 1
        _InFlight(self, work, result)
        return result

    def _finished(self) -> None:
        self._in_flight -= 1

    def _select(
        self, selector: selectors.BaseSelector, timeout: float | None
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """The loop's wait: ``timeout`` is the time to the next timer (None: there is no
        timer; 0: a callback is ready). Jump to that timer when nothing happens within
        the threshold and no executor work runs."""
        if not timeout or self._in_flight or timeout <= self.autojump_threshold:
            return selector.select(timeout)
        due = self.time() + timeout
        events = selector.select(self.autojump_threshold)
        if not events:
            self.skipped_s += max(0.0, due - self.time())
        return events


class _InFlight:
    """One executor call, counted in flight until both its work is done (a thread or a
    process may run on after its awaiter gave up) and its result is on the loop.

    Not the work's end alone: its thread hands the result over in a second call into the
    loop, and may lose the GIL between the two (for a switch interval, thousands of loop
    turns), while the loop, seeing nothing in flight, jumped past timers that in real time
    would fire after the result. The result's own callbacks are scheduled together with the
    awaiting task's wake-up, so once both ends are seen, that wake-up is ready to run."""

    def __init__(
        self,
        loop: VirtualTimeLoop,
        work: concurrent.futures.Future[Any],
        result: asyncio.Future[Any],
    ) -> None:
        self._loop, self._ends = loop, 2
        result.add_done_callback(self._ended)
        work.add_done_callback(self._work_ended)

    def _ended(self, _: object = None) -> None:  # on the loop
        self._ends -= 1
        if self._ends == 0:
            self._loop._finished()

    def _work_ended(self, _: concurrent.futures.Future[Any]) -> None:  # on any thread
        if self._loop.is_closed():
            return  # the pool outlived this loop (a session's pool): nobody counts now
        with contextlib.suppress(RuntimeError):  # closed between the check and the call
            self._loop.call_soon_threadsafe(self._ended)


class _JumpingSelector(selectors.BaseSelector):
    """The loop's selector, whose waits the loop decides (VirtualTimeLoop._select)."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._inner, self._loop = inner, loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return self._loop._select(self._inner, timeout)

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


def run(main: Coroutine[Any, Any, _T], *, autojump_threshold: float = 0.0) -> _T:
    """``asyncio.run(main)`` on a :class:`VirtualTimeLoop`."""
    factory = functools.partial(VirtualTimeLoop, autojump_threshold)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def in_virtual_time(
    test: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, _T]:
    """An async test function made a plain one that runs on a :class:`VirtualTimeLoop`
    (its fixtures are resolved as before; async fixtures are not available to it)::

        @in_virtual_time
        async def test_a_lease_expires(tmp_path): ...
    """

    @functools.wraps(test)
    def in_virtual_loop(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return run(test(*args, **kwargs))

    return in_virtual_loop
