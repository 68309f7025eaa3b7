"""mrjob jobs whose arguments choose what cmr cannot run or name what is not there: the
answer is one line naming the job and the culprit, from the job made with its arguments
(cmr asks a job made without them nothing it could not answer)."""

from __future__ import annotations

from pathlib import Path

from tests.usage.cases import RUN, Case, words

JOBS = Path(__file__).resolve().parents[1] / "mrjob" / "jobs"
STEPS_BY_ARGS = (JOBS / "mr_steps_by_args.py").read_text()
FILE_ARG_AT_LOAD = (JOBS / "mr_file_arg_at_load.py").read_text()

CASES: list[Case] = [
    Case(
        "mrjob-mapper-cmd-by-args",
        "an mrjob job's arguments choose a shell command as its mapper (mapper_cmd)",
        (*RUN, "--", "--mapper-cmd", "cat"),
        names=("MRStepsByArgs step 1 uses mapper_cmd", "Hadoop Streaming"),
        source=STEPS_BY_ARGS,
        setup=words,
    ),
    Case(
        "mrjob-steps-raise",
        "an mrjob job's steps() raises (an MRStep with no mapper and no reducer)",
        RUN,
        names=("MRStepsByArgs.steps() raised ValueError", "Step has no mappers and no reducers"),
        source=STEPS_BY_ARGS,
        setup=words,
    ),
    Case(
        "mrjob-file-arg-missing",
        "an mrjob job's file argument names no file (opened in load_args)",
        (*RUN, "--", "--n-file", "side/nope"),
        names=("MRFileArgAtLoad --n-file side/nope", "No such file or directory"),
        source=FILE_ARG_AT_LOAD,
        setup=words,
    ),
]
