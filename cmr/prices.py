"""The prices a job's cost is worked out at: a dated table shipped in the package
(cmr/prices.toml, each price with its source), overridden by a file of the same shape
(``--prices FILE`` or CMR_PRICES) naming only the prices it changes.

A file that is not what the table is gets a one-line error naming the key."""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from cmr.errors import UsageError
from cmr.usage import INSTANCE

SETTING = "CMR_PRICES"
_TOP = {"date", "currency", "prices", "instances"}
_PRICE = {"usd", "per", "unit", "source"}


class PricesError(UsageError):
    """A prices file that cannot be used: one line, naming the file and the key."""


@dataclass(frozen=True)
class Price:
    usd: float  # for every ``per`` units
    per: int = 1
    unit: str = ""
    source: str = ""

    def of(self, units: float) -> float:
        return units * self.usd / self.per


@dataclass
class Prices:
    date: str
    currency: str
    units: dict[str, Price]  # by cmr.billing.price_key
    hourly: dict[str, Price]  # by instance type: usd an hour
    default_instance: str
    files: list[str] = field(default_factory=list)  # overrides applied, in order

    def unit_price(self, key: str | None) -> Price | None:
        return None if key is None else self.units.get(key)

    def hour_of(self, instance: str) -> tuple[str, float]:
        """(the type priced, its usd an hour): an unknown or unnamed type is the default's."""
        name = instance if instance in self.hourly else self.default_instance
        return name, self.hourly[name].usd


def _shipped() -> dict[str, Any]:
    text = resources.files("cmr").joinpath("prices.toml").read_text("utf-8")
    return tomllib.loads(text)


def load(path: str | None = None) -> Prices:
    """The shipped table, with ``path`` (else CMR_PRICES, if set) applied over it."""
    prices = _apply(_empty(), _shipped(), "cmr/prices.toml", shipped=True)
    path = path if path is not None else os.environ.get(SETTING) or None
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise PricesError(f"prices file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PricesError(f"prices file {path}: not TOML: {exc}") from None
        prices = _apply(prices, data, path, shipped=False)
        prices.files.append(path)
    return prices


def _empty() -> Prices:
    return Prices("", "USD", {}, {}, "")


def _bad(where: str, key: str, what: str) -> PricesError:
    return PricesError(f"prices file {where}: {key} {what}")


def _apply(base: Prices, data: dict[str, Any], where: str, *, shipped: bool) -> Prices:
    for key in data:
        if key not in _TOP:
            raise _bad(
                where, repr(key), f"is not a key of a prices file ({', '.join(sorted(_TOP))})"
            )
    out = Prices(
        str(data.get("date", base.date)),
        base.currency,
        dict(base.units),
        dict(base.hourly),
        base.default_instance,
        list(base.files),
    )
    currency = data.get("currency", out.currency)
    if currency != "USD":
        raise _bad(where, "currency", f"must be USD; got {str(currency)[:20]!r}")
    table = data.get("prices", {})
    if not isinstance(table, dict):
        raise _bad(where, "prices", "must be a table")
    for key, value in table.items():
        if not shipped and key not in base.units:
            known = ", ".join(sorted(base.units))
            raise _bad(where, f"prices.{key!r}", f"is not a price cmr knows ({known})")
        out.units[key] = _price(where, f"prices.{key}", value, base.units.get(key), per=True)
    instances = data.get("instances", {})
    if not isinstance(instances, dict):
        raise _bad(where, "instances", "must be a table")
    for key in instances:
        if key not in ("default", "hourly"):
            raise _bad(where, f"instances.{key}", "is not default or hourly")
    hourly = instances.get("hourly", {})
    if not isinstance(hourly, dict):
        raise _bad(where, "instances.hourly", "must be a table")
    for name, value in hourly.items():
        if not INSTANCE.fullmatch(name):
            raise _bad(where, f"instances.hourly.{name[:40]!r}", "is not a type like c7i.large")
        out.hourly[name] = _price(
            where, f"instances.hourly.{name}", value, out.hourly.get(name), per=False
        )
    default = instances.get("default", out.default_instance)
    if not isinstance(default, str) or default not in out.hourly:
        raise _bad(
            where,
            "instances.default",
            f"must name a type under instances.hourly; got {str(default)[:40]!r}",
        )
    out.default_instance = default
    return out


def _price(where: str, key: str, value: Any, base: Price | None, *, per: bool) -> Price:
    if not isinstance(value, dict):
        raise _bad(where, key, "must be a table like { usd = 0.4, per = 1000000 }")
    allowed = _PRICE if per else _PRICE - {"per", "unit"}
    for k in value:
        if k not in allowed:
            raise _bad(where, f"{key}.{k}", f"is not one of {', '.join(sorted(allowed))}")
    usd = value.get("usd", base.usd if base else None)
    if (
        isinstance(usd, bool)
        or not isinstance(usd, int | float)
        or not math.isfinite(usd)
        or usd < 0
    ):
        raise _bad(
            where, f"{key}.usd", f"must be a number of dollars, 0 or more; got {str(usd)[:40]!r}"
        )
    n = value.get("per", base.per if base else 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad(
            where, f"{key}.per", f"must be a whole number of units, 1 or more; got {str(n)[:40]!r}"
        )
    unit = value.get("unit", base.unit if base else "")
    source = value.get("source", base.source if base else "")
    if not isinstance(unit, str) or not isinstance(source, str):
        raise _bad(where, key, "unit and source must be strings")
    return Price(float(usd), n, unit, source)
