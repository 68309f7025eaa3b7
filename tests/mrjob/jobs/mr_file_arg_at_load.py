"""An mrjob job that opens its file arg while it is made (in ``load_args``, as mrjob's own
jobs may): the client makes it from the path given, each task from the file's name in its
working directory, as mrjob's runners do."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from mrjob.job import MRJob  # type: ignore[import-untyped]


class MRFileArgAtLoad(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    def configure_args(self) -> None:
        super().configure_args()
        self.add_file_arg("--n-file")

    def load_args(self, args: Any) -> None:
        super().load_args(args)
        self.n = 1
        if self.options.n_file:
            with open(self.options.n_file) as f:
                self.n = int(f.read())

    def mapper(self, _: None, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, self.n

    def reducer(self, key: str, values: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield key, sum(values)


if __name__ == "__main__":
    MRFileArgAtLoad.run()
