"""Word count as an mrjob job, unmodified mrjob code: `cmr run` runs it as mrjob would
(`scripts/setup.sh mrjob` installs mrjob 0.7.4 into a checkout's .venv)."""

import re

from mrjob.job import MRJob

WORD = re.compile(r"[\w']+")


class MRWordCount(MRJob):
    def mapper(self, _, line):
        for word in WORD.findall(line):
            yield word.lower(), 1

    def combiner(self, word, counts):
        yield word, sum(counts)

    def reducer(self, word, counts):
        yield word, sum(counts)


if __name__ == "__main__":
    MRWordCount.run()
