"""Which files a job's inputs name: several inputs, globs, and Hadoop's hidden-file rule.

A run takes any number of inputs, each a file, a directory, an s3:// object or prefix, or
a glob (``*``, ``?``, ``[...]`` within one path component, as Hadoop's FileInputFormat and
mrjob take them) over either. Their files are read in the order the inputs are given; a
file given twice (or inside two inputs) is read twice, as Hadoop reads it.

Hidden files (Hadoop's ``hiddenFileFilter``): a file or directory whose name starts with
``_`` or ``.`` is not input when it is found by listing a directory (every path component
below the input's root), nor when it is a glob's match, unless the glob's own component
starts so too (``logs/_*``). Hadoop applies the same filter to a path named outright (and
then says "Input Pattern ... matches 0 files"); cmr reads what the user named.

Map sees each file's name below the deepest directory that holds every input: with one
input, the path below it (a directory) or the file's own name, as before; with several,
names keep the part of their paths that tells them apart (``a/part-0``, ``b/part-0``).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Sequence

from cmr import storeurls
from cmr.errors import UsageError

_MAGIC = re.compile(r"[*?[]")
_DOTS = re.compile(r"/\.\.?/")  # a "." or ".." component


def is_hidden(name: str) -> bool:
    """Hadoop's ``hiddenFileFilter``: names starting with ``_`` or ``.`` are not input."""
    return name.startswith(("_", "."))


def listed_is_input(below_root: str) -> bool:
    """Whether a file found by listing an input directory (its path below the root) is
    input: no component of that path is hidden."""
    return not any(is_hidden(p) for p in below_root.split("/"))


def has_magic(path: str) -> bool:
    return _MAGIC.search(path) is not None


def glob_keeps(pattern: str, match: str) -> bool:
    """Whether a glob's match is input: a hidden name only when the pattern's last component
    asks for one (starts with ``_`` or ``.`` itself)."""
    last = match.rstrip("/").rsplit("/", 1)[-1]
    return not is_hidden(last) or is_hidden(pattern.rstrip("/").rsplit("/", 1)[-1])


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def glob_owns(pattern: str, path: str) -> bool:
    """Whether ``path`` is a match of ``pattern`` (component by component, ``*`` never
    crossing a ``/``) or lies below one."""
    want, have = _parts(pattern), _parts(path)
    return len(have) >= len(want) and all(
        fnmatch.fnmatchcase(h, w) for h, w in zip(have, want, strict=False)
    )


def match_root(pattern: str, path: str) -> str | None:
    """The match of ``pattern`` that ``path`` is or lies below (``path`` up to as many
    components as the pattern has), or None."""
    if not glob_owns(pattern, path):
        return None
    want = len(_parts(pattern))
    ends = [m.end() for m in re.finditer(r"[^/]+", path)]
    return path[: ends[want - 1]] if want else ""


def literal_prefix(pattern: str) -> str:
    """The pattern up to its first glob character: what an S3 listing for it starts at."""
    found = _MAGIC.search(pattern)
    return pattern if found is None else pattern[: found.start()]


def literal_dir(pattern: str) -> str:
    """The deepest directory of the pattern with no glob character in it."""
    return literal_prefix(pattern).rsplit("/", 1)[0] or "/"


def base_of(dirs: Sequence[str]) -> str:
    """The deepest directory holding all of ``dirs`` (absolute paths, or s3:// URLs without
    a trailing ``/``); UsageError when they have none (one local and one in S3, or two
    buckets): map could not be given names that tell their files apart."""

    def split(d: str) -> tuple[str, list[str]]:
        if storeurls.is_store_url(d):
            root, key = storeurls.split(d)
            return root, _parts(key)
        return "", _parts(d)

    (scheme, common), *rest = [split(d) for d in dirs]
    for d, (other, parts) in zip(dirs[1:], rest, strict=True):
        if other != scheme:
            raise UsageError(
                f"inputs {dirs[0]} and {d} have no directory in common (another bucket, or "
                "one local and one in S3): map's file names could not tell their files "
                "apart. Copy them into one bucket (or one file system), or run one job each"
            )
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return scheme + "/" + "/".join(common) if scheme else "/" + "/".join(common)


def name_below(base: str, location: str) -> str:
    """A file's name as map sees it: its path below ``base`` (see :func:`base_of`)."""
    if storeurls.is_store_url(base):
        rest = location[len(base) :]
        return rest.lstrip("/")
    under = base.rstrip("/") + "/"
    if location.startswith(under):
        # A path below base, as listing makes them: what relpath would say, without its
        # normalising both paths (4,000 files: 50 ms). Only when nothing is left for it to
        # normalise: no "." or ".." component, no doubled "/", none at its end.
        rest = location[len(under) :]
        padded = f"/{rest}/"
        if "//" not in padded and not _DOTS.search(padded):
            return rest
    return posixpath.relpath(location, base)
