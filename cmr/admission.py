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
* **Input** only from where the worker may read for jobs (``--inputs-under``, by default the
  bucket of its own store), or from the job's own scratch (its staged input) and, for a
  pipeline's later step, the step before's outputs; never other jobs' scratch: every root,
  and every glob's directory before its first glob character. Side files are
  checked by ``JobSpec.from_item`` to be the job's own, under the scratch.
* **Queues** only under its store's queue prefix: a job's queues are created, read and
  deleted by name, and the name is the record's.

A refused job is not failed (another worker may be configured to run it); this worker
just never serves it, and says why once.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cmr import storeurls
from cmr.errors import JobCodeError, UsageError
from cmr.fileurls import file_path
from cmr.inputs import literal_prefix
from cmr.job import JobRef, is_module_name, location
from cmr.lifecycle import job_scratch
from cmr.records import JobSpec, step_job_id
from cmr.settings import AwsSettings, WorkerSettings


@dataclass(frozen=True)
class Admission:
    directories: tuple[Path, ...]  # resolved: job files must lie inside one of these
    modules: tuple[str, ...]  # job modules must be one of these, or inside one of them
    outputs: tuple[str, ...]  # URL prefixes, each ending in "/"
    scratch: str  # the store's scratch prefix, without its trailing "/"
    inputs: tuple[str, ...] = ()  # URL prefixes, each ending in "/" (beside own_scratch)
    queue_prefix: str = AwsSettings.queue_prefix  # the store's

    @staticmethod
    def of(
        jobs_from: Sequence[str],
        outputs_under: Sequence[str],
        scratch: str,
        inputs_under: Sequence[str] = (),
        queue_prefix: str = AwsSettings.queue_prefix,
    ) -> Admission:
        """``jobs_from``: directories and module names (default: the current directory);
        ``outputs_under``, ``inputs_under``: URL prefixes (default: the scratch's bucket, or
        any local directory for a local scratch); ``queue_prefix``: the store's."""
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
        outputs = _prefixes("--outputs-under", outputs_under) or [_default_outputs(scratch)]
        inputs = [_place(u) for u in _prefixes("--inputs-under", inputs_under)] or [
            _default_outputs(scratch)
        ]
        return Admission(
            tuple(directories),
            tuple(modules),
            tuple(outputs),
            scratch.rstrip("/"),
            tuple(inputs),
            queue_prefix,
        )

    def refusal(self, spec: JobSpec) -> str | None:
        """Why this worker will not serve the job, or None when it may."""
        if spec.scratch.rstrip("/") != self.scratch:
            return (
                f"its scratch {spec.scratch} is not this worker's ({self.scratch}/): it was "
                "submitted to another store or prefix"
            )
        if spec.queue_prefix != self.queue_prefix:
            return (
                f"its queue prefix {spec.queue_prefix!r} is not this worker's store's "
                f"({self.queue_prefix!r}): it was submitted to another store or prefix"
            )
        if not _under(spec.output, self.outputs):
            return (
                f"its output {spec.output} is outside where this worker may write "
                f"({', '.join(self.outputs)}; see --outputs-under)"
            )
        # Beyond --inputs-under, a job may read its own scratch (its staged input) and, for
        # a pipeline's later step, the outputs of the step before; not the rest of the
        # store's scratch, which holds other jobs' staged inputs and outputs.
        readable = [*self.inputs, *(_place(u) for u in own_scratch(spec))]
        for url in read_places(spec):
            if not _under(url, readable):
                return (
                    f"its input {url[:200]} is outside where this worker may read "
                    f"({', '.join(self.inputs)}; see --inputs-under)"
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
            path = ref.path().resolve()
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


def _prefixes(flag: str, given: Sequence[str]) -> list[str]:
    prefixes = [u if u.endswith("/") else u + "/" for u in given]
    for url in prefixes:
        if not url.startswith(("s3://", "azure://", "file://")) or url in (
            "s3:///",
            "azure:///",
            "file:///",
        ):
            raise UsageError(
                f"{flag} {url!r}: give an s3://BUCKET/ or azure://ACCOUNT/CONTAINER/ prefix, "
                "or a file:// directory"
            )
    return prefixes


def own_scratch(spec: JobSpec) -> list[str]:
    """The places in the store's scratch a job may read without --inputs-under: its own,
    and for a pipeline step after the first, the step before's outputs."""
    places = [job_scratch(spec.scratch, spec.job_id)]
    if spec.step > spec.first_step:
        before = step_job_id(spec.pipeline_id, spec.first_step, spec.step - 1)
        places.append(job_scratch(spec.scratch, before) + "out/")
    return places


def read_places(spec: JobSpec) -> list[str]:
    """Every place a worker reads the job's input from, as refusal compares them: each
    root, and for each glob the directory before its first glob character (a match may be
    anything below it: s3://b/a* matches the bucket s3://ab too, so only whole components
    count)."""
    roots = [_place(u) for u in (spec.input_root, *spec.input_roots)]
    return roots + [_place(g, glob=True) for g in spec.input_globs]


def _place(url: str, *, glob: bool = False) -> str:
    """A local URL as the embedded blob store and ``JobSpec.owns_input`` read it (decoded
    and normalised: "%2e%2e", "//" and a host part cannot lead out of a prefix), quoted
    again; an S3 URL as it is (S3 keys have no ".."). A glob: its literal directory."""
    if not url.startswith("file://") or url == "file://":
        return literal_prefix(url).rpartition("/")[0] + "/" if glob else url
    path = posixpath.normpath("/" + str(file_path(url)).lstrip("/"))  # not "//": it stays
    if glob:
        path = literal_prefix(path).rpartition("/")[0] or "/"
    uri = Path(path).as_uri()
    return uri + "/" if (glob or url.endswith("/")) and not uri.endswith("/") else uri


def _default_outputs(scratch: str) -> str:
    if storeurls.is_store_url(scratch):
        return storeurls.root_prefix(scratch)  # the store's own bucket (or container)
    # A local scratch is the embedded backend's, inside one process: its table is written by
    # nobody else, so any local directory may be an output.
    return "file://"


def serving_own_job(settings: WorkerSettings, spec: JobSpec) -> WorkerSettings:
    """Settings for workers the submitter starts for its own job (`cmr run`): they may run
    that job's code, read its input and write its output, whatever else their settings
    allow."""
    where = location(spec.ref.target)
    origin = str(spec.ref.path().resolve().parent) if where.endswith(".py") else where
    return replace(
        settings,
        jobs_from=(*settings.jobs_from, origin),
        outputs_under=(*settings.outputs_under, spec.output),
        # Read as refusal reads them: a glob's directory, not the pattern itself.
        inputs_under=(*settings.inputs_under, *dict.fromkeys(read_places(spec))),
    )
