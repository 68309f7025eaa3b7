"""Inverted index: for every word, the sorted list of inputs that contain it.

    cmr run examples/invertedindex.py --input docs/ --output index/

Output lines: ``word<TAB>["a.txt", "b/c.txt"]`` (a JSON list).
"""

from collections.abc import Iterable, Iterator

import cmr


class InvertedIndex(cmr.Job):
    reducers = 4

    def map(self, key: str, line: str) -> Iterator[tuple[str, str]]:
        for word in set(line.lower().split()):
            yield word, key

    def map_chunk(self, source: str, data: bytes) -> Iterable[tuple[str, str]]:
        # One pair per distinct word in the split, not per occurrence.
        words = set(data.decode("utf-8", "replace").lower().split())
        return ((w, source) for w in words)

    def combine(self, word: str, sources: Iterator[str]) -> Iterator[tuple[str, str]]:
        for source in set(sources):
            yield word, source

    def reduce(self, word: str, sources: Iterator[str]) -> Iterator[tuple[str, list[str]]]:
        yield word, sorted(set(sources))
