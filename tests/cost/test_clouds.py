"""On the AWS stack and on Azurite a word count's cost is counted at the HTTP layer and
agrees, operation by operation, with the SDKs' own count of the HTTP requests sent
(botocore's before-send events; the Azure SDKs' request hook): the job's requests and
the fleet's own together, none lost, none twice. Then `cmr status` shows it."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmr import storeurls, usage
from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.cost import job_cost
from cmr.records import job_pk
from cmr.settings import AwsSettings, BackendName, Store
from tests.engine.corpus import edge_cases
from tests.engine.reference import word_count
from tests.engine.test_status_cli import cmr
from tests.stack import azure_stack_backend, stack_backend

WORDCOUNT = "examples/wordcount.py"


@pytest.fixture(params=["aws", "azure"])
async def cloud(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Backend, AwsSettings]]:
    if request.param == "aws":
        request.getfixturevalue("aws_stack")
        async with stack_backend("cost", "cmrc") as made:
            yield made
    else:
        request.getfixturevalue("azure_stack")
        async with azure_stack_backend("cmrc") as made:
            yield made


def _requests(ops: usage.Ops) -> Counter[str]:
    return Counter({op: int(n) for op, (n, _) in ops.items()})


async def test_word_count_cost_matches_the_http_requests(
    cloud: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = cloud
    # Workers in this process, so that every HTTP request of the job is counted here.
    here = dataclasses.replace(
        be, capabilities=dataclasses.replace(be.capabilities, in_process=True)
    )
    data = edge_cases(tmp_path / "in")
    output = storeurls.root_prefix(be.scratch) + "wc/out/"
    calls_before = be.calls()
    fleet_before = _requests(usage.LEDGER.totals(None))
    result = await run_on(
        here, WORDCOUNT, str(data), output, reducers=2, workers=2, aws=settings, split_bytes=8192
    )
    calls = be.calls() - calls_before
    fleet = _requests(usage.LEDGER.totals(None)) - fleet_before
    cost = await job_cost(be, result.job_id)
    job = Counter({op: c.requests for op, c in cost.ops.items()})
    assert job + fleet == calls, ((job + fleet) - calls, calls - (job + fleet))
    services = {op.partition(".")[0] for op in job}
    aws = be.name == "aws"
    assert services == ({"sqs", "s3", "dynamodb"} if aws else {"queue", "blob", "table"})
    assert cost.total_usd > 0 and cost.worker_seconds > 0 and not cost.refused
    if be.name == "aws":
        # DynamoDB's units from item sizes: at least one per request, two per transaction.
        txs = cost.ops["dynamodb.TransactWriteItems"]
        assert txs.units >= 2 * txs.requests
        # A query reads at least half a unit (an eventually consistent one), at least one
        # when strongly consistent, as commit and claim reads are.
        assert job["dynamodb.Query"] / 2 <= cost.ops["dynamodb.Query"].units
    rows = await be.table.query(job_pk(result.job_id), prefix=usage.PREFIX)
    assert len(rows) == 1  # one process worked for it: this one
    assert sum(word_count(data).values()) > 0


async def test_one_flush_writes_a_row_that_counts_its_own_writes(
    cloud: tuple[Backend, AwsSettings],
) -> None:
    """A process's first flush of a job (a client's, at the end of its run): the row holds
    the totals, its own writes included. On Azure a row's first write is an insert and the
    next an update: a write predicted from the first alone was off by one operation."""
    be, _ = cloud
    job = "20990101-000000-" + secrets.token_hex(8)
    with usage.working_for(job):
        usage.charge("sqs.ReceiveMessage", 1, 1.0)
    assert await usage.flush(be, [job]) == 1
    (item,) = await be.table.query(job_pk(job), prefix=usage.PREFIX)
    try:
        row = usage.decode("p", item["usage"])
        assert row.ops == usage.LEDGER.totals(job)
        assert sum(n for op, (n, _) in row.ops.items() if op != "sqs.ReceiveMessage") >= 2
    finally:
        await be.table.delete(job_pk(job), str(item["sk"]))


@pytest.mark.slow
async def test_status_shows_the_cost_of_a_job_run_by_worker_processes(
    cloud: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = cloud
    data = edge_cases(tmp_path / "in")
    result = await run_on(
        be, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2, workers=2, aws=settings
    )
    store = Store(BackendName(be.name), settings).url
    doc = json.loads(cmr("status", result.job_id, "--json", "--store", store).stdout)
    c = doc["cost"]
    assert c["job"] == result.job_id and c["total_usd"] > 0 and c["worker_seconds"] > 0
    assert c["processes"] == 3  # the client and its two workers, one row each
    assert c["prices"]["date"]
    ops = {s: set(v["operations"]) for s, v in c["services"].items()}
    queue = "sqs" if be.name == "aws" else "queue"
    assert ops[queue]
    human = cmr("status", result.job_id, "--store", store).stdout
    assert "cost: $" in human and "workers: $" in human
    listed = cmr("status", "--store", store).stdout
    assert "cost" in listed and result.job_id[:8] in listed
