"""A job whose code keeps raising, and ``--max-task-attempts``: runs of one task that raise
before the job fails. The answer is one error line naming the task, how often it raised and
the user's error, then the user's traceback; never a dead worker for a task that raised."""

from __future__ import annotations

from tests.usage.cases import RUN, Case, job, words

# int("x...") raises ValueError on every line: the same record fails every run.
BAD_MAP = job("yield line, int('x' + line)")
BAD_REDUCE = job(reduce="def reduce(self, key, values):\n        raise ValueError('boom')")

CASES: list[Case] = [
    Case(
        "map-raises-attempts",
        "map raises, with --max-task-attempts 6",
        (*RUN, "--max-task-attempts", "6"),
        names=("map task 0 failed 6 times", "--max-task-attempts 6", "ValueError"),
        source=BAD_MAP,
        setup=words,
        user_frames="job.py",
    ),
    Case(
        "map-raises-one-attempt",
        "map raises, with --max-task-attempts 1",
        (*RUN, "--max-task-attempts", "1"),
        names=("map task 0 failed once", "--max-task-attempts 1", "ValueError"),
        source=BAD_MAP,
        setup=words,
        user_frames="job.py",
    ),
    Case(
        "reduce-raises-attempts",
        "reduce raises, with --max-task-attempts 2",
        (*RUN, "--reducers", "1", "--max-task-attempts", "2"),
        names=("reduce of partition 0 failed 2 times", "--max-task-attempts 2", "boom"),
        source=BAD_REDUCE,
        setup=words,
        user_frames="job.py",
    ),
]
