"""The shipped price table, and a user's file over it: each mistake one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmr import billing
from cmr.prices import PricesError, load


def test_the_shipped_table_is_dated_sourced_and_prices_every_class() -> None:
    p = load(None)
    assert p.date and p.currency == "USD" and not p.files
    for key in {billing.price_key(op) for op in _OPS} - {None}:
        assert key in p.units, key
        assert p.units[key].source.startswith("https://"), key
    assert p.default_instance in p.hourly
    assert p.hour_of("no.such-type") == (p.default_instance, p.hourly[p.default_instance].usd)


_OPS = [
    "sqs.SendMessageBatch",
    "s3.PutObject",
    "s3.GetObject",
    "dynamodb.PutItem",
    "dynamodb.GetItem",
    "blob.PutBlob",
    "blob.ListBlobs",
    "blob.GetBlob",
    "blob.GetBlobProperties",
    "queue.PutMessage",
    "queue.GetMessages",
    "table.QueryEntity",
]


def test_a_file_overrides_some_prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        'date = "2030-01-01"\n[prices."sqs.requests"]\nusd = 0.5\n'
        '[instances]\ndefault = "x9.huge"\n[instances.hourly."x9.huge"]\nusd = 10.0\n'
    )
    p = load(str(f))
    assert p.date == "2030-01-01" and p.files == [str(f)]
    assert p.units["sqs.requests"].usd == 0.5 and p.units["sqs.requests"].per == 1_000_000
    assert p.units["s3.class_a"].usd == load(None).units["s3.class_a"].usd
    assert p.hour_of("") == ("x9.huge", 10.0)
    monkeypatch.setenv("CMR_PRICES", str(f))
    assert load().units["sqs.requests"].usd == 0.5


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[prices."sqs.request"]\nusd = 1\n', "prices.'sqs.request'"),
        ('[prices."sqs.requests"]\nusd = -1\n', "prices.sqs.requests.usd"),
        ('[prices."sqs.requests"]\nusd = "cheap"\n', "prices.sqs.requests.usd"),
        ('[prices."sqs.requests"]\nper = 0\n', "prices.sqs.requests.per"),
        ('[prices."sqs.requests"]\ncost = 1\n', "prices.sqs.requests.cost"),
        ('[prices."sqs.requests"]\nusd = inf\n', "prices.sqs.requests.usd"),
        ("currency = 'EUR'\n", "currency"),
        ("colour = 1\n", "'colour'"),
        ('[instances]\ndefault = "z1.none"\n', "instances.default"),
        ('[instances.hourly."bad type!"]\nusd = 1\n', "instances.hourly"),
        ("not = [toml\n", "not TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(PricesError) as err:
        load(str(f))
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg and named in msg, msg


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PricesError, match="No such file"):
        load(str(tmp_path / "none.toml"))
