"""On the embedded backend a job's cost agrees with the exact call counts (the Counting
middleware's), operation by operation: the client's and the workers' requests together,
with the fleet's own (no job) apart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cmr import usage
from cmr.api import open_backend, run_on
from cmr.cost import fleet_overhead, job_cost
from cmr.records import job_pk
from cmr.settings import AwsSettings

from ..engine.corpus import edge_cases

WORDCOUNT = "examples/wordcount.py"


def _requests(ops: usage.Ops) -> Counter[str]:
    return Counter({op: int(n) for op, (n, _) in ops.items()})


async def test_job_cost_equals_the_exact_call_counts(tmp_path: Path) -> None:
    data = edge_cases(tmp_path / "in")
    async with open_backend("embedded", AwsSettings()) as be:
        calls_before = be.calls()
        fleet_before = _requests(usage.LEDGER.totals(None))
        out = str(tmp_path / "out")
        result = await run_on(be, WORDCOUNT, str(data), out, reducers=3, workers=2)
        calls = be.calls() - calls_before
        fleet = _requests(usage.LEDGER.totals(None)) - fleet_before
        cost = await job_cost(be, result.job_id)
        job = Counter({op: c.requests for op, c in cost.ops.items()})
        # Every request the backend made: the job's, or the fleet's own; none lost, none twice.
        assert job + fleet == calls, (job + fleet) - calls or calls - (job + fleet)
        # The job's own work is in its cost, not the fleet's.
        for op in ("sqs.SendMessageBatch", "sqs.ReceiveMessage", "dynamodb.TransactWriteItems"):
            assert job[op] > 0, op
        assert job["dynamodb.PutItem"] >= 1  # its usage row's writes, counted in it
        assert cost.worker_seconds > 0
        assert cost.total_usd > 0
        assert cost.processes == 1 and not cost.refused
        # Units: a send of small batches is one billed request each; DynamoDB's units are
        # at least one per request.
        sends, txs = cost.ops["sqs.SendMessageBatch"], cost.ops["dynamodb.TransactWriteItems"]
        assert sends.units == sends.requests
        assert txs.units >= 2 * txs.requests
        # Cleaned up, and the usage row kept beside the job record.
        rows = await be.table.query(job_pk(result.job_id))
        assert {str(r["sk"]).split("#")[0] for r in rows} <= {"job", "timeline", "usage"}
        assert any(str(r["sk"]).startswith(usage.PREFIX) for r in rows)
        # The fleet's own requests are in its worker rows (as of their last beat), not in
        # the job: never more than this process made for no job.
        overhead = await fleet_overhead(be)
        assert overhead.processes == 1 and not overhead.refused
        every = _requests(usage.LEDGER.totals(None))
        assert all(c.requests <= every[op] for op, c in overhead.ops.items())
