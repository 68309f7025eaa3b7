"""An mrjob job that reports what each task's instance saw, to check that an instance lives
for one task, as under mrjob and Hadoop: counts kept on ``self`` from ``__init__`` and yielded
in the final hooks, the process each task ran in, and whether the combiner shares the
mapper's instance (under mrjob it never does: it is a task of its own)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from mrjob.job import MRJob  # type: ignore[import-untyped]


class MRTaskState(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines = 0
        self.keys = 0
        self.role = ""

    def mapper(self, _: None, line: str) -> Iterator[tuple[str, int]]:
        self.role = "mapper"
        self.lines += 1
        yield "words", len(line.split())

    def mapper_final(self) -> Iterator[tuple[str, int]]:
        yield "lines_by_task", self.lines
        yield "map_task_in_process", os.getpid()

    def combiner(self, key: str, values: Iterable[int]) -> Iterator[tuple[str, int]]:
        if self.role == "mapper":
            yield "combiner_saw_the_mappers_instance", 1
        if key == "words":
            yield key, sum(values)
        else:
            for value in values:
                yield key, value

    def reducer(self, key: str, values: Iterable[int]) -> Iterator[tuple[str, Any]]:
        self.keys += 1
        yield key, sum(values) if key == "words" else sorted(values)

    def reducer_final(self) -> Iterator[tuple[str, int]]:
        yield "keys_by_reduce_task", self.keys


if __name__ == "__main__":
    MRTaskState.run()
