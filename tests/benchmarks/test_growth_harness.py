"""The growth and small-files benchmarks' harness, cheaply: the linear fit, the exact check,
the corpora, a tiny growth run end to end, and a reducer that really spills to disk."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cmr.cpu import reducing, runs
from cmr.cpu.results import ReduceResult
from cmr.cpu.specs import ReduceSpec
from cmr.job import JobRef

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = JobRef.parse(f"{REPO / 'examples' / 'wordcount.py'}:WordCount")

# The benchmark scripts, typed Any: they are not checked by mypy (benchmarks/ has no
# __init__; they import each other by putting benchmarks/ on sys.path).
growth: Any = importlib.import_module("benchmarks.growth")
smallfiles: Any = importlib.import_module("benchmarks.smallfiles")


# --------------------------------------------------------------------------------- fit


def test_fit_recovers_a_line_exactly() -> None:
    slope, intercept, r2 = growth.fit(
        [25, 50, 100, 200, 400], [2.5 + 0.1 * x for x in (25, 50, 100, 200, 400)]
    )
    assert slope == pytest.approx(0.1)
    assert intercept == pytest.approx(2.5)
    assert r2 == pytest.approx(1.0)


def test_fit_r2_matches_a_hand_computed_case() -> None:
    # By hand: means 2.5 and 2.5; Sxy = 3, Sxx = 5, so slope 0.6 and intercept 1.0;
    # residuals -0.6, 0.8, 0.2, -0.4 give SS_res = 1.2 against SS_tot = 3: R² = 0.6.
    slope, intercept, r2 = growth.fit([1, 2, 3, 4], [1, 3, 3, 3])
    assert slope == pytest.approx(0.6)
    assert intercept == pytest.approx(1.0)
    assert r2 == pytest.approx(0.6)


def test_fit_says_when_time_grows_faster_than_linear() -> None:
    sizes = [25, 50, 100, 200, 400]
    _, _, r2 = growth.fit(sizes, [(x / 25) ** 2 for x in sizes])  # quadratic time
    assert r2 < 0.98
    with pytest.raises(ValueError, match="two different x"):
        growth.fit([1, 1], [1, 2])


# ---------------------------------------------------------------------- exact check


def test_compare_finds_wrong_missing_and_repeated_words(tmp_path: Path) -> None:
    want = Counter({"a": 2, "b": 1, "ü": 3})
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("a\t2\nb\t1\nü\t3\n", encoding="utf-8")
    assert growth.compare(Counter(want), [str(good)]) == []
    bad.write_text("a\t2\na\t2\nb\t7\n", encoding="utf-8")  # repeated, wrong, missing ü
    diff = growth.compare(Counter(want), [str(bad)])
    assert diff and diff[0] == "2 words wrong, 1 missing"


# --------------------------------------------------------------------------- corpora


@pytest.mark.slow
def test_growth_corpus_vocabulary_grows_with_size(tmp_path: Path) -> None:
    small = growth.growth_corpus(0.2, 3, 2, tmp_path)
    large = growth.growth_corpus(0.4, 3, 2, tmp_path)
    assert growth.growth_corpus(0.2, 3, 2, tmp_path) == small  # generated once, reused
    words = [growth.count_words(growth.input_files(p)) for p in (small, large)]
    once = [sum(1 for w, n in c.items() if w.isdigit() and n == 1) for c in words]
    lines = [
        sum(len(f.read_bytes().rstrip(b"\n").split(b"\n")) for f in growth.input_files(p))
        for p in (small, large)
    ]
    assert once == [2 * n for n in lines]  # two never-repeated tokens on every line
    assert 1.9 < once[1] / once[0] < 2.1  # so they double with the size
    assert len(words[1]) - len(words[0]) >= once[1] - once[0]


@pytest.mark.slow
def test_small_files_hold_the_same_bytes_as_one_file(tmp_path: Path) -> None:
    one, many = smallfiles.corpora(0.3, 37, 5, tmp_path)
    pieces = sorted(p for p in many.rglob("*") if p.is_file())
    assert len(pieces) == 37
    assert b"".join(p.read_bytes() for p in pieces) == one.read_bytes()
    sizes = [p.stat().st_size for p in pieces]
    assert all(p.read_bytes().endswith(b"\n") for p in pieces)  # whole lines only
    assert max(sizes) < 2 * min(sizes)


# ------------------------------------------------------------------ reducer spilling


def _spools(tmp_path: Path, keys: int, tasks: int = 4) -> tuple[list[str], Counter[str], int]:
    """Map outputs as a reducer receives them: per task, msgpack (word, count) pairs."""
    want: Counter[str] = Counter()
    packer = msgpack.Packer(use_bin_type=True)
    paths = []
    for t in range(tasks):
        path = tmp_path / f"spool-{t}"
        with path.open("wb") as f:
            for i in range(t, keys, tasks):
                for word, n in ((f"u{i}", 1), (f"w{i % 97}", t + 1)):
                    f.write(packer.pack((word, n)))
                    want[word] += n
        paths.append(str(path))
    return paths, want, sum(os.path.getsize(p) for p in paths)


def _reduce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int, keys: int
) -> tuple[ReduceResult, list[int], Counter[str], int]:
    spools, want, size = _spools(tmp_path, keys)
    seen: list[int] = []  # sizes of the sorted runs written to disk, observed as files

    def observing(write: Callable[..., str]) -> Callable[..., str]:
        def observed(*args: Any) -> str:
            path = write(*args)
            assert os.path.dirname(path) == str(tmp_path / "spill")
            seen.append(os.path.getsize(path))
            return path

        return observed

    # Runs are written grouped (write_run) or as sorted pairs (write_pairs_run, the path of
    # plain keys): every name the reduce calls them by is observed.
    for module in (reducing, runs):
        for name in ("write_run", "write_pairs_run"):
            monkeypatch.setattr(module, name, observing(getattr(runs, name)))
    (tmp_path / "spill").mkdir()
    out = tmp_path / "out"
    spec = ReduceSpec("growth", str(out), budget, str(tmp_path / "spill"))
    result = reducing.run_reduce(WORDCOUNT, {}, spools, spec)
    assert result.error == ""
    assert os.listdir(tmp_path / "spill") == []  # runs are removed after the merge
    assert growth.compare(want, [str(out)]) == []
    return result, seen, want, size


def test_a_reducer_over_its_budget_spills_and_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 64 * 1024
    result, seen, _, size = _reduce(tmp_path, monkeypatch, budget, keys=20_000)
    assert size > 2 * budget  # the partition is bigger than the budget
    assert len(seen) >= 2 and all(n > 0 for n in seen)
    assert result.spills == len(seen)  # the counter the job record shows is the files
    assert sum(seen) >= size // 2  # the pairs went through the runs (combined ones are less)


def test_a_reducer_within_its_budget_does_not_spill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, seen, _, size = _reduce(tmp_path, monkeypatch, 64 * 1024 * 1024, keys=20_000)
    assert size < 64 * 1024 * 1024
    assert seen == [] and result.spills == 0


# -------------------------------------------------------------------- the whole thing


@pytest.mark.slow
def test_growth_benchmark_runs_small_sizes_exactly(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "growth.py"), "--sizes", "1,2"]
    cmd += ["--memory-mb", "0", "--json", str(out)]
    cmd += ["--data", str(tmp_path / "data"), "--out-root", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [round(r["size_mb"], 1) for r in rows] == [1.0, 2.0]
    for r in rows:
        assert r["exact"] is True
        assert r["seconds"] > 0 and r["mb_s"] > 0 and r["cpu_s"] > 0
        assert r["peak_rss_mb"] > r["peak_main_mb"] > 10  # main + pool processes, sampled
        assert r["peak_pool_mb"] > 10
        assert r["budget_bytes"] == 64 * 1024
        assert r["largest_partition_bytes"] > r["budget_bytes"]
        assert r["spill_runs"] > 0
    assert rows[1]["largest_partition_bytes"] > rows[0]["largest_partition_bytes"]
    summary = report["summary"]
    for key in ("slope_s_per_mb", "intercept_s", "r2", "peak_rss_max_over_min"):
        assert key in summary
    assert summary["budget_below_every_largest_partition"] is True
    assert "R² =" in proc.stdout
