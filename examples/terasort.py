"""TeraSort: a total-order sort of Hadoop TeraGen's records.

Input: 100-byte records, the first 10 bytes the key (TeraGen's format, files of whole
records). Output: the same records, sorted by key, as raw bytes; the parts, in partition
order, concatenate into one sorted file (keys are sampled at submit and the partitions are
ranges of them). Hadoop's TeraValidate accepts the parts in order (benchmarks/hadoop.py).

    cmr run examples/terasort.py --input teragen/ --output sorted/ --reducers 8
"""

from collections.abc import Sequence

import cmr


class TeraSort(cmr.Job):
    input_format = "fixed:100:10"
    output_format = "raw"
    total_order = True
    reducers = 4

    def steps(self) -> Sequence[cmr.Step]:
        # Neither map nor reduce, as Hadoop's TeraSort (its identity Mapper and Reducer):
        # the records pass through the shuffle, which sorts them. Records with equal keys
        # are all kept (TeraGen's keys are random; they may repeat).
        return [cmr.Step()]
