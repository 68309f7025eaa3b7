"""The simulated job: tiny map tasks whose compute is modelled as a sleep."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import cmr
import cmr.logs


def work_spans() -> list[tuple[float, float]]:
    """When each map task's modelled compute ran, (start, end) in time.monotonic(): the
    simulated nodes share this process, so whoever runs the fleet can see how many tasks
    were under way at once (a list's append is atomic across the pool threads). Kept in
    ``benchmarks.fleetsim``'s own module: a worker loads this file from its path, as a
    module of another name, whose globals are not these."""
    from benchmarks.fleetsim import meter

    return meter.WORK_SPANS


class FleetJob(cmr.Job):
    """Count the words of many tiny files; ``work_ms`` models each task's compute."""

    reducers = 8

    def map_chunk(self, source: str, data: bytes) -> Iterator[tuple[str, int]]:
        work_s = float(self.params.get("work_ms", "0")) / 1000
        if work_s > 0:
            began = time.monotonic()
            time.sleep(work_s)  # a pool thread sleeps: task time without CPU
            # By its package name: the workers load this file as a job module of its own.
            work_spans().append((began, time.monotonic()))
        for word in data.split():
            yield word.decode(), 1

    def map(self, key: str, value: str) -> Iterator[tuple[str, int]]:
        for word in value.split():
            yield word, 1

    def combine(self, word: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)

    def reduce(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)


def make_input(root: Path, files: int, words: int = 200, vocab: int = 2000, seed: int = 1) -> int:
    """``files`` files of ``words`` words each (one map task per file); returns bytes per file."""
    rng = random.Random(seed)
    names = [f"w{i:04d}" for i in range(vocab)]
    root.mkdir(parents=True, exist_ok=True)
    size = 0
    for f in range(files):
        lines = [" ".join(rng.choices(names, k=10)) for _ in range(words // 10)]
        data = ("\n".join(lines) + "\n").encode()
        (root / f"f{f:05d}.txt").write_bytes(data)
        size = max(size, len(data))
    return size
