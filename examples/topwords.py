"""Top words: a two-step pipeline. Step 1 counts each word (as word count does); step 2
sends every count to one reducer, which keeps the most used words, most used first (ties
in word order).

    cmr run examples/topwords.py --input books/ --output top/ --param top=10

One submission runs both steps; step 2 starts when any worker sees step 1 committed.
"""

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import cmr


class TopWords(cmr.Job):
    reducers = 4  # step 1's partitions; step 2 has one

    def setup(self) -> None:
        self.top = int(self.params.get("top", "10"))

    def steps(self) -> Sequence[cmr.Step]:
        return [
            cmr.Step(map_chunk=self.words, combine=self.total, reduce=self.total),
            cmr.Step(map=self.to_one, reduce=self.most, reducers=1),
        ]

    def words(self, source: str, data: bytes) -> Iterable[tuple[str, int]]:
        return Counter(data.decode("utf-8", "replace").split()).items()

    def total(self, word: str, counts: Iterator[int]) -> Iterator[tuple[str, int]]:
        yield word, sum(counts)

    def to_one(self, word: str, count: int) -> Iterator[tuple[None, tuple[int, str]]]:
        yield None, (count, word)

    def most(self, _: None, counts: Iterator[tuple[int, str]]) -> Iterator[tuple[str, int]]:
        # Most used first; of equal counts, the word first in code point order.
        for count, word in heapq.nsmallest(self.top, counts, key=lambda cw: (-cw[0], cw[1])):
            yield word, count
