"""Small inputs that break naive splitters and decoders."""

from __future__ import annotations

import random
from pathlib import Path


def edge_cases(root: Path, seed: int = 7) -> Path:
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    words = ["alpha", "beta", "gamma", "δέλτα", "ε", "日本語", "x", "yy", "zzz"]
    (root / "empty.txt").write_bytes(b"")
    (root / "no-final-newline.txt").write_bytes(b"one two\nthree four five")
    (root / "crlf.txt").write_bytes(b"windows line\r\nanother\r\n\r\nend\r\n")
    (root / "invalid-utf8.txt").write_bytes(
        b"ok \xff\xfe bad\n\xc3\x28 x\n\xe6\x97\xa5\xe6\n\xf0\x9f"
    )
    long_line = " ".join(rnd.choice(words) for _ in range(2_000)).encode()
    (root / "one-long-line.txt").write_bytes(long_line)
    (root / "whitespace.txt").write_bytes(
        b"\t tab\x0bvt\x0cff\x1cfs \xc2\x85nel\xe2\x80\xa8ls\n\n\n"
    )
    nested = root / "deeper" / "still"
    nested.mkdir(parents=True, exist_ok=True)
    for i in range(5):
        lines = [
            " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 12)))
            for _ in range(rnd.randint(0, 400))
        ]
        (nested / f"f{i}.txt").write_text("\n".join(lines), encoding="utf-8")
    return root


def small_files(root: Path, count: int, seed: int = 3) -> Path:
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"s{i:04d}.txt").write_text(
            " ".join(f"w{rnd.randint(0, 50)}" for _ in range(rnd.randint(0, 30))) + "\n"
        )
    return root
