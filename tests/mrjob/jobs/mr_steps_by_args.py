"""An mrjob job whose ``steps()`` are chosen by its arguments (a shell command as mapper,
or a pre-filter): made without them, ``MRStep()`` raises (no mapper, no reducer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mrjob.job import MRJob  # type: ignore[import-untyped]
from mrjob.step import MRStep  # type: ignore[import-untyped]


class MRStepsByArgs(MRJob):  # type: ignore[misc]  # mrjob has no type hints
    def configure_args(self) -> None:
        super().configure_args()
        self.add_passthru_arg("--mapper-cmd")
        self.add_passthru_arg("--mapper-filter")

    def mapper(self, _: None, line: str) -> Iterator[tuple[str, int]]:
        yield line, 1

    def steps(self) -> list[Any]:
        kwargs: dict[str, Any] = {}
        if self.options.mapper_cmd:
            kwargs["mapper_cmd"] = self.options.mapper_cmd
        if self.options.mapper_filter:
            kwargs.update(mapper=self.mapper, mapper_pre_filter=self.options.mapper_filter)
        return [MRStep(**kwargs)]


if __name__ == "__main__":
    MRStepsByArgs.run()
