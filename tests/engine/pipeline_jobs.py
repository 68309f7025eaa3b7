"""Pipelines the tests run (workers import jobs from files: these are that file)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import cmr


class ThreeSteps(cmr.Job):
    """Step 1 counts words (map + combine + reduce); step 2 is map-only (reduce None) and
    tags each count with its length bucket; step 3 has no map (pairs pass through) and sums
    counts per bucket, with every hook yielding or counting something."""

    reducers = 3

    def setup(self) -> None:
        self.maps_started = 0

    def steps(self) -> Sequence[cmr.Step]:
        return [
            cmr.Step(map=self.words, combine=self.total, reduce=self.total),
            cmr.Step(map=self.bucket, map_final=self.map_final, reducers=2),
            cmr.Step(
                reduce=self.total_bucket,
                reduce_init=self.reduce_init,
                reduce_final=self.reduce_final,
                reducers=4,
            ),
        ]

    def words(self, source: str, line: str) -> Iterator[tuple[str, int]]:
        for w in line.split():
            yield w, 1

    def total(self, key: Any, counts: Iterator[int]) -> Iterator[tuple[Any, int]]:
        yield key, sum(counts)

    def bucket(self, word: str, count: int) -> Iterator[tuple[tuple[str, int], int]]:
        yield ("len", min(len(word), 5)), count

    def map_final(self) -> Iterator[tuple[tuple[str, int], int]]:
        yield ("len", 0), 1  # one per map task of step 2: counts the tasks

    def reduce_init(self) -> None:
        self.seen = 0

    def total_bucket(self, key: Any, counts: Iterator[int]) -> Iterator[tuple[Any, int]]:
        self.seen += 1
        yield list(key), sum(counts)

    def reduce_final(self) -> Iterator[tuple[str, int]]:
        yield "keys", self.seen


class Failing(cmr.Job):
    """Step 2's reduce raises for one key: the pipeline fails, naming the step."""

    def steps(self) -> Sequence[cmr.Step]:
        return [cmr.Step(map=self.words, reduce=self.total), cmr.Step(reduce=self.boom)]

    def words(self, source: str, line: str) -> Iterator[tuple[str, int]]:
        for w in line.split():
            yield w, 1

    def total(self, key: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield key, sum(counts)

    def boom(self, key: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        if key == "b":
            raise ValueError("no b in step 2")
        yield key, sum(counts)


class BadSteps(cmr.Job):
    def steps(self) -> Sequence[cmr.Step]:
        return [cmr.Step(map="words")]  # type: ignore[arg-type]  # a name, not the method
