"""A local input, listed and checked at submit: every file a job will read, each readable,
with a UTF-8 name, and nothing else.

What a task would fail on (an unreadable file, a name map cannot be given, a dangling
link, a named pipe) is found here, named, and refused before any work starts. A
directory's symbolic links, to files or directories, are followed while their targets stay
inside it, as if what they point to were copied there: a link out of it is refused, so a job
never reads, or uploads, a file nobody named (someone's ~/.ssh, a secret in /tmp); a link
to a directory that contains it (a loop) is refused too, since following it never ends. An
input that is itself a link is the user's own choice, and followed.

Files and directories whose names start with ``_`` or ``.`` below an input directory are not
input (Hadoop's rule, :mod:`cmr.inputs`): a Hadoop output's ``_SUCCESS`` and ``.crc`` files
are never read, and a hidden link is never followed.
"""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path

from cmr.errors import UsageError
from cmr.inputs import glob_keeps, is_hidden


def local_files(path: Path) -> list[Path]:
    """The files of a local input (a file, or everything below a directory), in name
    order; refuses at once what a job could not read."""
    return [f for f, _ in local_files_stat(path)]


def local_files_stat(path: Path) -> list[tuple[Path, os.stat_result]]:
    """:func:`local_files`, each with its ``stat`` (links followed) as checked: what submit
    records of it (its identity, cmr.localcheck) without a second stat per file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(
            f"input {path} does not exist: give an existing file or directory"
        ) from None
    except OSError as exc:
        raise UsageError(f"input {path} cannot be read ({exc.strerror}): fix it") from None
    if stat.S_ISREG(mode):
        files = [path]
    elif stat.S_ISDIR(mode):
        files = _walk(path)
        if not files:
            raise UsageError(
                f"input {path} holds no files{_hidden_note(path)}: put the input files in "
                "it, or give another input (a file or a directory)"
            )
    else:
        raise UsageError(
            f"input {path} is {_kind(mode)}, not a file or a directory: give a file or a "
            "directory of files"
        )
    return [(f, _check_file(f)) for f in files]


def _walk(top: Path) -> list[Path]:
    """Every non-directory entry below ``top``, links to directories followed (see the
    module's doc); a depth-first walk that knows each directory's ancestors, which a link
    back to one of them would make it revisit forever."""
    root = top.resolve()
    found: list[Path] = []
    pending: list[tuple[Path, tuple[tuple[int, int], ...]]] = [(top, (_identity(top),))]
    while pending:
        where, ancestors = pending.pop()
        try:
            with os.scandir(where) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(
                f"input directory {where} cannot be listed ({exc.strerror}): make it "
                "readable, or remove it from the input"
            ) from None
        for entry in entries:
            if is_hidden(entry.name):
                continue  # Hadoop's rule: _SUCCESS, .crc files, _temporary/ are no input
            path = Path(where, entry.name)
            # Checked before the walk goes in: a link to / is refused, never walked.
            if entry.is_symlink():
                _refuse_outside(path, root)
            if entry.is_dir(follow_symlinks=True):
                identity = _identity(path)
                if identity in ancestors:
                    raise UsageError(_loop(path))
                pending.append((path, (*ancestors, identity)))
            else:
                found.append(path)
    return sorted(found)


def _hidden_note(path: Path) -> str:
    try:
        with os.scandir(path) as listing:
            hidden = any(is_hidden(e.name) for e in listing)
    except OSError:
        return ""
    return " but hidden ones (names starting with _ or ., which are not input)" if hidden else ""


def glob_matches(pattern: str, given: str = "") -> list[Path]:
    """The paths a local glob matches, in name order, hidden names left out unless the
    pattern asks for them (:func:`cmr.inputs.glob_keeps`); UsageError naming the pattern
    as ``given`` when none."""
    found = glob.glob(pattern, include_hidden=True)
    kept = sorted(Path(m) for m in found if glob_keeps(pattern, m))
    if not kept:
        note = f" but {len(found)} hidden (names starting with _ or .)" if found else ""
        raise UsageError(
            f"input pattern {given or pattern} matches no files{note}: check the pattern "
            "(quote it, so the shell does not expand it), or give an existing file or directory"
        )
    return kept


def _identity(directory: Path) -> tuple[int, int]:
    st = directory.stat()
    return st.st_dev, st.st_ino


def _loop(link: Path) -> str:
    target = link.resolve()
    # Where the link itself lies, when the walk reached it through other links.
    real = Path(os.path.realpath(link.parent), link.name)
    at = "" if real == link else f" (the link {real})"
    return (
        f"input {link}{at} is a symbolic link to {target}, a directory that contains it: "
        "a loop, which would be read forever. Remove the link from the input"
    )


def _refuse_outside(link: Path, root: Path) -> None:
    """Refuses a symbolic link whose target lies outside the input directory ``root``
    (resolved)."""
    try:
        target = link.resolve()
    except (OSError, RuntimeError):  # a loop of links (RuntimeError up to Python 3.12)
        raise UsageError(
            f"input {link} is a loop of symbolic links: remove it from the input"
        ) from None
    if target == root or target.is_relative_to(root):
        return
    raise UsageError(
        f"input {link} is a symbolic link to {target}, outside the input directory {root}: "
        "a job reads only what lies under its input. Copy what it points to into the "
        "directory, or remove the link"
    )


def _check_file(f: Path) -> os.stat_result:
    try:
        str(f).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"input file {os.fsencode(f)!r} has a name that is not valid UTF-8 (map would "
            "receive a garbled name): rename it, or remove it from the input"
        ) from None
    try:
        st = os.stat(f)
    except FileNotFoundError:
        raise UsageError(
            f"input {f} is a symbolic link to {f.resolve()}, which does not exist: fix the "
            "link, or remove it from the input"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"input {f} cannot be read ({exc.strerror}): fix it, or remove it from the input"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"input {f} is {_kind(st.st_mode)}, not a regular file: remove it from the input"
        )
    if not os.access(f, os.R_OK):
        raise UsageError(
            f"input file {f} cannot be read (permissions): make it readable (chmod +r), or "
            "remove it from the input"
        )
    return st


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"
