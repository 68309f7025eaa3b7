"""The cost of a job: its usage rows (cmr.usage), summed over the processes that worked for
it, priced (cmr.prices). What `cmr status` shows and what the dashboard imports:

    cost = await job_cost(backend, job_id)      # JobCost
    cost.to_json()                              # {"total_usd": ..., "services": {...}, ...}

Rows are strangers' data: each is validated and bounded (cmr.usage.decode); a row that is
not what a process writes is refused, named in ``refused`` (a bounded message each), and
never priced. At most MAX_ROWS rows of a job are read.

What is not counted: storage (GB-months of S3, DynamoDB, Azure), data transfer, the
requests of a process killed since its last row write, free tiers (docs/cost.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cmr import billing, usage
from cmr.errors import WireError
from cmr.prices import Prices, load

MAX_ROWS = 10_000  # usage rows of one job read: one per process that worked for it
MAX_REFUSED = 20  # refused rows named (the rest are counted)


@dataclass
class OpCost:
    requests: int = 0
    units: float = 0.0
    usd: float = 0.0
    price: str | None = None  # the price table's key (None: free)


@dataclass
class JobCost:
    job_id: str
    ops: dict[str, OpCost] = field(default_factory=dict)  # "sqs.SendMessageBatch": ...
    worker_seconds: float = 0.0
    workers_usd: float = 0.0
    instances: dict[str, float] = field(default_factory=dict)  # type priced: seconds
    processes: int = 0  # usage rows priced
    refused: list[str] = field(default_factory=list)
    prices_date: str = ""
    price_files: list[str] = field(default_factory=list)

    @property
    def requests_usd(self) -> float:
        return sum(o.usd for o in self.ops.values())

    @property
    def total_usd(self) -> float:
        return self.requests_usd + self.workers_usd

    @property
    def requests(self) -> int:
        return sum(o.requests for o in self.ops.values())

    def services(self) -> dict[str, dict[str, OpCost]]:
        """The operations by service ("sqs", "s3", "dynamodb", "blob", "queue", "table")."""
        out: dict[str, dict[str, OpCost]] = {}
        for op, c in sorted(self.ops.items()):
            out.setdefault(op.partition(".")[0], {})[op] = c
        return out

    def to_json(self) -> dict[str, Any]:
        services = {}
        for service, ops in self.services().items():
            services[service] = {
                "name": billing.SERVICES.get(service, service),
                "requests": sum(c.requests for c in ops.values()),
                "usd": sum(c.usd for c in ops.values()),
                "operations": {
                    op.partition(".")[2]: {
                        "requests": c.requests,
                        "units": c.units,
                        "usd": c.usd,
                        "price": c.price,
                    }
                    for op, c in ops.items()
                },
            }
        return {
            "job": self.job_id,
            "total_usd": self.total_usd,
            "requests_usd": self.requests_usd,
            "requests": self.requests,
            "worker_seconds": self.worker_seconds,
            "workers_usd": self.workers_usd,
            "instances": self.instances,
            "services": services,
            "processes": self.processes,
            "refused": self.refused,
            "prices": {"date": self.prices_date, "files": self.price_files},
        }

    def add(self, other: JobCost) -> None:
        """Another job's cost into this one (a pipeline's steps)."""
        for op, c in other.ops.items():
            mine = self.ops.setdefault(op, OpCost(price=c.price))
            mine.requests += c.requests
            mine.units += c.units
            mine.usd += c.usd
        self.worker_seconds += other.worker_seconds
        self.workers_usd += other.workers_usd
        for name, s in other.instances.items():
            self.instances[name] = self.instances.get(name, 0.0) + s
        self.processes += other.processes
        self.refused += other.refused[: MAX_REFUSED - len(self.refused)]


def price(job_id: str, rows: Iterable[usage.Row], prices: Prices) -> JobCost:
    """The cost of these usage rows of a job."""
    cost = JobCost(job_id, prices_date=prices.date, price_files=list(prices.files))
    for row in rows:
        cost.processes += 1
        for op, (n, units) in row.ops.items():
            c = cost.ops.get(op)
            if c is None:
                c = cost.ops[op] = OpCost(price=billing.price_key(op))
            c.requests += int(n)
            c.units += units
        name, hourly = prices.hour_of(row.instance)
        cost.worker_seconds += row.worker_s
        cost.workers_usd += row.worker_s * hourly / 3600
        cost.instances[name] = cost.instances.get(name, 0.0) + row.worker_s
    for c in cost.ops.values():
        p = prices.unit_price(c.price)
        c.usd = p.of(c.units) if p is not None else 0.0
    return cost


def read_rows(items: Iterable[dict[str, Any]]) -> tuple[list[usage.Row], list[str]]:
    """Usage rows from a job's items: (the valid ones, why the others were refused)."""
    rows: list[usage.Row] = []
    refused: list[str] = []
    skipped = 0
    for n, item in enumerate(items):
        if n >= MAX_ROWS:
            skipped += 1
            continue
        sk = str(item.get("sk", ""))[:120]
        try:
            rows.append(usage.decode(sk.removeprefix(usage.PREFIX), item.get("usage")))
        except WireError as exc:
            if len(refused) < MAX_REFUSED:
                refused.append(f"{sk}: {str(exc)[:160]}")
    if skipped:
        refused.append(f"{skipped} usage rows past {MAX_ROWS} not read")
    return rows, refused


async def job_cost(backend: Any, job_id: str, prices: Prices | None = None) -> JobCost:
    """The job's cost so far, from its usage rows (one query), priced at ``prices`` (the
    shipped table, with CMR_PRICES over it, by default)."""
    from cmr.records import job_pk

    prices = prices if prices is not None else load()
    items = await backend.table.query(job_pk(job_id), prefix=usage.PREFIX)
    rows, refused = read_rows(items)
    cost = price(job_id, rows, prices)
    cost.refused = refused
    return cost


async def fleet_overhead(backend: Any, prices: Prices | None = None) -> JobCost:
    """The fleet's own requests and idle seconds, as its workers' rows last said them (one
    per process: in-process workers share theirs)."""
    from cmr.records import WORKERS_PK

    prices = prices if prices is not None else load()
    items = await backend.table.query(WORKERS_PK)
    by_process = {str(i.get("usage_process", i.get("sk"))): i for i in items if "usage" in i}
    rows, refused = read_rows(
        {"sk": usage.PREFIX + p, "usage": i["usage"]} for p, i in by_process.items()
    )
    cost = price("", rows, prices)
    cost.refused = refused
    return cost


async def run_cost(backend: Any, job_ids: Iterable[str], prices: Prices | None = None) -> JobCost:
    """The cost of a run: a job's, or a pipeline's steps' summed (named by the first)."""
    ids = list(job_ids)
    total = JobCost(ids[0] if ids else "")
    for job_id in ids:
        step = await job_cost(backend, job_id, prices)
        total.prices_date, total.price_files = step.prices_date, step.price_files
        total.add(step)
    return total


def usd(amount: float) -> str:
    """Dollars as `cmr status` prints them: small amounts with their significant digits."""
    if amount == 0:
        return "$0"
    if amount >= 0.01:
        return f"${amount:,.2f}"
    return f"${amount:.2g}" if amount >= 1e-6 else f"${amount:.1e}"


_LABELS = {
    "sqs.requests": "billed (64 KiB chunks)",
    "s3.class_a": "class A",
    "s3.class_b": "class B",
    "dynamodb.write_units": "WRU",
    "dynamodb.read_units": "RRU",
    "azure.blob.write": "write ops",
    "azure.blob.list": "list ops",
    "azure.blob.read": "read ops",
    "azure.blob.other": "other ops",
    "azure.queue.class1": "class 1 ops",
    "azure.queue.class2": "class 2 ops",
    "azure.table.transactions": "transactions",
}


def short(cost: JobCost) -> str:
    """The job list's cell: the total, or "-" when no process has written a usage row."""
    return usd(cost.total_usd) if cost.processes else "-"


def lines(cost: JobCost) -> list[str]:
    """The cost as `cmr status JOB` prints it: the total, then by service and operation
    (requests, billed units, dollars), then worker-seconds."""
    dated = f"prices of {cost.prices_date}" + (
        f", {', '.join(cost.price_files)} over them" if cost.price_files else ""
    )
    if not cost.processes and not cost.refused:
        return ["cost: not counted (no usage rows: the job ran before cmr counted costs)"]
    out = [f"cost: {usd(cost.total_usd)} ({dated})"]
    for service, ops in cost.services().items():
        spent = sum(c.usd for c in ops.values())
        name = billing.SERVICES.get(service, service)
        out.append(f"  {name}: {usd(spent)}, {sum(c.requests for c in ops.values()):,} requests")
        for op, c in ops.items():
            units = f"{c.units:,.1f}".removesuffix(".0")
            billed = f"{units} {_LABELS.get(c.price, c.price)}" if c.price else "free"
            out.append(
                f"    {op.partition('.')[2]}: {c.requests:,} requests, {billed}, {usd(c.usd)}"
            )
    kinds = ", ".join(f"{s:,.1f} s of {name}" for name, s in sorted(cost.instances.items()))
    out.append(f"  workers: {usd(cost.workers_usd)}, {kinds or '0 s'}")
    if cost.refused:
        out.append(f"  {len(cost.refused)} usage rows refused (not priced): {cost.refused[0]}")
    return out
