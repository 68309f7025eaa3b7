"""The Hadoop peer and oracle (benchmarks/hadoop.py, benchmarks/vs_hadoop.py).

Without a JVM: command lines, TeraValidate's report read from real report files (a sorted
one, a failing one, an empty one), a real cmr output's parts linked in partition order, the
word totals. With one (``test_hadoop_teravalidate_tells_sorted_from_unsorted``): Hadoop 3.4.2
is installed from Maven Central (about 10 s into an empty cache) and TeraGen, TeraSort and
TeraValidate run for real, on Hadoop's own output and on unsorted copies of it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import cmr
from cmr.publish import Manifest, Part

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = f"{REPO / 'examples' / 'wordcount.py'}:WordCount"

# Imported by name: benchmarks/ is no package to mypy, and benchmarks/hadoop/ (the pom's
# directory) would pass for the module (see test_peers_harness.py).
hadoop: Any = importlib.import_module("benchmarks.hadoop")
peers: Any = importlib.import_module("benchmarks.peers")


def vs_hadoop() -> Any:
    return importlib.import_module("benchmarks.vs_hadoop")


# ------------------------------------------------------------------------ command lines


def test_command_runs_the_example_driver_in_local_mode_with_generic_options_first(
    tmp_path: Path,
) -> None:
    settings = hadoop.conf(workers=3, scratch=tmp_path, extra={"mapreduce.job.reduces": "4"})
    cmd = hadoop.command(
        "terasort", ["in", "out"], settings, lib=tmp_path / "lib", scratch=tmp_path,
        jvm=["-Xmx1g"],
    )  # fmt: skip
    driver = cmd.index(hadoop.DRIVER)
    assert cmd[0] == "java"
    assert "-Xmx1g" in cmd[:driver]
    assert cmd[cmd.index("-cp") + 1] == f"{hadoop.CONF}{os.pathsep}{tmp_path / 'lib' / '*'}"
    assert cmd[driver + 1] == "terasort"
    assert cmd[-2:] == ["in", "out"]  # the tool's own arguments come after every -D
    pairs = cmd[driver + 2 : -2]
    assert pairs[0::2] == ["-D"] * (len(pairs) // 2)
    given = dict(p.split("=", 1) for p in pairs[1::2])
    assert given["mapreduce.framework.name"] == "local"
    assert given["fs.defaultFS"] == "file:///"
    assert given["mapreduce.local.map.tasks.maximum"] == "3"
    assert given["mapreduce.local.reduce.tasks.maximum"] == "3"
    assert given["hadoop.tmp.dir"] == str(tmp_path / "hadoop-tmp")
    assert given["mapreduce.job.reduces"] == "4"
    assert (hadoop.CONF / "log4j.properties").is_file()  # what logs "number of splits"


def test_wordcount_chooses_its_input_format_by_setting() -> None:
    text = hadoop.wordcount_conf(None, reducers=2)
    assert "mapreduce.job.inputformat.class" not in text  # the example's TextInputFormat
    assert text["mapreduce.input.fileinputformat.input.dir.recursive"] == "true"
    assert text["mapreduce.job.reduces"] == "2"
    combine = hadoop.wordcount_conf(64 << 20)
    assert combine["mapreduce.job.inputformat.class"] == hadoop.COMBINE_INPUT
    assert combine["mapreduce.input.fileinputformat.split.maxsize"] == str(64 << 20)


def test_splits_are_read_from_each_submitted_job() -> None:
    log = (
        b"x INFO JobSubmitter: number of splits:200\nmore\nINFO JobSubmitter: number of splits:3\n"
    )
    assert hadoop.splits_in(log) == [200, 3]
    assert hadoop.splits_in(b"no job ran") == []


def test_a_cache_counts_as_installed_only_when_built_from_this_pom(tmp_path: Path) -> None:
    lib = hadoop.lib_dir(tmp_path)
    assert hadoop.ready(tmp_path) is None
    lib.mkdir(parents=True)
    (lib / "a.jar").write_bytes(b"jar a")
    (lib / "b.jar").write_bytes(b"jar b")
    (lib / hadoop.JARS).write_text(hadoop.jar_list(lib))
    (lib / hadoop.STAMP).write_text("another pom's hash\n")
    assert hadoop.ready(tmp_path) is None
    (lib / hadoop.STAMP).write_text(hadoop.pom_hash() + "\n")
    found = hadoop.ready(tmp_path)
    assert found is not None and found.jars == 2 and found.lib == lib and found.seconds == 0
    assert hadoop.jar_list(lib).splitlines()[0].startswith("a.jar\t")


INSTALL_AND_LOAD = """
import os, sys, time
from pathlib import Path
from benchmarks import hadoop
got = hadoop.install(Path(sys.argv[1]))
before = os.stat(got.lib).st_ino
time.sleep(float(sys.argv[2]))  # a JVM loading classes from got.lib meanwhile
assert got.lib.exists() and os.stat(got.lib).st_ino == before, "the jars were swapped away"
assert hadoop.ready(Path(sys.argv[1])) is not None
print(before)
"""


@pytest.mark.slow
def test_installs_racing_into_one_fresh_cache_build_it_once(tmp_path: Path) -> None:
    """CI's reproduction: test processes installed into one empty cache at once, and the
    second to finish deleted the jar directory the first had returned while its TeraGen
    loaded classes from it ("Could not find or load main class ...ExampleDriver")."""
    import subprocess
    import sys

    hadoop_here()  # the cache's Maven repository filled, so the racers need no network
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "m2").symlink_to(hadoop.cache_dir() / "m2")
    pipe = subprocess.PIPE
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", INSTALL_AND_LOAD, str(cache), pause],
            cwd=REPO,
            stdout=pipe,
            stderr=pipe,
            text=True,
        )
        for pause in ("8", "0")
    ]
    ran = [r.communicate(timeout=300) for r in racers]
    assert [r.returncode for r in racers] == [0, 0], [err[-2000:] for _, err in ran]
    assert ran[0][0] == ran[1][0]  # one directory, built once, never replaced
    assert not list(cache.glob(".lib-*.tmp"))


def test_waiting_for_another_installer_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installer that never lets go of the cache (a hung Maven, a stopped process) makes
    the next one fail with what to do, not wait for ever."""
    import fcntl

    if shutil.which("mvn") is None:
        pytest.skip("Maven is not installed")
    monkeypatch.setattr(hadoop, "INSTALL_TIMEOUT_S", 1)
    monkeypatch.setattr(hadoop, "LOCK_SLACK_S", 0)
    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / ".install.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # in another open file: another installer's
        with pytest.raises(RuntimeError, match="another process has been installing Hadoop"):
            hadoop.install(tmp_path)
    assert hadoop.ready(tmp_path) is None


# ---------------------------------------------------------------------- TeraValidate


def report(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "report"
    d.mkdir()
    (d / "_SUCCESS").write_bytes(b"")
    (d / "part-r-00000").write_text(text)
    return d


def test_a_report_of_one_checksum_line_means_sorted(tmp_path: Path) -> None:
    ok, lines = hadoop.read_report(report(tmp_path, "checksum\t1f9ffe645ec\n"))
    assert ok and lines == ["checksum\t1f9ffe645ec"]
    assert hadoop.checksum(lines) == "1f9ffe645ec"


def test_any_other_line_in_the_report_is_a_failure(tmp_path: Path) -> None:
    # What TeraValidate wrote for unsorted input (it exits 0 all the same).
    text = (
        "checksum\tc327a1c42c28\n"
        "error\tmisorder in part-m-00000 between c5 27 b1 85 8e 26 ed 5b 51 7b and "
        "94 4e 11 4c 40 1e 75 b7 fb d2\n"
        "error\tbad key partitioning:\n"
        "  file part-r-00000:end key ff ff 52 69 0a 35 0e d9 bc 1c\n"
        "  file part-r-00001:begin key 00 00 66 fc 34 d9 bc 9d 51 e1\n"
    )
    ok, lines = hadoop.read_report(report(tmp_path, text))
    assert not ok
    assert len(lines) == 5 and lines[1].startswith("error\tmisorder in part-m-00000")
    assert hadoop.checksum(lines) == "c327a1c42c28"  # still the records' sum


def test_an_empty_or_missing_report_is_a_failure(tmp_path: Path) -> None:
    ok, lines = hadoop.read_report(report(tmp_path, ""))
    assert not ok and "read no records" in lines[0]
    ok, lines = hadoop.read_report(tmp_path / "nowhere")
    assert not ok and lines == [f"no TeraValidate report in {tmp_path / 'nowhere'}"]
    assert hadoop.checksum(lines) is None


def test_a_cmr_outputs_listed_parts_are_linked_in_partition_order(tmp_path: Path) -> None:
    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"w{i % 97} x{i % 13}\n" for i in range(3000)))
    out = tmp_path / "out"
    result = cmr.run(WORDCOUNT, str(inp), str(out), reducers=12)
    leftover = out / "part-00000-oldjob"  # a replaced output's part, not yet deleted
    leftover.write_text("not this job's\n")

    parts = hadoop.cmr_parts(out)
    assert [p.name for p in parts] == [f"part-{i:05d}-{result.job_id}" for i in range(12)]
    links = hadoop.link_in_order(parts, tmp_path / "ordered")
    assert sorted(p.name for p in (tmp_path / "ordered").iterdir()) == [
        f"part-r-{i:05d}" for i in range(12)
    ]
    assert [link.resolve() for link in links] == [p.resolve() for p in parts]
    assert b"".join(link.read_bytes() for link in links) == b"".join(p.read_bytes() for p in parts)


def test_link_names_sort_as_numbers_past_five_digits() -> None:
    names = [hadoop.link_name(i, 100_001) for i in range(100_001)]
    assert names[0] == "part-r-000000" and names[-1] == "part-r-100000"
    assert names == sorted(names)
    assert hadoop.link_name(7, 12) == "part-r-00007"


def test_a_directory_that_is_no_complete_cmr_output_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "part-00000-j").write_bytes(b"x" * 100)
    ok, lines = hadoop.validate_cmr_output(tmp_path)  # refused before any JVM starts
    assert not ok and lines == [f"{tmp_path} has no _SUCCESS: not a complete cmr output"]
    manifest = Manifest("j", (Part("part-00000-j", 1, 100), Part("part-00001-j", 1, 100)), 1.0)
    (tmp_path / "_SUCCESS").write_bytes(manifest.to_bytes())
    ok, lines = hadoop.validate_cmr_output(tmp_path)
    assert not ok and lines == [f"{tmp_path}: 1 listed parts are missing, e.g. part-00001-j"]
    (tmp_path / "_SUCCESS").write_text("{}")
    ok, lines = hadoop.validate_cmr_output(tmp_path)
    assert not ok and "_SUCCESS: _SUCCESS is not a cmr manifest" in lines[0]


# ---------------------------------------------------------------------------- word totals


def test_hadoop_word_totals_and_the_tokenizer_they_are_checked_against(tmp_path: Path) -> None:
    out = tmp_path / "wc"
    out.mkdir()
    (out / "part-r-00000").write_bytes("a\t3\nzß\t2\n".encode())
    (out / "part-r-00001").write_bytes(b"b\x1fc\t5\n")
    (out / "_SUCCESS").write_bytes(b"")
    assert hadoop.word_total(out) == 10
    text = tmp_path / "t.txt"
    # StringTokenizer splits on space \t \n \r \f only: not on \v, \x1f, NBSP or U+3000;
    # an invalid byte stays inside its word.
    text.write_bytes("a\tb\r\nc\fd e\x0bf g\x1fh i\u00a0j k\u3000l ".encode() + b"\xffm\n\nn\xc3 o")
    assert vs_hadoop().tokenizer_total([text]) == 11


def _sum_to(n: int) -> int:
    return sum(range(n))


def _fails(what: str) -> None:
    raise ValueError(what)


def test_a_measured_row_runs_in_a_fresh_process_of_its_own() -> None:
    """cmr and the Counter are measured in a spawned process: the harness's own memory (its
    baselines) is neither in the figure nor in the way."""
    v = vs_hadoop()
    held = b"x" * 400_000_000  # this process's, resident: not the measured process's
    got, wall, cpu, peak = v.measured_apart(_sum_to, 10**6)
    assert got == sum(range(10**6))
    assert wall > 0 and cpu > 0
    assert 5 < peak.mb < 300, peak.mb
    assert len(held) == 400_000_000
    with pytest.raises(RuntimeError, match="ValueError: a bad corpus"):
        v.measured_apart(_fails, "a bad corpus")


def test_markdown_puts_each_figure_next_to_cmrs(tmp_path: Path) -> None:
    v = vs_hadoop()
    rows = [
        v.Row("t", "cmr embedded", seconds=2.0, cpu_s=3.0, peak_mb=100, maps=2, ok=True,
              check="same"),
        v.Row("t", "Hadoop 3.4.2 local", seconds=5.0, peak_mb=900, maps=200, ok=False,
              check="8 words"),
        v.Row("u", "cmr embedded", note="not available: examples/terasort.py missing"),
    ]  # fmt: skip
    table = v.markdown(rows).splitlines()
    assert len(table) == 5
    assert table[2] == "| t | cmr embedded | 2.00 | 1.00 | 3.0 | 100 | 2 | ok: same |  |"
    assert (
        table[3] == "| t | Hadoop 3.4.2 local | 5.00 | 2.50 | - | 900 | 200 | FAILED: 8 words |  |"
    )
    assert table[4] == (
        "| u | cmr embedded | - | - | - | - | - |  | not available: examples/terasort.py missing |"
    )


# ---------------------------------------------------------------------- with a real JVM

ACCESS_DEBUG = "-Dsun.reflect.debugModuleAccessChecks=true"  # prints refused reflection
QUICK_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")  # short runs start sooner


def hadoop_here() -> Any:
    """Hadoop installed (from Maven Central into the cache, once), or skip; in CI fail."""
    why = hadoop.problem() or (None if shutil.which("mvn") else "Maven is not installed")
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return hadoop.install()


def reversed_records(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    records = [data[i : i + hadoop.RECORD] for i in range(0, len(data), hadoop.RECORD)]
    dst.write_bytes(b"".join(reversed(records)))


@pytest.mark.slow
def test_hadoop_teravalidate_tells_sorted_from_unsorted(tmp_path: Path) -> None:
    env = hadoop.Env(tmp_path / "scratch", 2, 600, hadoop_here(), (ACCESS_DEBUG, *QUICK_JVM))

    gen = hadoop.teragen(1000, tmp_path / "gen", env)
    assert gen.failure is None and gen.splits == [1]
    assert (tmp_path / "gen" / "part-m-00000").stat().st_size == 1000 * hadoop.RECORD
    ran = hadoop.terasort(tmp_path / "gen", tmp_path / "sorted", env, reducers=2)
    assert ran.failure is None and ran.seconds is not None and ran.peak_mb > 50
    parts = sorted((tmp_path / "sorted").glob("part-r-*"))
    assert len(parts) == 2

    ok, lines = hadoop.teravalidate(tmp_path / "sorted", env)
    assert ok, lines
    want = hadoop.checksum(lines)

    # An unsorted copy of the sorted output: one part's records reversed.
    bad = tmp_path / "unsorted"
    bad.mkdir()
    shutil.copyfile(parts[0], bad / "part-r-00000")
    reversed_records(parts[1], bad / "part-r-00001")
    ok, lines = hadoop.teravalidate(bad, env)
    assert not ok and any(line.startswith("error\tmisorder in part-r-00001") for line in lines)
    assert hadoop.checksum(lines) == want  # the same records, in another order

    # The same records as a cmr output: parts named by cmr, a _SUCCESS manifest, and an
    # unsorted leftover the manifest does not list (which must not be read).
    out = tmp_path / "cmr-out"
    out.mkdir()
    listed = []
    for i, part in enumerate(parts):
        name = f"part-{i:05d}-job1"
        shutil.copyfile(part, out / name)
        listed.append(Part(name, part.stat().st_size // hadoop.RECORD, part.stat().st_size))
    (out / "_SUCCESS").write_bytes(Manifest("job1", tuple(listed), 1.0).to_bytes())
    reversed_records(parts[0], out / "part-00000-oldjob")
    ok, lines = hadoop.validate_cmr_output(out, env)
    assert ok and hadoop.checksum(lines) == want, lines
    # Its parts swapped: each is sorted, their concatenation is not.
    (out / "part-00000-job1").rename(out / "swap")
    (out / "part-00001-job1").rename(out / "part-00000-job1")
    (out / "swap").rename(out / "part-00001-job1")
    ok, lines = hadoop.validate_cmr_output(out, env)
    assert not ok and "error\tbad key partitioning:" in lines

    # Java 17 refused no reflective access in any run: no --add-opens is missing.
    for log in (tmp_path / "scratch").glob("*.log"):
        text = log.read_text(errors="replace")
        assert "InaccessibleObjectException" not in text, log
        assert "IllegalAccessException" not in text, log


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", ["queue", "blob"])
async def test_cmr_terasort_passes_hadoops_teravalidate(tmp_path: Path, shuffle: str) -> None:
    """examples/terasort.py over TeraGen's records (several map tasks, 3 reducers, keys
    sampled at submit), its shuffle through queues and through the blob store: TeraValidate
    finds its parts, in order, sorted, with the checksum of TeraGen's records (none lost or
    doubled)."""
    from cmr.api import run_on
    from cmr.backends.embedded import temporary_backend

    env = hadoop.Env(tmp_path / "scratch", 2, 600, hadoop_here(), QUICK_JVM)
    gen = hadoop.teragen(5000, tmp_path / "gen", env)
    assert gen.failure is None
    ok, lines = hadoop.teravalidate(tmp_path / "gen", env)  # TeraGen's own: unsorted
    assert not ok
    want = hadoop.checksum(lines)
    src = tmp_path / "in"
    src.mkdir()
    os.link(tmp_path / "gen" / "part-m-00000", src / "part-m-00000")
    async with temporary_backend() as be:
        result = await run_on(
            be, "examples/terasort.py", str(src), str(tmp_path / "out"), reducers=3,
            split_bytes=64 * 1024, shuffle=shuffle,
        )  # fmt: skip
    assert result.record["maps"] > 3 and result.record["records_out"] == 5000
    assert result.record.get("shuffle", "queue") == shuffle
    ok, lines = hadoop.validate_cmr_output(tmp_path / "out", env)
    assert ok, lines
    assert want is not None and hadoop.checksum(lines) == want
