"""A job whose strings are markup: its counter's group and name, and (``--param mode=fail``)
its map's error. The page must show them as text; run as script, each would set
``window.pwned``."""

from collections.abc import Iterable, Iterator

import cmr

GROUP = "<script>window.pwned = 1</script>"
NAME = '<img src=x onerror="window.pwned = 2">'
ERROR = '<img src=x onerror="window.pwned = 3"><b>bold</b>'


class Hostile(cmr.Job):
    def map(self, key: str, line: str) -> Iterator[tuple[str, int]]:
        if self.params.get("mode") == "fail":
            raise ValueError(ERROR)
        self.increment_counter(GROUP, NAME)
        yield line, 1

    def reduce(self, key: str, counts: Iterable[int]) -> Iterator[tuple[str, int]]:
        yield key, sum(counts)
