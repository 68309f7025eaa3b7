"""The short paths submit and the worker take through many small files' names and URLs
(a plain path below its root, a plain ``file:///`` URL, an absolute path) say what the
general ones (posixpath.relpath, urlparse, pathlib) say, over many generated cases."""

from __future__ import annotations

import itertools
import os
import posixpath
import random
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from cmr.fileurls import file_path, file_url
from cmr.inputs import name_below


def test_name_below_says_what_relpath_says() -> None:
    parts = ["a", "b", ".", "..", "", "...", ".h", "a b", "%2e"]
    for base in ["/", "/a", "/a/", "/a/b", "//a", "/x/../a", "/a/."]:
        for k in range(1, 4):
            for comb in itertools.product(parts, repeat=k):
                for location in (base.rstrip("/") + "/" + "/".join(comb),):
                    for loc in (location, location + "/"):
                        assert name_below(base, loc) == posixpath.relpath(loc, base), (base, loc)


def test_file_urls_and_paths_say_what_pathlib_and_urlparse_say() -> None:
    rng = random.Random(7)
    names = ["/", "a", "%", " ", "?", "#", "é", "\udcff", "..", ".", "//", "~", ":", ";"]
    for _ in range(5000):
        p = Path("/" + "".join(rng.choice(names) for _ in range(rng.randint(0, 6))))
        assert file_url(p) == p.absolute().as_uri()
    pieces = ["/", "a", "%2e", "%2F", ".", "..", "?", "#", ";", " ", "\t", "\n", "%", "%zz",
              "\x7f", "\x01", "é", "%C3%A9", "%ff", "//", ":", "@", "[", "]"]  # fmt: skip
    for _ in range(20000):
        start = rng.choice(["file:///", "file://", "file:////", "file:///a/", "file://h/"])
        url = start + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        assert _outcome(file_path, url) == _outcome(_general_path, url), url
    assert file_url(Path(os.getcwd())) == Path(".").absolute().as_uri()


def _general_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path, errors="surrogateescape"))


def _outcome(fn: Callable[[str], Path], url: str) -> str:
    try:
        return str(fn(url))
    except ValueError as exc:  # urlparse's, for a host it cannot parse
        return f"{type(exc).__name__}: {exc}"
