"""Distributed grep: every line matching a regular expression, with where it was found.

    cmr run examples/grep.py --input logs/ --output hits/ --param pattern='ERROR|FATAL'

Output lines: ``source<TAB>[line, ...]`` — the matching lines of each input, in input order
within a split.
"""

import re
from collections.abc import Iterator

import cmr


class Grep(cmr.Job):
    reducers = 2

    def setup(self) -> None:
        pattern = self.params.get("pattern")
        if not pattern:
            raise ValueError("grep needs --param pattern=REGEX")
        self.regex = re.compile(pattern)

    def map(self, key: str, line: str) -> Iterator[tuple[str, str]]:
        if self.regex.search(line):
            yield key, line

    def reduce(self, source: str, lines: Iterator[str]) -> Iterator[tuple[str, list[str]]]:
        yield source, list(lines)
