"""Seeded chaos: every fault at random rates, crashes and pauses at every protocol step.

Half the seeds shuffle through the blob store, half through queues (cmr.testing.chaos_shuffle).
Each run is compared byte for byte with a sequential run of the same job, and must leave
nothing behind. Seeds below CLIENTLESS_FROM run with a watching client and a supervisor that
replaces crashed workers; the others with nobody: the job is submitted and left to its three
workers, of which up to two crash. A failure names its seed and fault plan; rerun exactly
that seed with:

    CMR_CHAOS_SEEDS=17,1042 .venv/bin/python -m pytest tests/chaos/test_chaos_embedded.py
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from pathlib import Path

import pytest

from cmr.backends.faults import FaultPlan
from cmr.testing import (
    chaos_run,
    chaos_shuffle,
    diff_outputs,
    read_output,
    sequential,
    timeline_problems,
)
from cmr.virtualtime import in_virtual_time
from tests.engine.corpus import edge_cases

JOBS = ("examples/wordcount.py", "examples/invertedindex.py")
# The suite's share of the campaign (benchmarks/chaos.py runs thousands): as many runs with
# nobody waiting as with a watching client.
RUNS = 100  # with a watching client: seeds 0..99
CLIENTLESS_FROM, CLIENTLESS_RUNS = 1000, 100  # with nobody waiting: seeds 1000..1099
BATCH = 25  # runs at once (on the virtual clock their lease waits cost nothing; what is
# left is CPU, so batches of 25 spread over the suite's processes)
REDUCERS = 3


def _seeds() -> list[list[int]]:
    chosen = os.environ.get("CMR_CHAOS_SEEDS")
    if chosen:
        return [[int(s) for s in chosen.split(",")]]
    end = CLIENTLESS_FROM + CLIENTLESS_RUNS
    return [list(range(b, min(RUNS, b + BATCH))) for b in range(0, RUNS, BATCH)] + [
        list(range(b, min(end, b + BATCH))) for b in range(CLIENTLESS_FROM, end, BATCH)
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    data = edge_cases(tmp_path_factory.mktemp("chaos") / "in")
    return data, {job: sequential(job, data, REDUCERS) for job in JOBS}


@pytest.mark.parametrize(
    "seeds",
    # The everyday subset (-m "not slow") runs the first batch of each kind (with a watching
    # client, and with nobody waiting); the full suite every one.
    [
        pytest.param(s, marks=() if s[0] in (0, CLIENTLESS_FROM) else pytest.mark.slow)
        for s in _seeds()
    ],
    ids=lambda s: f"{'clientless-' if s[0] >= CLIENTLESS_FROM else ''}seeds{s[0]}-{s[-1]}",
)
@in_virtual_time
async def test_chaos_runs_match_a_sequential_run(
    seeds: list[int],
    corpus: tuple[Path, dict[str, list[str]]],
    pool: Executor,
    tmp_path: Path,
) -> None:
    data, expected = corpus

    async def one(seed: int) -> str | None:
        job = JOBS[seed % len(JOBS)]
        out = tmp_path / f"out-{seed}"
        repro = (
            f"seed {seed} ({job}, {chaos_shuffle(seed)} shuffle, "
            f"{FaultPlan.random(seed).describe()}); rerun: "
            f"CMR_CHAOS_SEEDS={seed} pytest tests/chaos/test_chaos_embedded.py"
        )
        try:
            result = await chaos_run(
                job,
                data,
                out,
                seed=seed,
                pool=pool,
                reducers=REDUCERS,
                clientless=seed >= CLIENTLESS_FROM,
                shuffle=chaos_shuffle(seed),
            )
        except Exception as exc:  # report every failing seed, not just the first
            return f"{repro}: {type(exc).__name__}: {exc}"
        problems = diff_outputs(expected[job], read_output(out, REDUCERS))
        if problems:
            return f"{repro}: " + "; ".join(problems)
        if result.record.get("state") != "succeeded":
            return f"{repro}: job ended {result.record.get('state')}: {result.record.get('error')}"
        if result.leftovers:
            return f"{repro}: left behind {result.leftovers}"
        timeline = timeline_problems(result)
        if timeline:
            return f"{repro}: timeline: " + "; ".join(timeline[:5])
        return None

    failures = [f for f in await asyncio.gather(*(one(s) for s in seeds)) if f]
    assert not failures, "\n".join(failures)
