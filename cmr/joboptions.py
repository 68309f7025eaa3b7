"""A job's submission options: how it runs, checked once, in one frozen value.

``cmr run``'s flags and ``cmr.run``'s keywords (:class:`cmr.api.RunOptions`) become one
:class:`JobOptions` when the job is submitted (:meth:`JobOptions.of`, given the loaded
job: its steps decide which run and with how many partitions); submit writes them into the
job record (:class:`cmr.records.JobSpec`) as they are. Every check of a job's settings is
here, in ``__post_init__``, whoever builds them (the CLI, ``cmr.run``, ``cmr.testing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmr import formats
from cmr.errors import UsageError
from cmr.job import Job, steps_of
from cmr.jobload import LoadedJob
from cmr.records import MAX_PARTITIONS, MAX_TASK_TIMEOUT_S, MAX_TASK_TRIES, MAX_VISIBILITY_S
from cmr.settings import LineEnds, ShuffleMode

LINE_MODES = tuple(str(m) for m in LineEnds)
SHUFFLE_MODES = tuple(str(m) for m in ShuffleMode)


@dataclass(frozen=True)
class JobOptions:
    """How a job runs, checked once at submit; nonsense is refused with the fix to make."""

    partitions: int
    visibility_s: int = 60
    max_task_failures: int = 3  # runs of one task that raise (--max-task-attempts)
    max_task_attempts: int = 10  # starts of one task that never end (its workers died)
    task_timeout_s: int = 0  # 0: grows with each task's input (cmr.timelimit)
    overwrite: bool = False
    params: dict[str, str] = field(default_factory=dict)
    lines: str = ""  # how input lines end ("": the job class's own ``lines``)
    # The steps to run (0-based indexes into the job's steps()), each one's partitions, and
    # how many steps the job has. One step of a one-step job: the defaults.
    first_step: int = 0
    last_step: int = 0
    step_partitions: tuple[int, ...] = ()
    job_steps: int = 1
    input_format: str = ""  # cmr.formats' input format ("": the job class's)
    output_format: str = ""  # cmr.formats' output format ("": the job class's)
    files: tuple[str, ...] = ()  # side files beyond the class's, "PATH[#NAME]" (cmr.sidefiles)
    total_order: bool = False  # sample keys, partition by range (or the class's total_order)
    shuffle: str = "auto"  # ShuffleMode: "auto" is settled at submit: input size, billed store

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise UsageError(what)

        need(
            1 <= self.partitions <= MAX_PARTITIONS,
            f"--reducers must be between 1 and {MAX_PARTITIONS:,} (one queue each); "
            f"got {self.partitions}",
        )
        need(
            1 <= self.visibility_s <= MAX_VISIBILITY_S,
            f"--visibility-timeout must be between 1 and {MAX_VISIBILITY_S:,} seconds (a task's "
            f"lease: 0 would hand every task to every worker at once, and SQS holds one 12 "
            f"hours at most); got {self.visibility_s}",
        )
        need(
            1 <= self.max_task_failures <= MAX_TASK_TRIES,
            f"--max-task-attempts must be between 1 and {MAX_TASK_TRIES:,} (how often one task "
            f"may raise before the job fails; workers refuse more); got "
            f"{self.max_task_failures}",
        )
        need(
            1 <= self.max_task_attempts <= MAX_TASK_TRIES,
            f"max_task_attempts must be between 1 and {MAX_TASK_TRIES:,} (how often one task "
            f"may be started without finishing or raising before the job fails; workers "
            f"refuse more); got {self.max_task_attempts}",
        )
        need(
            0 <= self.task_timeout_s <= MAX_TASK_TIMEOUT_S,
            f"--task-timeout must be between 1 and {MAX_TASK_TIMEOUT_S:,} seconds (a week: "
            f"workers refuse more), or 0 for the default that grows with each task's input; "
            f"got {self.task_timeout_s}",
        )
        for n in self.step_partitions:
            need(
                1 <= n <= MAX_PARTITIONS,
                f"a step's reducers must be between 1 and {MAX_PARTITIONS:,}; got {n}",
            )
        need(
            0 <= self.first_step <= self.last_step < self.job_steps
            and (
                self.job_steps == 1
                or len(self.step_partitions) == self.last_step - self.first_step + 1
            ),
            f"steps {self.first_step + 1} to {self.last_step + 1} are not steps of a job of "
            f"{self.job_steps}",
        )
        need(
            self.shuffle in SHUFFLE_MODES,
            f"unknown --shuffle {self.shuffle!r}: use one of {', '.join(SHUFFLE_MODES)}",
        )
        if self.lines and self.lines not in LINE_MODES:
            raise UsageError(
                f"unknown --lines {self.lines!r}: use one of {', '.join(LINE_MODES)} (or leave "
                "it out for the job's own)"
            )
        for flag, value, check in (
            ("--input-format", self.input_format, formats.parse_input),
            ("--output-format", self.output_format, formats.check_output),
        ):
            if value:
                try:
                    check(value)
                except formats.FormatError as exc:
                    raise UsageError(f"{flag}: {exc}") from None

    @staticmethod
    def of(
        job: LoadedJob,
        *,
        params: Mapping[str, str] | None = None,
        reducers: int | None = None,
        step: int | None = None,
        from_step: int | None = None,
        files: Sequence[str] = (),
        **settings: Any,
    ) -> JobOptions:
        """The options of a submission of ``job``: which of its steps run and each one's
        partitions, from ``reducers`` (None: the job's), ``step`` or ``from_step`` (1-based,
        as --step and --from-step); its ``params``, its side files (``files``, "PATH[#NAME]"
        each) and the other fields (``settings``), all checked."""
        if isinstance(files, str):
            raise UsageError(f"files= must be a list of paths, not one str: [{files!r}]")
        params = dict(params or {})
        return JobOptions(
            **_steps(job.cls, params, reducers, step, from_step),
            params=params,
            files=tuple(files),
            **settings,
        )


def _steps(
    cls: type[Job],
    params: Mapping[str, str],
    reducers: int | None,
    step: int | None = None,
    from_step: int | None = None,
) -> dict[str, Any]:
    """The :class:`JobOptions` fields saying which of the job's steps run, and each one's
    partitions: a step's own ``reducers`` win over the job's, and ``--reducers`` over both
    (a lone step's too: an mrjob job's JOBCONF gives it, as Hadoop's -D does)."""
    default = reducers if reducers is not None else cls.reducers
    steps = steps_of(_instance(cls, params))
    first, last = _step_range(len(steps), step, from_step)
    many = len(steps) > 1
    return {
        "partitions": default if many or reducers is not None else steps[0].reducers or default,
        "first_step": first,
        "last_step": last,
        "job_steps": len(steps),
        "step_partitions": tuple(
            reducers if reducers is not None else (s.reducers or default)
            for s in steps[first : last + 1]
        )
        if many
        else (),
    }


def _instance(cls: type[Job], params: Mapping[str, str]) -> Job:
    """The job, instantiated on the client to ask its steps (user code: its errors are the
    user's, said as such)."""
    from cmr import usercode

    try:
        return cls(dict(params))
    except Exception as exc:
        raise UsageError(f"creating {cls.__name__} failed: {usercode.describe(exc)}") from None


def _step_range(steps: int, step: int | None, from_step: int | None) -> tuple[int, int]:
    """(first, last) step indexes to run: all, one (``--step``), or from one on."""
    if step is not None and from_step is not None:
        raise UsageError("give --step (one step) or --from-step (a step and the rest), not both")
    chosen = step if step is not None else from_step
    if chosen is None:
        return 0, steps - 1
    if not 1 <= chosen <= steps:
        flag = "--step" if step is not None else "--from-step"
        raise UsageError(
            f"{flag} {chosen}: the job has {steps} step{'s' * (steps != 1)} (1 to {steps})"
        )
    return chosen - 1, (chosen - 1 if step is not None else steps - 1)
