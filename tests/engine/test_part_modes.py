"""A part, or any blob, is never readable by others while it is being written: the
embedded store creates its temporary files 0600 and gives them the mode the user's umask
asks for only once they are complete. Watched through a whole ``cmr.run`` in a child
process, whose audit hook stats every file the instant after it was opened for writing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Runs in a child: an audit hook stays for the life of its process. At the first audited
# event after a file under the watched places was opened for writing (in the same thread),
# the file exists and nothing else has been done to it yet: its mode then is the mode it
# was created with.
WATCH = r"""
import json, os, sys, threading
import cmr

out, scratch_root = sys.argv[1], sys.argv[2]
seen, fresh, inside = [], {}, threading.local()


def watched(path):
    return path.startswith(out) or path.startswith(scratch_root + "/cmr-scratch-")


def hook(event, args):
    if getattr(inside, "busy", False):
        return
    inside.busy = True
    try:
        pending = fresh.pop(threading.get_ident(), None)
        if pending is not None and os.path.lexists(pending):
            seen.append((pending, os.lstat(pending).st_mode & 0o777))
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            if args[2] & (os.O_WRONLY | os.O_RDWR) and watched(path):
                fresh[threading.get_ident()] = path
    finally:
        inside.busy = False


sys.addaudithook(hook)
os.umask(0o027)
cmr.run("examples/wordcount.py", sys.argv[3], out, reducers=3)
print(json.dumps(seen))
"""


def test_temporary_files_are_private_and_published_parts_follow_the_umask(
    tmp_path: Path,
) -> None:
    data = tmp_path / "in.txt"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    out, spool = tmp_path / "out", tmp_path / "tmp"
    spool.mkdir()
    env = {**os.environ, "TMPDIR": str(spool)}  # the run's scratch and spools live here
    got = subprocess.run(
        [sys.executable, "-c", WATCH, str(out), str(spool), str(data)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    seen = json.loads(got.stdout.splitlines()[-1])
    # Each part is written once, by its reducer in its own work directory (mkdtemp: 0700),
    # then hard-linked complete into scratch (upload_file(frozen=True)) and into the output:
    # no part is ever opened for writing where others could look. The manifest is written
    # in the output itself, through a private temporary file.
    in_scratch = [p for p, _ in seen if p.startswith(str(spool))]
    assert [p for p in in_scratch if "/out/" in p] == [], seen
    assert [p for p, _ in seen if p.startswith(f"{out}/") and "_SUCCESS" not in p] == [], seen
    assert any(p.startswith(f"{out}/._SUCCESS") for p, _ in seen), seen
    exposed = [(p, oct(mode)) for p, mode in seen if mode & 0o077]
    assert exposed == [], "files readable by others while being written"
    # Complete, they have the mode any other tool's output gets under the user's umask.
    published = sorted(out.iterdir())
    assert [p.name for p in published if p.name.startswith(".")] == []  # no temporary left
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in published} == {
        p.name: "0o640" for p in published
    }
    assert len(published) == 4  # three parts and _SUCCESS
