"""A word count whose map takes its time (``--param sleep=S`` seconds a line) and counts what
it saw in a counter: a job that stays running long enough for a page to watch it."""

import time

import cmr


class SlowCount(cmr.Job):
    def map(self, key, line):
        time.sleep(float(self.params.get("sleep", "0")))
        self.increment_counter("seen", "lines")
        for word in line.split():
            yield word, 1

    def reduce(self, word, counts):
        yield word, sum(counts)
