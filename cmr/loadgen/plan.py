"""From a load test's flags to its tasks: one :class:`LoadTask` per map task, with the
test's totals (operations, rate) split between them. Pure: checked here, before anything
is created or run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from enum import StrEnum
from typing import Any

from cmr.errors import UsageError
from cmr.loadgen.sim import SimConfig
from cmr.loadgen.spec import Kind, LoadTask


class Op(StrEnum):
    """Which operators make up a sweep point's concurrency."""

    get = "get"  # all readers
    put = "put"  # all writers
    both = "both"  # half and half, the odd one a reader


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as integers allow (the first ones get more)."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def sim_overrides(pairs: Sequence[str], target: str) -> dict[str, Any]:
    """``--sim KEY=VALUE`` pairs typed after SimConfig's fields (so a typo fails up front)."""
    if pairs and target != "sim":
        raise UsageError(f"--sim configures the simulated store; target {target} is not it")
    known = {f.name: f for f in fields(SimConfig)}
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in known:
            raise UsageError(
                f"--sim {pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}"
            )
        default = getattr(SimConfig(), key)
        try:
            if raw.lower() in ("none", "") and key == "capacity_ops_s":
                value: Any = None
            elif isinstance(default, bool):
                value = raw.lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float) or default is None:
                value = float(raw)
            else:
                value = raw
        except ValueError:
            raise UsageError(f"--sim {pair!r}: {raw!r} is not a number") from None
        overrides[key] = value
    SimConfig(**overrides)  # validates the combination now, not inside a map task
    return overrides


def floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not values:
        raise UsageError(f"{flag} needs at least one value")
    return values


def ints(text: str, flag: str) -> list[int]:
    values = floats(text, flag)
    if any(v != int(v) or v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: expected whole numbers of at least 1")
    return [int(v) for v in values]


def mix(op: Op, concurrency: int) -> tuple[int, int]:
    """(readers, writers) making up one sweep point's concurrency."""
    if op == Op.get:
        return concurrency, 0
    if op == Op.put:
        return 0, concurrency
    writers = concurrency // 2
    return concurrency - writers, writers


def tasks(
    kind: Kind,
    target: str,
    count: int,
    *,
    seed: int,
    readers: int,
    writers: int,
    items: int,
    duration_s: float | None,
    ops: int | None,
    rate: float | None,
    resources: Mapping[str, str],
    sim: Mapping[str, Any],
    **options: Any,
) -> list[LoadTask]:
    """One task description per map task, with the totals (ops, rate) split between them."""
    if count < 1:
        raise UsageError("--tasks must be at least 1")
    if (duration_s is None) == (ops is None):
        raise UsageError("give exactly one of --duration and --ops")
    if duration_s is not None and duration_s <= 0:
        raise UsageError("--duration must be positive")
    if ops is not None and ops < count:
        raise UsageError(f"--ops {ops} is fewer than one operation per task ({count} tasks)")
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be positive")
    per_task_ops = split(ops, count) if ops is not None else [None] * count
    return [
        LoadTask(
            kind=kind,
            target=target,
            task=i,
            seed=seed + i,
            readers=readers,
            writers=writers,
            items=items,
            duration_s=duration_s,
            ops=per_task_ops[i],
            rate=rate / count if rate is not None else None,
            resources=dict(resources),
            sim=dict(sim),
            **options,
        )
        for i in range(count)
    ]


def staleness_tasks(
    target: str,
    count: int,
    *,
    seed: int,
    readers: int,
    items: int,
    duration: float,
    write_interval_ms: int,
    consistent_ratio: float,
    resources: Mapping[str, str],
    sim: Mapping[str, Any],
) -> list[LoadTask]:
    """One writer and ``readers`` timed readers per task (seeds 002, 003 and 004)."""
    if target == "sqs":
        raise UsageError("staleness needs a keyed store and sqs has no keys: use jam on sqs")
    if write_interval_ms < 1:
        raise UsageError("--write-interval-ms must be at least 1")
    if readers < 1:
        raise UsageError("--readers must be at least 1: a staleness test needs someone to read")
    return tasks(
        "staleness",
        target,
        count,
        seed=seed,
        readers=readers,
        writers=1,
        items=items,
        duration_s=duration,
        ops=None,
        rate=None,
        resources=resources,
        sim=sim,
        consistent_ratio=consistent_ratio,
        write_interval_ms=write_interval_ms,
    )


def with_resources(task_list: list[LoadTask], resources: Mapping[str, str]) -> list[LoadTask]:
    """The tasks with the resource names ``prepare`` settled on."""
    return [replace(t, resources=dict(resources)) for t in task_list]
