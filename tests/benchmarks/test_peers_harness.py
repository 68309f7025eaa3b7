"""The word-count benchmark's peers harness, without building any peer's venv.

Covers what the harness itself promises: peak memory of a whole process tree, a run's
timeout, crash and leftover-daemon handling, the runner scripts' word definition (their
counting functions need no tool), and the benchmark command's JSON and "not run" rows.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from tests.engine.corpus import edge_cases

REPO = Path(__file__).resolve().parents[2]
RUNNERS = REPO / "benchmarks" / "peers"
MB = 1_000_000

# benchmarks/peers.py, imported by name: mypy would take benchmarks/peers/ (the runners'
# directory, a namespace package to it) for the module, since benchmarks/ has no __init__.
peers: Any = importlib.import_module("benchmarks.peers")


def wordcount() -> Any:
    """benchmarks/wordcount.py (typed Any: the script is not checked by mypy)."""
    return importlib.import_module("benchmarks.wordcount")


def runner(name: str) -> Any:
    """A runner script, imported into this venv: it imports its tool only when run. Its
    directory goes on sys.path, as it is when the script runs (its shared byte_ranges)."""
    if str(RUNNERS) not in sys.path:
        sys.path.insert(0, str(RUNNERS))
    spec = importlib.util.spec_from_file_location(f"peer_{name}", RUNNERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------- peak memory

HOLD = """
import sys, time
data = b"x" * {size}  # written, so resident (a calloc'd bytearray might not be)
print("ready", flush=True)
sys.stdin.read()
"""


def test_peak_rss_counts_a_child_that_allocates_150_mb() -> None:
    with (
        peers.PeakRss(os.getpid(), interval=0.02) as peak,
        subprocess.Popen(
            [sys.executable, "-c", HOLD.format(size=150 * MB)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        ) as child,
    ):
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == b"ready\n"
        time.sleep(0.2)  # several samples while the child holds its memory
        child.stdin.close()
        child.wait()
    # Sampled repeatedly, not once: a floor, not a rate (15-17 samples here in the ~0.3 s
    # at 20 ms; a slower, loaded machine's sampler takes fewer in the same wall time).
    assert peak.samples >= 3
    assert peak.mb >= 150
    assert peak.mb - peak.first / MB >= 140, "the peak comes from the child, not from us"


def test_peak_rss_sums_grandchildren() -> None:
    """Two grandchildren of 80 MB each under one child: the sum, not the largest one."""
    parent = textwrap.dedent(
        f"""
        import subprocess, sys
        hold = {HOLD.format(size=80 * MB)!r}
        kids = [subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE) for _ in range(2)]
        for k in kids:
            k.stdout.readline()
        print("ready", flush=True)
        sys.stdin.read()
        for k in kids:
            k.stdin.close()
            k.wait()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        with peers.PeakRss(child.pid, interval=0.02) as peak:
            assert child.stdout.readline() == b"ready\n"
            time.sleep(0.2)
            child.stdin.close()
            child.wait()
    assert peak.mb >= 160
    assert len(peak.seen) == 2


# ---------------------------------------------------------------------------- peer runs


def fake_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Any:
    """A peer whose "venv" python is this interpreter and whose script is ``body``."""
    monkeypatch.setattr(peers, "VENVS", tmp_path / "venvs")
    (tmp_path / "venvs" / "fake" / "bin").mkdir(parents=True)
    (tmp_path / "venvs" / "fake" / "bin" / "python").symlink_to(sys.executable)
    script = tmp_path / "fake_wc.py"
    script.write_text(textwrap.dedent(body))
    return peers.Peer("fake", "fake", "fake", "fake", str(script), "test")


COUNTING = """
import argparse, collections, pathlib, subprocess, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--workers"); ap.add_argument("--scratch"); ap.add_argument("--output")
ap.add_argument("files", nargs="+")
a = ap.parse_args()
# a helper that holds 100 MB while the count runs, and a daemon left running on purpose
helper = subprocess.Popen([sys.executable, "-c", {hold!r}], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE)
helper.stdout.readline()
time.sleep(0.3)  # long enough for several samples
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)
pathlib.Path(a.scratch, "daemon.pid").write_text(str(daemon.pid))
counts = collections.Counter()
for f in a.files:
    counts.update(pathlib.Path(f).read_bytes().decode("utf-8", "replace").split())
out = pathlib.Path(a.output)
out.mkdir(parents=True)
(out / "part-00000").write_text("".join(f"{{w}}\\t{{n}}\\n" for w, n in counts.items()))
(out / "_SUCCESS").write_text("")
helper.stdin.close()
helper.wait()
"""


def test_run_times_counts_measures_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer = fake_peer(tmp_path, monkeypatch, COUNTING.format(hold=HOLD.format(size=100 * MB)))
    data = tmp_path / "in.txt"
    data.write_bytes(b"a b\r\nb \xff c\n")
    scratch = tmp_path / "scratch"
    run = peers.run(peer, [data], tmp_path / "out", workers=2, timeout=60, scratch=scratch)
    assert run.failure is None
    assert run.seconds is not None and 0 < run.seconds < 60
    assert run.parts == [str(tmp_path / "out" / "part-00000")]  # not the _SUCCESS marker
    assert wordcount().read_parts(run.parts) == Counter({"a": 1, "b": 2, "\ufffd": 1, "c": 1})
    assert run.peak_mb is not None and run.peak_mb >= 100
    assert run.cpu_s is not None and run.cpu_s > 0
    daemon = int((scratch / "daemon.pid").read_text())
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == "zombie", (
        "a daemon the tool left behind must not outlive its row"
    )


def test_run_reports_a_crash_with_its_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "import sys\nprint('starting', file=sys.stderr)\nraise SystemExit('no JVM here')\n"
    peer = fake_peer(tmp_path, monkeypatch, body)
    run = peers.run(peer, [], tmp_path / "out", workers=2, timeout=60, scratch=tmp_path / "scratch")
    assert run.seconds is None
    assert run.failure is not None
    assert run.failure.startswith("failed: exit 1")
    assert "no JVM here" in run.failure


def test_run_times_out_and_kills_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = """
    import pathlib, subprocess, sys, time
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pathlib.Path(sys.argv[sys.argv.index("--scratch") + 1], "kid.pid").write_text(str(kid.pid))
    time.sleep(600)
    """
    peer = fake_peer(tmp_path, monkeypatch, body)
    started = time.monotonic()
    scratch = tmp_path / "scratch"
    run = peers.run(peer, [], tmp_path / "out", workers=2, timeout=2, scratch=scratch)
    assert time.monotonic() - started < 30
    assert run.failure == "failed: timed out after 2s"
    kid = int((scratch / "kid.pid").read_text())
    assert not psutil.pid_exists(kid) or psutil.Process(kid).status() == "zombie"


def test_select_and_versions() -> None:
    assert [p.name for p in peers.select("all")] == list(peers.PEERS)
    assert peers.select("none") == []
    assert [p.name for p in peers.select("spark,dask,spark")] == ["spark", "dask"]
    with pytest.raises(ValueError, match="unknown peer hadoop"):
        peers.select("dask,hadoop")
    for peer in peers.PEERS.values():  # every peer has a pinned requirements file
        assert peer.requirements.exists()
        assert peer.version()[0].isdigit(), peer.requirements


# ------------------------------------------------------------------ word definition


@pytest.fixture(scope="module")
def awkward(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The engine tests' edge cases, a small benchmark corpus, and every bad byte sequence
    the corpus generator uses next to a CR, at a line end and inside a word."""
    root = tmp_path_factory.mktemp("awkward")
    edge_cases(root / "edge")
    wordcount().corpus(0.2, 5, root=root / "generated")
    bad = b"".join(
        b"w%s \x85x\xc2\x85y%s\r\nv%s\n" % (seq, seq, seq) for seq in wordcount().BAD_BYTES
    )
    (root / "bad.txt").write_bytes(bad + b"tail\rmid" + "\u2028end\u3000".encode())
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def want(awkward: list[Path]) -> Counter[str]:
    counts: Counter[str] = wordcount().baseline(awkward)
    return counts


def test_the_awkward_corpus_catches_a_different_decoding(
    awkward: list[Path], want: Counter[str]
) -> None:
    """mrjob's default protocol (UTF-8, else latin-1 per line) must give other words here,
    or the checks below could not catch a runner that decodes wrongly."""
    naive: Counter[str] = Counter()
    for path in awkward:
        for line in path.read_bytes().split(b"\n"):
            try:
                naive.update(line.decode("utf-8").split())
            except UnicodeDecodeError:
                naive.update(line.decode("latin-1").split())
    assert naive != want


@pytest.mark.parametrize("chunk", [1, 4096, 1 << 20])
@pytest.mark.parametrize("name", ["lithops_wc", "spark_wc"])
def test_byte_range_runners_count_like_the_baseline(
    name: str, chunk: int, awkward: list[Path], want: Counter[str]
) -> None:
    mod = runner(name)
    ranges = [r for p in awkward for r in mod.line_ranges(str(p), chunk)]
    for path in awkward:  # contiguous, complete, every cut just after a b"\n"
        mine = [(a, b) for p, a, b in ranges if p == str(path)]
        data = path.read_bytes()
        if not data:
            assert mine == []
            continue
        assert [a for a, _ in mine] == [0, *(b for _, b in mine[:-1])]
        assert all(data[b - 1 : b] == b"\n" for _, b in mine[:-1])
        assert mine[-1][1] == len(data)
    if name == "lithops_wc":
        got = mod.merge([mod.count_range(*r) for r in ranges])
    else:
        got = Counter(w for r in ranges for w in mod.range_words(r))
    assert got == want


def test_mrjob_runner_counts_like_the_baseline(awkward: list[Path], want: Counter[str]) -> None:
    """mrjob hands the mapper each b"\\n"-split line with trailing b"\\r\\n" stripped."""
    mod = runner("mrjob_wc")
    got: Counter[str] = Counter()
    for path in awkward:
        with path.open("rb") as f:
            for line in f:
                got.update(mod.line_words(line.rstrip(b"\r\n")))
    assert got == want
    out = mod.WordCountOutput()
    assert out.read(out.write("na\u00efve\ufffd", 12)) == ("na\u00efve\ufffd", 12)
    assert mod.mrjob_args(["--step-num=0", "--mapper"]) == ["--step-num=0", "--mapper"]
    args = mod.mrjob_args(
        ["--runner", "local", "--workers", "2", "--scratch", "/s", "--output", "/o", "in"]
    )
    assert args == [
        *("--runner", "local", "--no-conf", "--num-cores", "2", "--local-tmp-dir", "/s"),
        *("--output-dir", "/o", "--no-cat-output", "in"),
    ]


def test_dask_runner_counts_like_the_baseline(awkward: list[Path], want: Counter[str]) -> None:
    """Dask's read_text(blocksize=..., linedelimiter="\\n", errors="replace") cuts blocks
    after b"\\n", decodes each block and splits it on "\\n" only (dask/bag/text.py)."""
    mod = runner("dask_wc")
    lithops = runner("lithops_wc")
    got: Counter[str] = Counter()
    for path in awkward:
        for _, a, b in lithops.line_ranges(str(path), 4096):
            with path.open("rb") as f:
                f.seek(a)
                text = f.read(b - a).decode("utf-8", "replace")
            got += mod.count_lines(list(io.StringIO(text, newline="\n")))
    assert got == want


# ---------------------------------------------------------------------- the command


def bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "wordcount.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "peak MB" in done.stdout
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_benchmark_reports_peak_memory_for_every_row(tmp_path: Path) -> None:
    result = bench(tmp_path, "--size-mb", "1", "--backends", "embedded", "--peers", "none")
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["baseline", "cmr embedded w=1"]
    assert rows["cmr embedded w=1"]["exact"] is True
    for row in rows.values():
        assert row["peak_mb"] > 20  # at least this interpreter
        assert row["peak_mb"] >= row["start_mb"] > 0
    # cmr's pool processes (a second or more of work) are counted on top of this process
    cmr = rows["cmr embedded w=1"]
    assert cmr["peak_mb"] > cmr["start_mb"] + 20


def test_a_peer_that_cannot_run_says_why(tmp_path: Path) -> None:
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    result = bench(tmp_path, "--size-mb", "1", "--backends", "none", "--peers", "spark", env=env)
    rows = result["rows"]
    assert [r["name"] for r in rows] == ["baseline", f"pyspark {peers.PEERS['spark'].version()}"]
    assert rows[1]["note"].startswith("not run: Java missing")
    assert rows[1]["seconds"] is None
    assert rows[1]["exact"] is None
