"""The simulated job: tiny map tasks whose compute is modelled as a sleep."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import cmr
import cmr.logs


class FleetJob(cmr.Job):
    """Count the words of many tiny files; ``work_ms`` models each task's compute."""

    reducers = 8

    def map_chunk(self, source: str, data: bytes) -> Iterator[tuple[str, int]]:
        work_s = float(self.params.get("work_ms", "0")) / 1000
        if work_s > 0:
            time.sleep(work_s)  # a pool thread sleeps: task time without CPU
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
