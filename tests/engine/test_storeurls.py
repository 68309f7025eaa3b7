"""Store URLs of both clouds answer the engine's questions about places alike: a bucket, or
an account's container, is the root; the key below it the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmr import storeurls
from cmr.errors import UsageError
from cmr.inputs import base_of, name_below
from cmr.places import check_apart


def test_the_root_of_each_scheme() -> None:
    assert storeurls.split("s3://b/a/b") == ("s3://b", "a/b")
    assert storeurls.split("azure://acct/c/a/b") == ("azure://acct/c", "a/b")
    assert storeurls.split("azure://acct/c") == ("azure://acct/c", "")
    assert storeurls.root_prefix("azure://acct/c/cmr") == "azure://acct/c/"
    assert storeurls.as_path("azure://acct/c/a/") == Path("/azure/acct/c/a")
    assert storeurls.as_path("s3://acct/c/a") != storeurls.as_path("azure://acct/c/a")


def test_inputs_in_one_container_share_a_base_and_names_below_it() -> None:
    base = base_of(["azure://acct/c/logs/2026/a", "azure://acct/c/logs/2025"])
    assert base == "azure://acct/c/logs"
    assert name_below(base, "azure://acct/c/logs/2026/a/x.txt") == "2026/a/x.txt"
    with pytest.raises(UsageError, match="no directory in common"):
        base_of(["azure://acct/c/logs", "azure://acct/d/logs"])  # two containers


@pytest.mark.parametrize(
    ("source", "output", "says"),
    [
        ("azure://acct/c/in", "azure://acct/c/in", "is the input"),
        ("azure://acct/c/in", "azure://acct/c/in/out", "inside the input"),
        ("azure://acct/c/in/sub", "azure://acct/c/in", "lies inside the output"),
    ],
)
def test_an_azure_output_is_kept_apart_from_its_input(source: str, output: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        check_apart(source, output)


def test_azure_places_apart_pass() -> None:
    check_apart("azure://acct/c/in", "azure://acct/c/out")
    check_apart("azure://acct/c/in", "azure://acct/d/in")  # another container
    check_apart("s3://acct/c/in", "azure://acct/c/in")  # another cloud
