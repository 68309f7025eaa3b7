"""Word count: how often each word occurs.

Words are exactly: the input split into lines on b"\\n", each line decoded as UTF-8 with
errors replaced, then ``str.split()``.

    cmr run examples/wordcount.py --input books/ --output counts/
"""

from collections import Counter
from collections.abc import Iterable, Iterator

import cmr


class WordCount(cmr.Job):
    reducers = 4

    def map(self, key: str, line: str) -> Iterator[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    def map_chunk(self, source: str, data: bytes) -> Iterable[tuple[str, int]]:
        # The fast path: the same words as map(), counted per split in C. Decoding the whole
        # chunk equals decoding line by line: b"\n" never occurs inside a UTF-8 sequence.
        return Counter(data.decode("utf-8", "replace").split()).items()

    def combine(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)

    def reduce(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)
