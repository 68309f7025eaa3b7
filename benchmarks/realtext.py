"""Real text for word count: this machine's own documents, man pages and Python sources.

    .venv/bin/python benchmarks/realtext.py [--size-mb 200] [--small-mb 80] [--files 4000]
        [--seed 1]

The seeded corpus (benchmarks/wordcount.py) draws its words from a 50,000-word vocabulary;
real text has far more distinct words (identifiers, numbers, paths, roff escapes, words of
a dozen languages), which is what makes a word count's keys many. The documents:

- every regular file under ``/usr/share/doc`` and ``/usr/share/man`` (``.gz`` decompressed;
  man pages as their roff source, as ``zcat`` shows them);
- the ``.py``, ``.pyi``, ``.txt``, ``.rst`` and ``.md`` files under ``/usr/lib/python3*``
  (the system's Python; not this checkout's ``.venv``, whose packages change with the lock
  files and the extras installed, which would change the corpus from one commit to the next).

Binary files (a NUL byte, or more than 1 in 1,000 bytes a control character) and repeats
(the same bytes under another name) are left out. The documents, listed in sorted order,
are shuffled with ``random.Random(seed)`` and concatenated, each ending with a newline;
the corpus is the first ``--size-mb`` MB of that stream, cut at a line end and written as
8 files of about equal size, cut at line ends (like the seeded corpus). The small-files
variant is the first ``--small-mb`` MB of the same stream cut at line ends into ``--files``
files of about equal size, 100 to a directory (like benchmarks/smallfiles.py). Both are
made once and reused (``benchmarks/data/``, which git ignores); the same machine, seed and
sizes give the same bytes, and a JSON file beside each records its digest, its sources and
its distinct words (delete the directory to rebuild it).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MB = 1_000_000
FILES = 8  # the big corpus's files, as the seeded corpus's
PER_DIR = 100  # small files to a directory
DOCS = (Path("/usr/share/doc"), Path("/usr/share/man"))
SOURCE_SUFFIXES = {".py", ".pyi", ".txt", ".rst", ".md"}
CONTROLS = bytes([*range(0, 9), *range(14, 27), *range(28, 32), 127])  # not \t\n\v\f\r ESC
MAX_CONTROLS = 1 / 1000  # a document with more control bytes than this is binary


def python_dirs() -> list[Path]:
    """Where this machine keeps the system Python's sources."""
    found = sorted(Path("/usr/lib").glob("python3*"))
    return [p for p in found if p.is_dir() and not p.is_symlink()]


def documents() -> list[Path]:
    """Every candidate document, sorted (symbolic links left out: their targets are listed
    where they live, and a link may lead out of the sources)."""
    found: set[Path] = set()
    for root in DOCS:
        found.update(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    for root in python_dirs():
        found.update(
            p
            for p in root.rglob("*")
            if p.suffix in SOURCE_SUFFIXES and p.is_file() and not p.is_symlink()
        )
    return sorted(found)


def text_of(path: Path) -> bytes | None:
    """The document's text (decompressed), or None when it is binary or unreadable."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None
    if not data or b"\0" in data:
        return None
    if len(data) - len(data.translate(None, CONTROLS)) > len(data) * MAX_CONTROLS:
        return None
    return data if data.endswith(b"\n") else data + b"\n"


def stream(seed: int) -> Iterator[tuple[Path, bytes]]:
    """The documents in the seeded order, repeats left out."""
    docs = documents()
    random.Random(seed).shuffle(docs)
    seen: set[bytes] = set()
    for path in docs:
        data = text_of(path)
        if data is None:
            continue
        digest = hashlib.sha256(data).digest()
        if digest in seen:
            continue
        seen.add(digest)
        yield path, data


def prefix(size: int, seed: int) -> tuple[bytes, dict[str, int]]:
    """The first ``size`` bytes of the stream, cut back to a line end, and the bytes it
    took from each source root."""
    parts: list[bytes] = []
    held = 0
    by_root: Counter[str] = Counter()
    roots = [*DOCS, *python_dirs()]
    for path, data in stream(seed):
        root = next(str(r) for r in roots if path.is_relative_to(r))
        take = data[: size - held]
        parts.append(take)
        by_root[root] += len(take)
        held += len(take)
        if held >= size:
            break
    data = b"".join(parts)
    if len(data) < size:
        raise SystemExit(f"this machine holds only {len(data) / MB:.1f} MB of text")
    cut = data.rfind(b"\n") + 1
    by_root[root] -= len(data) - cut
    return data[:cut], dict(by_root)


def pieces(data: bytes, n: int) -> list[bytes]:
    """data cut after the first newline at or past each of n equal shares (the last piece
    takes the rest): every piece holds whole lines, none is empty; fewer than n when the
    lines are fewer."""
    out: list[bytes] = []
    start = 0
    for i in range(n):
        target = len(data) * (i + 1) // n
        end = len(data) if i == n - 1 else data.find(b"\n", max(target, start + 1) - 1) + 1
        if end <= start:
            end = len(data)
        out.append(data[start:end])
        start = end
        if start >= len(data):
            break
    return out


def words_in(files: list[Path]) -> tuple[int, int]:
    """(distinct words, words) as word count counts them: UTF-8 with errors replaced,
    ``str.split()``."""
    counts: Counter[str] = Counter()
    for p in files:
        counts.update(p.read_bytes().decode("utf-8", "replace").split())
    return len(counts), counts.total()


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _build(path: Path, size_mb: float, seed: int, n: int, per_dir: int) -> None:
    started = time.monotonic()
    data, by_root = prefix(round(size_mb * MB), seed)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i, piece in enumerate(pieces(data, n)):
        into = tmp / f"{i // per_dir:03d}" if per_dir else tmp
        into.mkdir(exist_ok=True)
        (into / f"part-{i:05d}.txt").write_bytes(piece)
    files = files_of(tmp)
    distinct, words = words_in(files)
    meta = {
        "bytes": len(data),
        "files": len(files),
        "sha256": hashlib.sha256(data).hexdigest(),
        "seed": seed,
        "distinct_words": distinct,
        "words": words,
        "bytes_by_source": by_root,
        "built_s": round(time.monotonic() - started, 1),
    }
    path.with_name(path.name + ".json").write_text(json.dumps(meta, indent=2) + "\n")
    tmp.rename(path)  # atomic: a half-written corpus is never reused


def corpus(size_mb: float = 200, seed: int = 1, root: Path = HERE / "data") -> Path:
    """The big corpus's directory (FILES files), made once and reused."""
    path = root / f"realtext-{size_mb:g}mb-seed{seed}"
    if not path.is_dir():
        _build(path, size_mb, seed, FILES, 0)
    return path


def small_files(
    size_mb: float = 80, files: int = 4000, seed: int = 1, root: Path = HERE / "data"
) -> Path:
    """The small-files variant's directory (``files`` files, PER_DIR to a directory)."""
    path = root / f"realtext-{size_mb:g}mb-{files}files-seed{seed}"
    if not path.is_dir():
        _build(path, size_mb, seed, files, PER_DIR)
    return path


def meta(path: Path) -> dict[str, Any]:
    """What _build recorded about a corpus: bytes, files, digest, distinct words..."""
    doc: dict[str, Any] = json.loads(path.with_name(path.name + ".json").read_text())
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--small-mb", type=float, default=80)
    ap.add_argument("--files", type=int, default=4000, help="the small-files variant's")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    for path in (
        corpus(args.size_mb, args.seed),
        small_files(args.small_mb, args.files, args.seed),
    ):
        m = meta(path)
        print(
            f"{path}: {m['bytes'] / MB:.1f} MB in {m['files']} files, {m['words']:,} words, "
            f"{m['distinct_words']:,} distinct; sha256 {m['sha256'][:16]}"
        )
        for source, n in sorted(m["bytes_by_source"].items()):
            print(f"    {n / MB:7.1f} MB from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
