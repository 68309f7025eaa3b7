"""A word count whose map takes its time (``--param sleep=S`` seconds a line) and counts what
it saw in a counter: a job that stays running long enough for a page to watch it."""

import time
from collections.abc import Iterable, Iterator

import cmr


class SlowCount(cmr.Job):
    def map(self, key: str, line: str) -> Iterator[tuple[str, int]]:
        time.sleep(float(self.params.get("sleep", "0")))
        self.increment_counter("seen", "lines")
        for word in line.split():
            yield word, 1

    def reduce(self, word: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)
