"""A one-step mrjob job asking for 2 reducers in its JOBCONF."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

from mrjob.job import MRJob  # type: ignore[import-untyped]


class MRJobconfReduces(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    JOBCONF: ClassVar[dict[str, int]] = {"mapreduce.job.reduces": 2}

    def mapper(self, _: None, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    def reducer(self, key: str, values: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield key, sum(values)


if __name__ == "__main__":
    MRJobconfReduces.run()
