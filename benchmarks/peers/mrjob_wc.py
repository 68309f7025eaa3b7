"""Word count with mrjob (https://mrjob.readthedocs.io), inline or local runner.

    python mrjob_wc.py --runner inline|local --workers 2 --scratch DIR --output DIR FILE...

The job is mrjob's word count with in-mapper combining (``mapper_init`` / ``mapper_final``
keep a ``Counter`` per map task, as mrjob's docs show) and a summing reducer. No
``combiner``: a map task already emits each word once, so one would only add a sort and a
pass per task (measured: about 3 of 8 CPU seconds on 20 MB with the local runner). mrjob splits
the input into 2 x workers map tasks on ``b"\\n"``; the local runner runs them and the
reducers in a ``multiprocessing`` pool of ``--workers`` processes, each task a
``python mrjob_wc.py --mapper`` subprocess, sorting between the steps; the inline runner
runs every task in this process. Input is read as bytes (``BytesValueProtocol``): mrjob's
default protocol would fall back to latin-1 for a line that is not UTF-8.

Output: ``part-NNNNN`` files of ``word<TAB>count`` lines under ``--output``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any


def line_words(line: bytes) -> list[str]:
    """The benchmark's word definition for one line (mrjob hands lines without b"\\n";
    it strips a trailing b"\\r" too, which is whitespace anyway)."""
    return line.decode("utf-8", "replace").split()


class WordCountOutput:
    """``word<TAB>count`` output lines, UTF-8."""

    def write(self, key: str, value: int) -> bytes:
        return b"%s\t%d" % (key.encode("utf-8"), value)

    def read(self, line: bytes) -> tuple[str, int]:
        word, _, n = line.decode("utf-8").rpartition("\t")
        return word, int(n)


def job_class() -> Any:
    from mrjob.job import MRJob
    from mrjob.protocol import BytesValueProtocol

    class MRWordCount(MRJob):  # type: ignore[misc]
        INPUT_PROTOCOL = BytesValueProtocol
        OUTPUT_PROTOCOL = WordCountOutput

        def mapper_init(self) -> None:
            self.counts: Counter[str] = Counter()

        def mapper(self, _: None, line: bytes) -> None:
            self.counts.update(line_words(line))

        def mapper_final(self) -> Any:
            yield from self.counts.items()

        def reducer(self, word: str, counts: Any) -> Any:
            yield word, sum(counts)

    return MRWordCount


def mrjob_args(argv: list[str]) -> list[str]:
    """The benchmark's options as mrjob's; a task mrjob started passes its own through."""
    if "--scratch" not in argv:
        return argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", choices=("inline", "local"), required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    return [
        *("--runner", a.runner, "--no-conf", "--num-cores", str(a.workers)),
        *("--local-tmp-dir", a.scratch, "--output-dir", a.output, "--no-cat-output"),
        *a.files,
    ]


if __name__ == "__main__":
    job_class()(args=mrjob_args(sys.argv[1:])).execute()
