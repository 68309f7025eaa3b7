"""``cmr loadgen``: jam, sweep, staleness and cpq, each a cmr job whose map tasks drive a store.

How the flags map onto tasks (one ``LoadTask`` per map task):

- ``--readers`` / ``--writers`` are per task, as seed 000's "100 get + 100 put threads per map
  task"; ``--ops`` and ``--rate`` are totals for the whole test, split evenly over the tasks;
  ``--duration`` is how long every task runs.
- ``sweep`` runs one jam per (items, concurrency) point with the same ``--ops`` total, where
  concurrency is the operators per task: ``--op get`` makes them all readers, ``--op put`` all
  writers, ``--op both`` half and half (the odd one a reader).
- ``cpq`` runs one staleness measurement per p with ``--consistent-ratio p``. Only reads
  choose: these stores have no stronger write to pick (seed 003's quorum write has no
  counterpart; a conditional put is not one), so writes stay plain at every p.

The JSON each command writes is a contract (issue 4); the tables and figures are drawn from
that JSON alone (``cmr.loadgen.report``, ``cmr.loadgen.plots``). The flags all four take are
``LoadFlags`` and ``StoreFlags``, declared once (``cmr.cli.loadtest``, ``cmr.cli.options``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cmr.cli.loadtest import (
    LoadFlags,
    Measure,
    RetriesMode,
    engine_of,
    finish,
    jam_report,
    run,
    staleness_report,
    warnings_of,
)
from cmr.cli.options import StoreFlags, choice_option, shared
from cmr.errors import UsageError
from cmr.loadgen import plan, report
from cmr.loadgen.plan import Op
from cmr.loadgen.spec import Retries

__all__ = ["loadgen_app"]

loadgen_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Load tests and consistency measurements of a store (DynamoDB, S3, SQS, SimpleDB, "
    "Azure Table and Blob storage, or the simulated 'sim'), run as cmr jobs: map tasks drive "
    "traffic, reducers merge it.",
)

Tasks = Annotated[int, typer.Option(help="map tasks (spread over the workers)")]
Items = Annotated[int, typer.Option(help="distinct keys: 1 loads a single item")]
ConsistentRatio = Annotated[float, typer.Option(help="P(a read is strongly consistent)")]
ConditionalRatio = Annotated[float, typer.Option(help="P(a write is conditional)")]
Retrying = Annotated[RetriesMode, choice_option(RetriesMode, "--retries", "SDK retries")]
WriteInterval = Annotated[int, typer.Option(help="the writer writes this often, ms")]


def _retries(mode: RetriesMode) -> Retries:
    return mode.value  # RetriesMode's values are exactly Retries'


@loadgen_app.command()
@shared("store", StoreFlags)
@shared("load", LoadFlags)
def jam(
    load: LoadFlags,
    store: StoreFlags,
    tasks: Tasks = 1,
    readers: Annotated[int, typer.Option(help="concurrent readers per task")] = 100,
    writers: Annotated[int, typer.Option(help="concurrent writers per task")] = 100,
    items: Items = 1,
    duration: Annotated[float | None, typer.Option(help="seconds each task runs")] = None,
    ops: Annotated[int | None, typer.Option(help="operations in all, split over tasks")] = None,
    consistent_ratio: ConsistentRatio = 0.0,
    conditional_ratio: ConditionalRatio = 0.0,
    rate: Annotated[
        float | None, typer.Option(help="open loop: intended ops/s in all (default: closed loop)")
    ] = None,
    retries: Retrying = RetriesMode.off,
) -> None:
    """Jam the target with readers and writers (seed 000); print seed 002's Table I.

    Latency per operation and mode, errors by class, ok ops/s.
    """
    engine = engine_of(load, store)
    task_list = engine.jam_tasks(
        tasks,
        readers=readers,
        writers=writers,
        items=items,
        duration_s=duration,
        ops=ops,
        rate=rate,
        consistent_ratio=consistent_ratio,
        conditional_ratio=conditional_ratio,
        retries=_retries(retries),
    )

    async def body(measure: Measure) -> dict[str, Any]:
        return jam_report(await measure(task_list, "running"), engine.target, task_list)

    data = run(engine, f"jam {engine.target}", body)
    finish(load, "jam", data, [report.jam_table(data)])


@loadgen_app.command()
@shared("store", StoreFlags)
@shared("load", LoadFlags)
def sweep(
    load: LoadFlags,
    store: StoreFlags,
    concurrency: Annotated[
        str, typer.Option(help="operators per task at each point, comma-separated")
    ] = "1,10,50,100,200",
    ops: Annotated[int, typer.Option(help="operations at every point, in all")] = 10000,
    items: Annotated[
        str, typer.Option(help="item counts, comma-separated: a curve each (e.g. 1,1000)")
    ] = "1",
    op: Annotated[
        Op, choice_option(Op, "--op", "get: all readers; put: all writers; both: half each")
    ] = Op.both,
    tasks: Tasks = 1,
    consistent_ratio: ConsistentRatio = 0.0,
    conditional_ratio: ConditionalRatio = 0.0,
    retries: Retrying = RetriesMode.off,
) -> None:
    """Total time of a fixed number of operations at rising concurrency (seed 000).

    One jam per (items, concurrency) point; a curve per --items value.
    """
    levels = plan.ints(concurrency, "--concurrency")
    item_counts = plan.ints(items, "--items")
    engine = engine_of(load, store)
    points_plan = []
    for k in item_counts:
        for c in levels:
            r, w = plan.mix(op, c)
            task_list = engine.jam_tasks(
                tasks,
                readers=r,
                writers=w,
                items=k,
                duration_s=None,
                ops=ops,
                rate=None,
                consistent_ratio=consistent_ratio,
                conditional_ratio=conditional_ratio,
                retries=_retries(retries),
            )
            points_plan.append((k, c, r, w, task_list))

    async def body(measure: Measure) -> list[dict[str, Any]]:
        points = []
        for n, (k, c, r, w, task_list) in enumerate(points_plan, 1):
            what = f"point {n}/{len(points_plan)}: {k} item(s), concurrency {c}"
            jam_data = jam_report(await measure(task_list, what), engine.target, task_list)
            total_s = float(jam_data["duration_s"])
            ok = sum(int(o.get("ok", 0)) for o in jam_data.get("ops", []))
            points.append(
                {
                    "items": k,
                    "concurrency": c,
                    "readers": r,
                    "writers": w,
                    "total_s": total_s,
                    "throughput_ops_s": ok / total_s if total_s > 0 else 0.0,
                    "errors": report.total_errors(jam_data.get("ops", [])),
                    "ops": jam_data.get("ops", []),
                    "warnings": jam_data.get("warnings", []),
                }
            )
        return points

    points = run(engine, f"sweep {engine.target}", body)
    data = {
        "target": engine.target,
        "items": item_counts,
        "op": op.value,
        "tasks": tasks,
        "ops_per_point": ops,
        "points": points,
        "warnings": warnings_of(points),
    }
    finish(load, "sweep", data, [report.sweep_table(data)])


@loadgen_app.command()
@shared("store", StoreFlags)
@shared("load", LoadFlags)
def staleness(
    load: LoadFlags,
    store: StoreFlags,
    duration: Annotated[float, typer.Option(help="seconds each task runs")],
    write_interval_ms: WriteInterval = 1000,
    readers: Annotated[int, typer.Option(help="readers per task, reading as fast as they can")] = 4,
    consistent_ratio: Annotated[
        float,
        typer.Option(help="P(a read is strongly consistent); 0.5 draws both of seed 004's curves"),
    ] = 0.5,
    tasks: Tasks = 1,
    items: Items = 1,
) -> None:
    """Freshness against time since the latest write (seeds 002 and 004).

    One writer writes increasing values, readers record what they see; also monotonic-read
    and read-your-writes violations, stale fractions and Γ.
    """
    engine = engine_of(load, store)
    task_list = engine.staleness_tasks(
        tasks,
        readers=readers,
        items=items,
        duration=duration,
        write_interval_ms=write_interval_ms,
        consistent_ratio=consistent_ratio,
    )

    async def body(measure: Measure) -> dict[str, Any]:
        m = await measure(task_list, "running")
        return {"target": engine.target, **staleness_report(m)}

    data = run(engine, f"staleness {engine.target}", body)
    tables = [report.freshness_table(data), report.staleness_table(data)]
    succ = report.successive_table(data)
    finish(load, "staleness", data, [*tables, *([succ] if succ is not None else [])])


def _cpq_point(p: float, data: dict[str, Any]) -> dict[str, Any]:
    """One point of seed 003 Fig. 2 from a staleness report measured at probability p."""
    by_mode = data.get("stale") or {}
    latency = data.get("latency_ms") or {}
    gamma = {k: v for k, v in (data.get("gamma") or {}).items() if k != "per_key_ms"}
    return {
        "p": p,
        "stale_fraction": data.get("stale_fraction"),
        "read_p95_ms": (latency.get("read") or {}).get("p95"),
        "write_p95_ms": (latency.get("write") or {}).get("p95"),
        # the stale fraction's own denominator: judged reads of every mode
        "reads": sum(int(v.get("reads", 0)) for v in by_mode.values()),
        "stale": sum(int(v.get("stale", 0)) for v in by_mode.values()),
        "stale_by_mode": by_mode,
        "writes": data.get("writes"),
        "gamma": gamma,
        "latency_ms": latency,
        "monotonic_read_violations": data.get("monotonic_read_violations"),
        "read_your_writes_violations": data.get("read_your_writes_violations"),
        "warnings": data.get("warnings", []),
    }


@loadgen_app.command()
@shared("store", StoreFlags)
@shared("load", LoadFlags)
def cpq(
    load: LoadFlags,
    store: StoreFlags,
    p: Annotated[
        str, typer.Option("--p", help="probabilities of the strong mode, comma-separated")
    ] = "0,0.25,0.5,0.75,1",
    duration: Annotated[float, typer.Option(help="seconds each point runs")] = 10.0,
    write_interval_ms: WriteInterval = 1000,
    readers: Annotated[int, typer.Option(help="readers per task")] = 4,
    tasks: Tasks = 1,
    items: Items = 1,
) -> None:
    """Consistency and latency against p, continuous partial quorums (seed 003).

    At each p every read is strongly consistent with probability p; reports the stale
    fraction and p95 read/write latency.
    """
    ps = plan.floats(p, "--p")
    if any(not 0.0 <= x <= 1.0 for x in ps):
        raise UsageError(f"--p {p!r}: probabilities must be between 0 and 1")
    engine = engine_of(load, store)
    points_plan = [
        (
            x,
            engine.staleness_tasks(
                tasks,
                readers=readers,
                items=items,
                duration=duration,
                write_interval_ms=write_interval_ms,
                consistent_ratio=x,
            ),
        )
        for x in ps
    ]

    async def body(measure: Measure) -> list[dict[str, Any]]:
        points = []
        for n, (x, task_list) in enumerate(points_plan, 1):
            m = await measure(task_list, f"point {n}/{len(points_plan)}: p = {x:g}")
            points.append(_cpq_point(x, staleness_report(m)))
        return points

    points = run(engine, f"cpq {engine.target}", body)
    data = {
        "target": engine.target,
        "duration_s": duration,
        "write_mode": "plain",
        "points": points,
        "warnings": warnings_of(points),
    }
    finish(load, "cpq", data, [report.cpq_table(data)])
