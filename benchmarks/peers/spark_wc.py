"""Word count with PySpark (https://spark.apache.org/docs/latest/api/python/), local[N].

    python spark_wc.py --workers 2 --scratch DIR --output DIR FILE...

Spark's word count idiom - ``flatMap`` words, ``map`` to (word, 1), ``reduceByKey(add)``
(which combines on the map side), ``saveAsTextFile`` - on a ``local[workers]`` context
started inside the timed run (the JVM's start-up is part of Spark's time). The input is an
RDD of line-aligned byte ranges (cut like the baseline's: about total / (workers x 8)
bytes, 1-8 MiB) that each Python task reads from the local file and decodes itself:
``sc.textFile`` would decode in the JVM, whose UTF-8 decoder replaces invalid bytes
differently from Python's, so the words would differ from the baseline's. The web UI is
off (it only costs start-up time and a port).

Output: ``part-NNNNN`` files of ``word<TAB>count`` lines under ``--output``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from operator import add

from byte_ranges import chunk_size, line_ranges


def range_words(task: tuple[str, int, int]) -> Iterator[str]:
    """The flatMap function: the words of one byte range."""
    path, start, end = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return iter(data.decode("utf-8", "replace").split())


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(f"local[{a.workers}]")
        .setAppName("cmr-benchmark-wordcount")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.local.dir", os.path.join(a.scratch, "spark"))
        .set("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={a.scratch}")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("WARN")
    chunk = chunk_size(a.files, a.workers)
    ranges = [r for p in a.files for r in line_ranges(p, chunk)]
    (
        sc.parallelize(ranges, len(ranges))
        .flatMap(range_words)
        .map(lambda word: (word, 1))
        .reduceByKey(add, a.workers * 2)
        .map(lambda kv: f"{kv[0]}\t{kv[1]}")
        .saveAsTextFile(a.output)
    )
    sc.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
