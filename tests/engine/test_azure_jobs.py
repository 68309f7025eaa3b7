"""Whole jobs on the azure backend against Azurite, run as a user runs them: real `cmr
worker` processes, `cmr run --store azure://...`, nobody waiting on a detached job. After
each test the ``azure`` fixture checks that nothing was left behind (queues, records,
scratch blobs, live output claims)."""

from __future__ import annotations

import json
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cmr import storeurls
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.publish import Manifest
from cmr.settings import AwsSettings, BackendName, Store
from cmr.testing import read_output, sequential
from tests.engine.test_aws_lifecycle import cmr as popen
from tests.engine.test_status_cli import cmr
from tests.stack import azure_stack_backend

from .corpus import edge_cases
from .reference import counts_from_parts, word_count

pytestmark = [pytest.mark.usefixtures("azure_stack"), pytest.mark.slow]  # real processes

TOPWORDS = "examples/topwords.py"
TERASORT = "examples/terasort.py"
RECORD = 100


@pytest.fixture
async def azure(azure_stack: str) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    async with azure_stack_backend("cmrz") as made:
        yield made


def in_container(be: Backend, key: str) -> str:
    """The URL of ``key`` in the store's container (azure://ACCOUNT/CONTAINER/KEY)."""
    return storeurls.root_prefix(be.scratch) + key


def store_of(s: AwsSettings) -> str:
    return Store(BackendName.azure, s).url


async def test_wordcount_with_three_worker_processes(
    azure: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = azure
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        be,
        "examples/wordcount.py",
        str(data),
        str(tmp_path / "out"),
        reducers=3,
        workers=3,
        visibility_timeout=10,
        aws=settings,
        split_bytes=2048,
    )
    assert counts_from_parts(tmp_path / "out", 3) == word_count(data)
    assert result.record["maps"] > 3
    assert result.calls["queue.PutMessage"] > 0
    assert result.calls["table.InsertEntity"] > 0  # the job's records are Azure's entities


async def test_a_pipeline_as_a_user_runs_it(
    azure: tuple[Backend, AwsSettings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cmr run` of a two-step job with --store azure://..., then `cmr status`: both steps
    ran, the hand-over held, the output is exact."""
    _, s = azure
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CMR_STORE", raising=False)
    data = edge_cases(tmp_path / "in")
    store = store_of(s)
    run = cmr(
        "run", TOPWORDS, "--input", str(data), "--output", str(tmp_path / "out"),
        "--store", store, "--param", "top=5", "--workers", "3",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    job = run.stderr.split("submitted job ", 1)[1].split()[0]
    assert read_output(tmp_path / "out", 1) == sequential(TOPWORDS, data, None, {"top": "5"})
    doc = json.loads(cmr("status", job, "--json", "--store", store).stdout)
    assert [(s["step"], s["state"]) for s in doc["steps"]] == [(1, "succeeded"), (2, "succeeded")]


async def test_terasort_with_three_worker_processes(
    azure: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """A total-order sort of TeraGen-shaped records from Azure blobs into Azure blobs, the
    shuffle through the blob store: every record once, keys in order across the parts."""
    be, s = azure
    rng = random.Random(29)
    keys = [rng.randbytes(10) for _ in range(4_000)]
    recs = [rng.choice(keys) + b"%090d" % i for i in range(6_000)]
    root = in_container(be, "tera/in/")
    await be.blobs.put(root + "a", b"".join(recs[:3_500]))
    await be.blobs.put(root + "b", b"".join(recs[3_500:]))
    output = in_container(be, "tera/out/")
    result = await run_on(
        be,
        TERASORT,
        root.rstrip("/"),
        output,
        reducers=3,
        workers=3,
        visibility_timeout=10,
        aws=s,
        split_bytes=500 * RECORD,
        shuffle="blob",
    )
    assert result.record["shuffle"] == "blob"
    manifest = Manifest.from_bytes(await be.blobs.get(output + "_SUCCESS"))
    data = b"".join([await be.blobs.get(output + p.name) for p in manifest.parts])
    got = [data[i : i + RECORD] for i in range(0, len(data), RECORD)]
    assert sorted(got) == sorted(recs)
    assert [r[:10] for r in got] == sorted(r[:10] for r in recs)
    await be.blobs.delete_prefix(in_container(be, "tera/"))


def status_json(store: str, job_id: str) -> dict[str, Any]:
    done = cmr("status", job_id, "--json", "--store", store)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


async def test_detached_job_survives_a_worker_killed_while_publishing(
    azure: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    """Submit with --detach and walk away; a worker is SIGKILLed in the middle of
    publishing; the other worker, alone, finishes the job: exact output, nothing left (the
    fixture checks). Nobody waits on the job: the test only submits and starts workers."""
    be, s = azure
    store = store_of(s)
    data = edge_cases(tmp_path / "in")
    output = in_container(be, "out/wc/")
    submitted = cmr(
        "run", "examples/wordcount.py", "--store", store, "--input", str(data),
        "--output", output, "--reducers", "3", "--visibility-timeout", "5", "--detach",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    assert status_json(store, job_id)["state"] == "running"
    worker = ["worker", "--store", store, "--job", job_id, "--processes", "1"]
    doomed = popen(*worker, env={"CMR_STOP_AT": "publish.copied"})
    procs = [doomed]
    try:
        assert doomed.stderr is not None
        while "stopping at publish.copied" not in (line := doomed.stderr.readline()):
            assert line, "the worker ended before it published"
        state = status_json(store, job_id)
        assert state["state"] == "running"
        assert "publishing" in state
        survivor = popen(*worker)
        procs.append(survivor)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        _, err = survivor.communicate(timeout=120)  # a --job worker stops once cleaned up
        assert survivor.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    done = cmr("wait", job_id, "--store", store)
    assert done.returncode == 0, done.stderr
    doc = status_json(store, job_id)
    assert doc["state"] == "succeeded"
    manifest = Manifest.from_bytes(await be.blobs.get(output + "_SUCCESS"))
    assert manifest.job == job_id
    counts: dict[str, int] = {}
    for part in manifest.parts:
        for line in (await be.blobs.get(output + part.name)).decode().splitlines():
            word, _, n = line.rpartition("\t")
            counts[word] = int(n)
    assert counts == word_count(data)
    listed = {b.url for b in await be.blobs.list(output)}
    assert listed == {output + "_SUCCESS", *(output + p.name for p in manifest.parts)}
    await be.blobs.delete_prefix(output)
