"""The total-order sort (examples/terasort.py: fixed 100-byte records in, raw records out,
keys sampled at submit) with a worker crashing dead at each named step of the protocol.
Nobody waits on the job and nobody replaces the crashed worker: the other worker must end it
with exactly the input's records, sorted across its parts in partition order."""

from __future__ import annotations

import json
import random
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest

from cmr.backends.faults import FaultPlan
from cmr.runtime import STEPS, Runtime, WorkerCrashed
from cmr.testing import chaos_run
from cmr.virtualtime import in_virtual_time

TERASORT = "examples/terasort.py"
RECORD = 100
REDUCERS = 3
# Points where an attempt's work is lost or duplicated (the generic protocol points are all
# in tests/chaos/test_steps.py): the range partitioner must route every record the same
# way whichever attempt maps it, and the parts still concatenate in order.
CRASH_AT = (
    "map.partly_sent",
    "map.committed",
    "reduce.draining",
    "reduce.output_written",
    "reduce.committed",
    "publish.copied",
)
assert set(CRASH_AT) <= set(STEPS)


class Once:
    def __init__(self, step: str) -> None:
        self.step = step
        self.context: dict[str, Any] | None = None

    async def __call__(self, rt: Runtime, step: str, context: dict[str, Any]) -> None:
        if step == self.step and self.context is None:
            self.context = context
            raise WorkerCrashed(step)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """3,000 TeraGen-shaped records in two files; some keys repeat (kept, each record)."""
    rng = random.Random(14)
    keys = [rng.randbytes(10) for _ in range(2_500)]
    recs = [rng.choice(keys) + b"%090d" % i for i in range(3_000)]
    src = tmp_path_factory.mktemp("tera") / "in"
    src.mkdir()
    (src / "a").write_bytes(b"".join(recs[:1_700]))
    (src / "b").write_bytes(b"".join(recs[1_700:]))
    return src, recs


def sorted_output(out: Path) -> list[bytes]:
    manifest = json.loads((out / "_SUCCESS").read_bytes())
    data = b"".join((out / p["name"]).read_bytes() for p in manifest["parts"])
    return [data[i : i + RECORD] for i in range(0, len(data), RECORD)]


@pytest.mark.parametrize("step", CRASH_AT)
@in_virtual_time
async def test_total_order_sort_outlives_a_crash_at_any_step(
    step: str, records: tuple[Path, list[bytes]], pool: Executor, tmp_path: Path
) -> None:
    src, recs = records
    crash = Once(step)
    result = await chaos_run(
        TERASORT,
        src,
        tmp_path / "out",
        seed=2,
        pool=pool,
        plan=FaultPlan(seed=2),
        hooks=[crash, crash],
        workers=2,
        reducers=REDUCERS,
        visibility_s=2,
        split_bytes=40 * RECORD,
        clientless=True,
    )
    assert crash.context is not None, f"no worker reached {step}"
    assert result.record["state"] == "succeeded"
    got = sorted_output(tmp_path / "out")
    # Exactly the input's records, keys in order across the parts (equal keys: any order).
    assert sorted(got) == sorted(recs)
    assert [r[:10] for r in got] == sorted(r[:10] for r in recs)
    assert result.leftovers == []
