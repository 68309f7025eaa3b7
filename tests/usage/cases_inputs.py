"""Several inputs, globs and hidden files: every --input given is read (never only the
last), a glob that matches nothing is named, and a directory's files whose names start with
``_`` or ``.`` are not input, as in Hadoop (a TeraGen or Hadoop output directory reads as
its records)."""

from __future__ import annotations

from pathlib import Path

from tests.usage.cases import RUN, Case, _with, file_at, words

TWO = ("run", "{job}", "--input", "{in}", "--input", "{tmp}/more", "--output", "{out}")


def hadoop_output(tmp: Path) -> None:
    """What a Hadoop job leaves: parts, an empty _SUCCESS, and .crc checksum files."""
    (tmp / "in").mkdir()
    (tmp / "in" / "part-00000").write_text("a b\n")
    (tmp / "in" / "_SUCCESS").write_text("")
    (tmp / "in" / ".part-00000.crc").write_bytes(b"crc\x00\x00\x02\x00\x00")
    (tmp / "in" / "._SUCCESS.crc").write_bytes(b"crc\x00\x00\x02\x00\x00")


def only_hidden(tmp: Path) -> None:
    (tmp / "in").mkdir()
    (tmp / "in" / "_SUCCESS").write_text("")


CASES: list[Case] = [
    Case(
        "inputs-several",
        "several --input options (all are read, in order)",
        TWO,
        code=0,
        setup=_with(words, file_at("more/x.txt", "a z\n")),
        expect_lines=("Paris\t1", "a\t3", "b\t2", "c\t1", "z\t1"),
    ),
    Case(
        "input-glob-no-match",
        "a glob input that matches no files",
        (*RUN, "--input", "{tmp}/logs/2027-*"),
        names=("input pattern", "logs/2027-*", "matches no files"),
        setup=_with(words, file_at("logs/2026-11-01.txt")),
    ),
    Case(
        "input-only-hidden",
        "the input directory holds only hidden files (names starting with _ or .)",
        RUN,
        names=("{in}", "hidden"),
        setup=only_hidden,
    ),
    Case(
        "input-hadoop-output",
        "a Hadoop output directory as input (_SUCCESS and .crc files are skipped)",
        RUN,
        code=0,
        setup=hadoop_output,
        expect_lines=("a\t1", "b\t1"),
    ),
    Case(
        "output-in-second-input",
        "the output lies inside one of several inputs",
        ("run", "{job}", "--input", "{tmp}/more", "--input", "{in}", "--output", "{tmp}/more/out"),
        names=("{tmp}/more/out", "lies inside the input"),
        setup=_with(words, file_at("more/x.txt")),
    ),
    Case(
        "output-matches-input-glob",
        "the output is where a glob input would match",
        ("run", "{job}", "--input", "{tmp}/data/*", "--output", "{tmp}/data/out"),
        names=("{tmp}/data/out", "lies inside the input"),
        setup=file_at("data/x.txt"),
    ),
]
