"""Where a job reads and writes, checked at submit before anything is written: the output
is not inside the input (the next run would read this one's output) nor the input inside
the output, and a local output directory can be made and written to.

Writability is probed, not asked: ``os.access`` answers yes to root on a read-only or
pseudo file system (/sys, /proc), where the first write fails only after the whole job ran.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cmr import storeurls
from cmr.errors import UsageError
from cmr.inputs import glob_owns, has_magic, literal_dir


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> Path:
    # Normalised (``..`` and ``.`` folded, as a shell user reads the path): the job record
    # accepts no ``..`` in a URL.
    return Path(os.path.abspath(path.removeprefix("file://")))


def check_apart(source: str, output: str) -> None:
    """Refuses an output inside the input, an input inside the output, and one place given
    as both: local paths as they resolve (links followed), s3 URLs by bucket and key."""
    if is_local(source) != is_local(output):
        return  # one local, one in a store: never the same place
    if has_magic(source) and not (is_local(source) and os.path.lexists(local_path(source))):
        _check_apart_glob(source, output)
        return
    if is_local(source):
        src, out = local_path(source).resolve(), local_path(output).resolve()
    elif storeurls.is_store_url(source) and storeurls.is_store_url(output):
        src, out = storeurls.as_path(source), storeurls.as_path(output)
    else:
        return
    if src == out:
        raise UsageError(
            f"the output {output} is the input {source}: the job would write its parts among "
            "the files it reads. Give another output directory"
        )
    if out.is_relative_to(src):
        raise UsageError(
            f"the output {output} lies inside the input {source}: the next run would read "
            "this run's output as input. Give an output outside the input"
        )
    if src.is_relative_to(out):
        raise UsageError(
            f"the input {source} lies inside the output {output}: publishing (or "
            "--overwrite) would mix parts with the input. Give an output that does not "
            "contain the input"
        )


def _check_apart_glob(pattern: str, output: str) -> None:
    """A glob input and the output: the output is no match (nor under one) of the pattern,
    now or once it exists, and the pattern's matches do not lie inside the output."""
    if is_local(pattern):
        pat, out = str(local_path(pattern)), local_path(output)
        resolved_out = out.resolve()
    elif storeurls.is_store_url(pattern) and storeurls.is_store_url(output):
        pat, out = str(storeurls.as_path(pattern)), storeurls.as_path(output)
        resolved_out = out
    else:
        return
    if glob_owns(pat, str(out)) or glob_owns(pat, str(resolved_out)):
        raise UsageError(
            f"the output {output} lies inside the input {pattern} (it matches the pattern): "
            "the next run would read this run's output as input. Give an output outside "
            "the input"
        )
    if Path(literal_dir(pat)).is_relative_to(out):
        raise UsageError(
            f"the input {pattern} lies inside the output {output}: publishing (or "
            "--overwrite) would mix parts with the input. Give an output that does not "
            "contain the input"
        )


def probe_output_dir(output: str) -> Path:
    """The local output directory, checked now without making it: it is (or would be) a
    directory, and a file can be created and removed in it or, if it does not exist yet, in
    its nearest existing parent (where ``make_output_dir`` will create it)."""
    path = local_path(output)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output {output} exists and is not a directory: give a directory")
    nearest = path
    while not nearest.exists():
        if nearest.is_symlink():
            raise UsageError(
                f"output {output}: {nearest} is a symbolic link to {nearest.resolve()}, which "
                "does not exist: fix the link, or give another output"
            )
        nearest = nearest.parent
    if not nearest.is_dir():
        raise UsageError(
            f"output {output} lies under {nearest}, which is a file, not a directory: give "
            "a directory"
        )
    try:
        fd, probe = tempfile.mkstemp(dir=nearest, prefix=".cmr-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        what = "output directory" if nearest == path else f"output {output}: its parent"
        raise UsageError(
            f"{what} {nearest} cannot be written ({exc.strerror}): give an output in a "
            "writable directory"
        ) from None
    return path


def make_output_dir(path: Path, output: str) -> None:
    """Create the (probed) output directory, once everything else about the job checked."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the output directory {output} ({exc.strerror}): give an output "
            "in a writable directory"
        ) from None
