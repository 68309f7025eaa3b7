"""A one-step mrjob job asking for 3 reducers in its step's jobconf (Hadoop 1's name)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from mrjob.job import MRJob  # type: ignore[import-untyped]
from mrjob.step import MRStep  # type: ignore[import-untyped]


class MRStepJobconfReduces(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    def mapper(self, _: None, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    def reducer(self, key: str, values: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield key, sum(values)

    def steps(self) -> list[Any]:
        return [
            MRStep(mapper=self.mapper, reducer=self.reducer, jobconf={"mapred.reduce.tasks": 3})
        ]


if __name__ == "__main__":
    MRStepJobconfReduces.run()
