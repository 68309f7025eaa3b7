"""The job instances a pool process keeps: one set-up instance per job (``setup`` runs
once, not per task), the step a task runs, and the names of its methods in messages.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from cmr import counters, sidefiles
from cmr.errors import JobCodeError
from cmr.job import Job, JobRef, Step, load_job_class, steps_of

# Set-up instances by job id: two jobs running the same code with the same params still get
# an instance each, so state one job's tasks keep on ``self`` never reaches the other's.
_instances: collections.OrderedDict[str, tuple[JobRef, dict[str, str], Job]] = (
    collections.OrderedDict()
)
INSTANCES_KEPT = 8  # jobs whose instance a pool process keeps (a fleet worker serves many)


def job_instance(
    job_id: str, ref: JobRef, params: dict[str, str], lines: str = "", files_dir: str = ""
) -> Job:
    """One set-up instance per job per process (``setup`` runs once, not per task).
    ``lines``: the job's line endings as submitted, if it chose them ("": the class's).
    ``files_dir``: where this worker keeps the job's side files (``Job.file``)."""
    # Every task begins here: its job's side files are those Job.file finds from now on
    # (before setup too: it may open them).
    sidefiles.serve(files_dir)
    slot = _slot(job_id, files_dir)
    kept = _instances.get(slot)
    if kept is not None and kept[0] == ref and kept[1] == params:
        _instances.move_to_end(slot)
        return kept[2]
    inst = load_job_class(ref)(params)
    if lines:
        inst.lines = lines  # type: ignore[misc]  # the submission's choice, seen by setup too
    with counters.paused():
        inst.setup()
    _instances[slot] = (ref, dict(params), inst)
    while len(_instances) > INSTANCES_KEPT:
        _instances.popitem(last=False)  # the job served least recently: likely ended
    return inst


def forget_instance(job_id: str, files_dir: str = "") -> None:
    """Drop the job's instance (set up on ``files_dir``'s side files), if this process
    keeps one: the job ended, and its instance holds what its setup made."""
    _instances.pop(_slot(job_id, files_dir), None)
    if sidefiles.serving() == files_dir:
        sidefiles.serve("")  # no code of the job runs here any more (cmr.testing's client)


def _slot(job_id: str, files_dir: str) -> str:
    # Two workers sharing this pool keep side files of their own: an instance each, set up
    # on its worker's copies (alternating tasks must not set one instance up over and over).
    return f"{job_id} {files_dir}" if files_dir else job_id


# Each instance's steps (job_step), by identity: a user's job may define __eq__ without a
# hash, and the engine puts nothing on the user's object. The instance is held with its
# steps, so its id is never another's meanwhile.
_steps: dict[int, tuple[Job, list[Step]]] = {}


def job_step(job: Job, step: int) -> tuple[Step, str]:
    """Step ``step`` of the job (its steps() asked once per instance), and its name in
    messages: ``J`` for a one-step job, ``J step 2`` in a pipeline."""
    kept = _steps.get(id(job))
    if kept is None or kept[0] is not job:
        kept = (job, steps_of(job))
        # Kept for the set-up instances kept here and the last other one asked (a task's
        # own, from for_task, asked again by the same task): no more, none for long.
        live = {id(i) for _, _, i in _instances.values()} | {id(job)}
        for gone in [k for k in _steps if k not in live]:
            del _steps[gone]
        _steps[id(job)] = kept
    steps = kept[1]
    name = type(job).__name__
    if step >= len(steps):
        raise JobCodeError(
            f"{name}.steps() now returns {len(steps)} steps; the job was submitted with "
            f"more (step {step + 1}): its code or parameters differ on this worker"
        )
    return steps[step], (name if len(steps) == 1 else f"{name} step {step + 1}")


def mapper_name(job: Job, step: Step, name: str, lines: bool = True) -> str:
    """The step's map method as messages name it (``name``: the step's, from job_step):
    map_chunk where the class has its own and reads ``lines``; ``(no map)`` for none."""
    if step.map is None and step.map_chunk is None:
        return f"{name} (no map)"
    cls = type(job)
    if lines and step.map_chunk is not None and cls.map_chunk is not Job.map_chunk:
        return f"{name}.map_chunk"
    return f"{name}.map"


def hook(fn: Callable[[], Any] | None) -> Any:
    """A step's init/final hook's result (pairs from a final hook; None: none)."""
    return None if fn is None else fn()
