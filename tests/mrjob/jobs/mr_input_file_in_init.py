"""An mrjob job that reads ``mapreduce.map.input.file`` in ``mapper_init`` and in
``mapper``: the file mapper_init names is the one the task's mapper reads first, each line
is counted under the file it came from, and each task says how many files it read (one
under Hadoop and mrjob; cmr packs small files into one task)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from mrjob.compat import jobconf_from_env  # type: ignore[import-untyped]
from mrjob.job import MRJob  # type: ignore[import-untyped]


class MRInputFileInInit(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    def mapper_init(self) -> None:
        self.at_init = jobconf_from_env("mapreduce.map.input.file")
        self.first: str | None = None
        self.files: set[str] = set()

    def mapper(self, _: None, line: str) -> Iterator[tuple[Any, Any]]:
        uri = jobconf_from_env("mapreduce.map.input.file")
        if self.first is None:
            self.first = uri
            yield "mapper_init_saw_the_first_file", self.at_init == uri
        self.files.add(uri)
        yield ["lines_in", uri], 1

    def mapper_final(self) -> Iterator[tuple[str, int]]:
        yield "most_files_in_a_task", len(self.files)

    def reducer(self, key: Any, values: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        if key == "mapper_init_saw_the_first_file":
            yield key, all(values)
        elif key == "most_files_in_a_task":
            yield key, max(values)
        else:
            yield key, sum(values)


if __name__ == "__main__":
    MRInputFileInInit.run()
