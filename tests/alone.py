"""Tests that run while no other test does, when the suite runs in parallel.

scripts/test.sh runs the suite in several worker processes (pytest-xdist, ``-n``). A test
that asserts a wall-clock bound on something the machine's load slows down (an answer
within 8 s, timers firing on time) is marked ``alone``: it waits until no other
test runs, and holds the others off until it ends, so that its bound means on a 2-core
machine what it meant when the suite ran one test at a time.

A readers-writer lock on two files in the run's temporary directory (shared by its workers)
does it: every other test holds the lock shared while it runs, an ``alone`` test exclusively;
a gate in front keeps a waiting ``alone`` test from being starved by shared holders that
keep arriving. The ``alone`` tests are one xdist group, so one worker runs them one after
the other, keeping the lock between them: the others drain once, not once per test. The
lock spans set-up and tear-down, fixtures included. Without xdist nothing is locked: tests
run one at a time anyway.

An ``alone`` test is also ``slow``: while it runs every other worker waits, which costs the
everyday subset (``-m "not slow"``) more than its own seconds; the full suite runs them.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ALONE = "alone"


class _Held:
    """What this worker holds: the files stay open while it does (closing releases)."""

    gate: IO[str] | None = None  # while an alone test of ours runs
    lock: IO[str] | None = None  # while any test of ours runs: shared, or exclusive if alone


_held = _Held()


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(ALONE) is not None


def _files(item: pytest.Item) -> tuple[Path, Path]:
    run = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
    return run / "alone.gate", run / "alone.lock"  # each worker's own directory is in it


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: before pytest's own -m deselection, which must see the slow mark added here.
    for item in items:
        if _alone(item):
            item.add_marker(pytest.mark.xdist_group(ALONE))
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    """tests/conftest.py's check_groups, said plainly before any worker starts (raised in a
    worker, xdist shows only an INTERNALERROR): pytest-xdist's loadgroup writes
    ``item._nodeid``, so the node id must be read from there (pytest 9.2 reads another
    field)."""
    if getattr(config.option, "dist", None) == "loadgroup" and "_nodeid" not in _nodeid_reads():
        raise pytest.UsageError(
            f"pytest {pytest.__version__} keeps node ids where pytest-xdist's --dist loadgroup "
            "cannot group them: every xdist_group would be ignored; pin a pytest it works with "
            "(pyproject.toml)"
        )


def _nodeid_reads() -> tuple[str, ...]:
    getter = pytest.Item.nodeid.fget  # type: ignore[attr-defined]
    return tuple(getter.__code__.co_names) if getter is not None else ()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ or _held.lock is not None:
        return  # not in parallel; or the alone test before this one kept the lock for it
    gate, lock = _files(item)
    _held.gate, _held.lock = open(gate, "a"), open(lock, "a")  # noqa: SIM115 -- held
    fcntl.flock(_held.gate, fcntl.LOCK_EX)
    fcntl.flock(_held.lock, fcntl.LOCK_EX if _alone(item) else fcntl.LOCK_SH)
    if not _alone(item):
        _held.gate.close()  # open the gate again: only an alone test keeps it closed
        _held.gate = None


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the fixtures' tear-down, under the lock
    if _held.lock is None or (_alone(item) and _alone(nextitem)):
        return  # the next test is alone too: it keeps the lock
    _held.lock.close()
    _held.lock = None
    if _held.gate is not None:
        _held.gate.close()
        _held.gate = None
