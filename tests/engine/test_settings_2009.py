"""The 2009-style shuffle (7 KB plain messages, no combiner): same output, really small,
really plain, really uncombined; and the decoder still refuses what is not ours."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

import msgpack
import pytest

from cmr import wire
from cmr.api import run_on
from cmr.backends.base import Backend, Item
from cmr.backends.embedded import EmbeddedQueues, EmbeddedTable, embedded_backend
from cmr.errors import JobFailed, UsageError, WireError
from cmr.settings import WorkerSettings

from .corpus import edge_cases
from .reference import counts_from_parts, word_count

WORDCOUNT = "examples/wordcount.py"
KB7 = 7 * 1024
STYLE_2009 = {"message_bytes": KB7, "compress": False, "use_combiner": False}

# map emits (word, 1) per word; combine must never run when the combiner is off.
JOB_NO_COMBINE = """
import cmr

class Strict(cmr.Job):
    reducers = 3

    def map(self, key, line):
        for word in line.split():
            yield word, 1

    def combine(self, word, counts):
        raise RuntimeError("combine ran")

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


class RecordingQueues(EmbeddedQueues):
    """The embedded queues, keeping every body sent to a partition queue."""

    def __init__(self) -> None:
        super().__init__()
        self.shuffle: list[bytes] = []

    async def send(self, name: str, bodies: Sequence[bytes]) -> None:
        if re.search(r"-p\d{5}$", name):  # a partition queue (records.queue_names)
            self.shuffle.extend(bytes(b) for b in bodies)
        await super().send(name, bodies)


def recording_backend(scratch: Path) -> tuple[Backend, RecordingQueues]:
    queues = RecordingQueues()
    scratch.mkdir(parents=True, exist_ok=True)
    return embedded_backend(scratch, queues=queues), queues


def corpus(root: Path) -> Path:
    """The edge cases plus ~250 KB of Zipf-ish text: enough for many 7 KB batches."""
    edge_cases(root)
    rng = random.Random(11)
    vocab = [f"w{i}" for i in range(3000)] + ["é", "日本", "x" * 40]
    weights = [1 / (1 + i) for i in range(len(vocab))]
    lines = (" ".join(rng.choices(vocab, weights, k=rng.randint(1, 15))) for _ in range(10_000))
    (root / "bulk.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def settings(**kw: object) -> WorkerSettings:
    return WorkerSettings(poll_s=0.1, processes=2, **kw)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_2009_style_output_equals_default(tmp_path: Path) -> None:
    data = corpus(tmp_path / "in")
    outs, sent = {}, {}
    for name, kw in (("default", {}), ("2009", STYLE_2009)):
        be, queues = recording_backend(tmp_path / f"scratch-{name}")
        out = tmp_path / f"out-{name}"
        result = await run_on(
            be,
            WORDCOUNT,
            str(data),
            str(out),
            reducers=3,
            split_bytes=64 * 1024,
            worker_settings=settings(**kw),
        )
        outs[name] = [Path(part).read_bytes() for part in result.parts]
        sent[name] = queues.shuffle
    assert outs["2009"] == outs["default"]
    assert counts_from_parts(tmp_path / "out-2009", 3) == word_count(data)
    # The default stays compressed; the 2009 style is plain and small.
    assert sent["default"] and all(
        b[len(wire.MAGIC) :].startswith(wire.ZSTD_FRAME) for b in sent["default"]
    )
    assert max(map(len, sent["2009"])) <= KB7
    assert not any(b[len(wire.MAGIC) :].startswith(wire.ZSTD_FRAME) for b in sent["2009"])


@pytest.mark.slow
async def test_2009_style_batches_are_small_plain_and_uncombined(tmp_path: Path) -> None:
    data = corpus(tmp_path / "in")
    words = sum(word_count(data).values())
    job = tmp_path / "strict.py"
    job.write_text(JOB_NO_COMBINE)

    be, queues = recording_backend(tmp_path / "scratch")
    await run_on(
        be,
        str(job),
        str(data),
        str(tmp_path / "out"),
        split_bytes=64 * 1024,
        worker_settings=settings(**STYLE_2009),
    )
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)

    bodies = queues.shuffle
    assert len(bodies) > 50
    sizes = [len(b) for b in bodies]
    assert max(sizes) <= KB7
    # Packed to the byte, not merely under the limit: most bodies are nearly full.
    assert sorted(sizes)[len(sizes) // 2] > 0.95 * KB7
    records = 0
    for body in bodies:
        rest = body[len(wire.MAGIC) :]
        assert body.startswith(wire.MAGIC) and not rest.startswith(wire.ZSTD_FRAME)
        doc = msgpack.unpackb(rest, raw=False)  # plain msgpack, nothing to decompress
        assert doc["k"] == "batch"
        batch = wire.decode(body)
        assert isinstance(batch, wire.Batch) and not batch.spilled
        assert sum(1 for _ in wire.iter_pairs(batch.pairs)) == batch.records
        records += batch.records
    # No combiner in map: one pair per word occurrence reached the queues.
    assert records == words


async def test_default_settings_do_run_the_combiner(tmp_path: Path) -> None:
    """The control for the test above: the same job fails when combining is on."""
    data = corpus(tmp_path / "in")
    job = tmp_path / "strict.py"
    job.write_text(JOB_NO_COMBINE)
    be, _ = recording_backend(tmp_path / "scratch")
    with pytest.raises(JobFailed, match="combine ran"):
        await run_on(
            be,
            str(job),
            str(data),
            str(tmp_path / "out"),
            split_bytes=64 * 1024,
            max_task_failures=1,
            worker_settings=settings(),
        )


def batch_doc(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "k": "batch",
        "job": "20260101-000000-abcdef",
        "task": 1,
        "att": "a1b2c3",
        "p": 0,
        "seq": 0,
        "n": 1,
        "pairs": msgpack.packb(("w", 1)),
        "spill": "",
    }
    doc.update(changes)
    return doc


def test_plain_and_compressed_bodies_decode_alike() -> None:
    msg = wire.decode(wire.MAGIC + wire.compress(wire.pack(batch_doc())))  # the old form
    assert wire.decode(wire.encode(msg, compress=False)) == msg
    assert wire.decode(wire.encode(msg)) == msg
    assert wire.encode(msg, compress=False) == wire.MAGIC + wire.pack(batch_doc())


@pytest.mark.parametrize(
    "rest",
    [
        wire.pack(batch_doc(n=-1)),  # a negative count
        wire.pack(batch_doc(pairs="text")),  # pairs must be bytes
        wire.pack({k: v for k, v in batch_doc().items() if k != "att"}),  # a field missing
        wire.pack(batch_doc(k="exec")),  # an unknown kind
        wire.pack(batch_doc())[:-3],  # truncated
        wire.pack(batch_doc()) + b"\x00",  # trailing bytes after the map
        wire.pack(batch_doc()) + wire.pack(batch_doc()),  # two maps
        wire.pack([1, 2, 3]),  # not a map
        b"\x80",  # an empty map: no kind
        b"\xdf\xff\xff\xff\xff",  # a map32 header claiming 4 billion entries, no data
        b"",  # nothing after the magic
        b"\xc1garbage",  # msgpack's never-used byte
    ],
)
def test_decoder_rejects_bad_plain_bodies(rest: bytes) -> None:
    with pytest.raises(WireError):
        wire.decode(wire.MAGIC + rest)


def test_decoder_bounds_plain_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    body = wire.encode(wire.decode(wire.MAGIC + wire.pack(batch_doc())), compress=False)
    monkeypatch.setattr(wire, "MAX_DECODED", len(body) - len(wire.MAGIC) - 1)
    with pytest.raises(WireError, match="limit"):
        wire.decode(body)


def test_message_bytes_has_a_floor() -> None:
    with pytest.raises(UsageError):
        WorkerSettings(message_bytes=100)
    assert WorkerSettings(message_bytes=KB7).shuffle_bytes(200_000) == KB7
    assert WorkerSettings().shuffle_bytes(200_000) == 200_000
    assert WorkerSettings(message_bytes=10**9).shuffle_bytes(200_000) == 200_000


JOB_SLEEPY = """
import time
from collections import Counter

import cmr

class Sleepy(cmr.Job):
    reducers = 2

    def map_chunk(self, source, data):
        time.sleep(2.0)
        return Counter(data.decode("utf-8", "replace").split()).items()

    def reduce(self, word, counts):
        yield word, sum(counts)
"""


class CountingTable(EmbeddedTable):
    """The embedded table, counting the reducers' polls of the map commit records."""

    def __init__(self) -> None:
        super().__init__()
        self.commit_polls = 0

    async def query(
        self, pk: str, *, prefix: str = "", start: str = "", consistent: bool = True
    ) -> list[Item]:
        self.commit_polls += prefix == "map#"
        return await super().query(pk, prefix=prefix, start=start, consistent=consistent)


async def test_reducers_waiting_for_maps_poll_sparingly(tmp_path: Path) -> None:
    """While map tasks run for 2 s, a reducer long-polls its queue and asks the table only
    on a backed-off schedule (idle_wait_s = 5 x poll_s = 0.5 s here), not after every empty
    receive (every poll_s = 0.1 s: 20 polls per reducer)."""
    src = tmp_path / "in.txt"
    src.write_text("a b c\n" * 2000)
    job = tmp_path / "sleepy.py"
    job.write_text(JOB_SLEEPY)
    queues, table = RecordingQueues(), CountingTable()
    (tmp_path / "scratch").mkdir()
    be = embedded_backend(tmp_path / "scratch", queues=queues, table=table)
    result = await run_on(
        be,
        str(job),
        str(src),
        str(tmp_path / "out"),
        split_bytes=src.stat().st_size // 2 + 1,  # two map tasks, both running at once
        worker_settings=settings(),
    )
    assert result.record["maps"] == 2
    assert counts_from_parts(tmp_path / "out", 2) == {"a": 2000, "b": 2000, "c": 2000}
    # Per reducer: one table poll per idle_wait_s while it waits, a few more as commits land
    # (at one per poll_s, as before, two reducers would make 40 in 2 s, 4 times this bound).
    bound = 2 * (result.seconds / 0.5 + 4)
    assert table.commit_polls <= bound
    # Receives: the two reducers' long polls, the task receives and a few empty answers.
    assert result.calls["sqs.ReceiveMessage"] <= bound + 12
