"""Job-class adapters: the seam through which a compat layer runs another framework's jobs.

The engine runs ``cmr.Job`` subclasses and knows no other framework. A package that runs
another framework's job classes unmodified (``cmr.mrjob`` runs mrjob's) plugs in here: it
names an object with :class:`JobAdapter`'s methods by an entry point of the group
``cmr.adapters`` in its distribution's metadata, e.g. in pyproject.toml::

    [project.entry-points."cmr.adapters"]
    mrjob = "cmr.mrjob:adapter"

The engine imports no adapter by name. When a job file defines no ``cmr.Job``,
:func:`cmr.job.load_job_class` asks the installed adapters (:func:`installed`) for their
framework's base class, and the first that finds one job class there adapts it into a
``cmr.Job``. The client asks the same adapter, through this module, what a submission
needs besides (:func:`job_args`, :func:`inputs_listed`): the adapter is an adapted class's
only voice, so what a framework needs never reaches the engine's modules by name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from cmr.errors import JobCodeError, UsageError

if TYPE_CHECKING:
    from cmr.job import Job
    from cmr.jobload import LoadedJob

GROUP = "cmr.adapters"  # the entry-point group adapters are named in


class JobAdapter(Protocol):
    """What a compat layer gives the engine for its framework's job classes."""

    def job_base(self) -> type | None:
        """The framework's base class of jobs, if a job's code imported the framework (None
        otherwise: the adapter imports nothing of it first)."""

    def adapt(self, cls: type) -> type[Job]:
        """A ``cmr.Job`` subclass that runs the framework's job class ``cls``."""

    def submission(self, cls: type[Job], argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        """For a job of ``cls`` (adapted here) run with ``argv`` (what followed ``cmr run
        ... --``): its params, and the extra side files (``PATH#NAME``) it ships."""

    def inputs_listed(self, params: Mapping[str, str], root: str, one_file: bool) -> dict[str, str]:
        """The params of a submission (``submission``'s among them) once its inputs are
        listed: ``root`` is the directory map's input names are below, or the one input
        file (``one_file``)."""


@functools.cache
def installed() -> tuple[JobAdapter, ...]:
    """The adapters installed (their entry points by name), loaded once per process."""
    # Imported here, not at the top: importlib.metadata (email parsing included) costs
    # every cmr process ~0.1 s to import, and only a job file that defines no cmr.Job asks.
    from importlib.metadata import entry_points

    found: list[JobAdapter] = []
    for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name):
        try:
            found.append(ep.load())
        except Exception as exc:
            raise JobCodeError(
                f"the job adapter {ep.name} ({ep.value}) cannot be loaded: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return tuple(found)


# Which adapter made each adapted class (in this process): the one asked about its jobs.
_made: dict[type, JobAdapter] = {}


def adapt(adapter: JobAdapter, cls: type) -> type[Job]:
    """``cls`` adapted by ``adapter``, which answers for the class from now on."""
    made = adapter.adapt(cls)
    _made[made] = adapter
    return made


def adapter_of(cls: type[Job]) -> JobAdapter | None:
    """The adapter that made ``cls``; None for a ``cmr.Job`` of the user's own."""
    return _made.get(cls)


def job_args(job: LoadedJob, argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """For ``cmr run JOB ... -- ARGS``: the params and extra side files (``PATH#NAME``) an
    adapted job needs (its arguments; its adapter's say); none for a ``cmr.Job``, which
    takes ``--param`` instead of ARGS (refused)."""
    adapter = adapter_of(job.cls)
    if adapter is None:
        if argv:
            raise UsageError(
                f"arguments after -- ({' '.join(argv)}) are for mrjob jobs; {job.ref.target} "
                "is a cmr.Job: give it --param KEY=VALUE"
            )
        return {}, []
    return adapter.submission(job.cls, argv)


def inputs_listed(
    cls: type[Job], params: Mapping[str, str], root: str, one_file: bool
) -> dict[str, str]:
    """A submission's params once its inputs are listed (see ``JobAdapter.inputs_listed``):
    as they are for a ``cmr.Job``."""
    adapter = adapter_of(cls)
    return dict(params) if adapter is None else adapter.inputs_listed(params, root, one_file)
