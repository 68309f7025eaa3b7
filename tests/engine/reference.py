"""Independent answers to compare cmr's output with: plain sequential Python."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from cmr.publish import MANIFEST, Manifest


def files_under(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())


def word_count(root: Path) -> Counter[str]:
    """The issue's definition, line by line: split on b"\\n", decode with errors replaced,
    str.split()."""
    counts: Counter[str] = Counter()
    for path in files_under(root):
        for line in path.read_bytes().split(b"\n"):
            counts.update(line.decode("utf-8", "replace").split())
    return counts


def inverted_index(root: Path) -> dict[str, list[str]]:
    index: dict[str, set[str]] = defaultdict(set)
    for path in files_under(root):
        name = path.name if root.is_file() else path.relative_to(root).as_posix()
        for line in path.read_bytes().split(b"\n"):
            for word in line.decode("utf-8", "replace").lower().split():
                index[word].add(name)
    return {w: sorted(s) for w, s in index.items()}


def part_paths(out: Path, reducers: int) -> list[Path]:
    """The parts of a published output, read as a reader must: from its _SUCCESS manifest.
    Fails unless the manifest lists one part per partition, in order, and the directory
    holds nothing else (no leftovers of earlier or failed jobs)."""
    manifest = Manifest.from_bytes((out / MANIFEST).read_bytes())
    names = [p.name for p in manifest.parts]
    assert [n[:10] for n in names] == [f"part-{p:05d}" for p in range(reducers)], names
    assert all(n.endswith("-" + manifest.job) for n in names), names
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, *names])
    return [out / n for n in names]


def read_parts(out: Path, reducers: int) -> list[tuple[str, str]]:
    """(key, value) lines of the output's parts, in partition order."""
    rows = []
    for path in part_paths(out, reducers):
        text = path.read_bytes().decode("utf-8")
        assert text == "" or text.endswith("\n")
        for line in text.splitlines():
            key, _, value = line.rpartition("\t")
            rows.append((key, value))
    return rows


def counts_from_parts(out: Path, reducers: int) -> Counter[str]:
    rows = read_parts(out, reducers)
    keys = [k for k, _ in rows]
    assert len(keys) == len(set(keys)), "a word appears in two lines or two parts"
    return Counter({k: int(v) for k, v in rows})


def index_from_parts(out: Path, reducers: int) -> dict[str, list[str]]:
    return {k: json.loads(v) for k, v in read_parts(out, reducers)}
