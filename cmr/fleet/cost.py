"""The fleet's hourly cost estimate, from the price list in the checkout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cmr.fleet.wheel import project_root

PRICES = "deploy/prices.json"


def load_prices(root: Path | None) -> dict[str, Any]:
    path = (root or project_root()) / PRICES
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def hourly_cost(instances: list[dict[str, Any]], prices: dict[str, Any]) -> tuple[float, list[str]]:
    """Estimated USD/hour of the pending or running instances, and the types without a price."""
    table: dict[str, float] = prices["on_demand_hourly"]
    discount = float(prices["spot_discount_assumption"])
    total, unknown = 0.0, []
    for inst in instances:
        if inst["state"] not in ("pending", "running"):
            continue
        price = table.get(inst["type"])
        if price is None:
            unknown.append(inst["type"])
            continue
        total += price * (1 - discount) if inst["market"] == "spot" else price
    return total, sorted(set(unknown))
