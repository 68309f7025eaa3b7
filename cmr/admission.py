"""What a worker agrees to do for a job it finds in the table.

The table is shared, and a job record is input like any message: whoever can write one item
could otherwise choose what every worker imports and where it writes. Before a worker does
anything for a job, it holds the record (already type- and range-checked by
``JobSpec.from_item``) against its own configuration:

* **Job code** only from where the worker was told to take it (``cmr worker --jobs-from``):
  directories, whose files (resolved, links followed) must lie inside them, and module
  names, whose submodules are allowed too. The source is found without importing anything
  (``cmr.job.module_source``); the job's digest is checked against it before its import.
* **Scratch** is the worker's own: the job's plan, attempt outputs and spills live under the
  scratch prefix of the store the worker serves, nowhere else.
* **Output** only under the prefixes the worker may publish to (``--outputs-under``; by
  default the bucket of its own store).

A refused job is not failed (another worker may be configured to run it); this worker
just never serves it, and says why once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cmr.errors import JobCodeError, UsageError
from cmr.job import JobRef, is_module_name, location, source_path
from cmr.records import JobSpec
from cmr.settings import WorkerSettings


@dataclass(frozen=True)
class Admission:
    directories: tuple[Path, ...]  # resolved: job files must lie inside one of these
    modules: tuple[str, ...]  # job modules must be one of these, or inside one of them
    outputs: tuple[str, ...]  # URL prefixes, each ending in "/"
    scratch: str  # the store's scratch prefix, without its trailing "/"

    @staticmethod
    def of(jobs_from: Sequence[str], outputs_under: Sequence[str], scratch: str) -> Admission:
        """``jobs_from``: directories and module names (default: the current directory);
        ``outputs_under``: URL prefixes (default: the scratch's bucket, or any local
        directory for a local scratch)."""
        directories: list[Path] = []
        modules: list[str] = []
        for entry in jobs_from or [os.getcwd()]:
            # Only a path is a directory (it has a "/", or is "."): a module name must not
            # turn into a directory allowance because the worker's cwd holds one by that name.
            if ("/" in entry or entry == ".") and os.path.isdir(entry):
                directories.append(Path(entry).resolve())
            elif entry.isascii() and is_module_name(entry):
                modules.append(entry)
            else:
                raise UsageError(
                    f"--jobs-from {entry!r} is neither a directory nor a module name: give "
                    "the directory job files live in, or the package their modules are in"
                )
        outputs = [u if u.endswith("/") else u + "/" for u in outputs_under]
        for url in outputs:
            if not url.startswith(("s3://", "file://")) or url in ("s3:///", "file:///"):
                raise UsageError(
                    f"--outputs-under {url!r}: give an s3://BUCKET/ prefix or a file:// directory"
                )
        if not outputs:
            outputs = [_default_outputs(scratch)]
        return Admission(tuple(directories), tuple(modules), tuple(outputs), scratch.rstrip("/"))

    def refusal(self, spec: JobSpec) -> str | None:
        """Why this worker will not serve the job, or None when it may."""
        if spec.scratch.rstrip("/") != self.scratch:
            return (
                f"its scratch {spec.scratch} is not this worker's ({self.scratch}/): it was "
                "submitted to another store or prefix"
            )
        if not _under(spec.output, self.outputs):
            return (
                f"its output {spec.output} is outside where this worker may write "
                f"({', '.join(self.outputs)}; see --outputs-under)"
            )
        return self.code_refusal(spec.ref)

    def code_refusal(self, ref: JobRef) -> str | None:
        where = location(ref.target)
        if where.rpartition(".")[2] == "__main__" or Path(where).name == "__main__.py":
            return f"its job code {ref.target} is a __main__ module, which runs when imported"
        if not where.endswith(".py") and any(
            where == m or where.startswith(m + ".") for m in self.modules
        ):
            return None
        try:
            path = source_path(ref).resolve()
        except JobCodeError as exc:
            return f"its job code cannot be found here: {exc}"
        if any(path.is_relative_to(d) for d in self.directories):
            return None
        allowed = [str(d) for d in self.directories] + list(self.modules)
        return (
            f"its job code {ref.target} ({path}) is not among what this worker runs "
            f"({', '.join(allowed) or 'nothing'}; see --jobs-from)"
        )


def _under(url: str, prefixes: Sequence[str]) -> bool:
    # A prefix ends in "/": s3://b/out/ does not admit s3://b/out2/.
    return any((url if url.endswith("/") else url + "/").startswith(p) for p in prefixes)


def _default_outputs(scratch: str) -> str:
    if scratch.startswith("s3://"):
        bucket = scratch.removeprefix("s3://").split("/", 1)[0]
        return f"s3://{bucket}/"
    # A local scratch is the embedded backend's, inside one process: its table is written by
    # nobody else, so any local directory may be an output.
    return "file://"


def serving_own_job(settings: WorkerSettings, spec: JobSpec) -> WorkerSettings:
    """Settings for workers the submitter starts for its own job (`cmr run`): they may run
    that job's code and write its output, whatever else their settings allow."""
    where = location(spec.ref.target)
    origin = str(source_path(spec.ref).resolve().parent) if where.endswith(".py") else where
    return replace(
        settings,
        jobs_from=(*settings.jobs_from, origin),
        outputs_under=(*settings.outputs_under, spec.output),
    )
