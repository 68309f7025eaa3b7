"""The everyday subset, ``pytest -m "not slow"`` (scripts/test.sh -m "not slow"): the full
suite less the tests marked ``slow``. A table of many cases of one kind (the CLI's mistakes,
mrjob's examples) keeps a few of them in it, spread over the table; the full suite runs
them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest


def spread(
    values: Sequence[Any], ids: Sequence[str] | Callable[[Any], str], every: int
) -> list[Any]:
    """``values`` as parametrize arguments named by ``ids``: the first and then every
    ``every``-th stay in the everyday subset, the others are marked slow. A tuple value
    fills several arguments, as in ``parametrize(("a", "b"), ...)``."""
    names = [ids(v) for v in values] if callable(ids) else list(ids)
    return [
        pytest.param(
            *(v if isinstance(v, tuple) else (v,)),
            id=name,
            marks=() if i % every == 0 else pytest.mark.slow,
        )
        for i, (v, name) in enumerate(zip(values, names, strict=True))
    ]


# Parametrized tests of many cases of one kind, named here rather than in their own files:
# the everyday subset runs every n-th of their cases (in collection order), the full suite all.
SPREAD = {
    "tests/engine/test_user_errors.py::test_user_code_mistakes_name_the_method": 5,
    "tests/engine/test_submit_checks.py::test_a_bad_run_option_is_one_error_line_naming_it": 3,
    "tests/engine/test_submit_checks.py::test_a_bad_worker_option_is_refused_by_its_flag": 3,
    "tests/engine/test_sorted_reduce.py::test_a_step_without_map_or_reduce_sorts_every_record": 3,
    "tests/engine/test_fixedsort.py::test_rows_sort_as_the_general_path_sorts_them": 3,
    "tests/engine/test_sorting.py::test_total_order_parts_concatenate_sorted": 2,
    "tests/engine/test_sorting.py::test_values_reach_reduce_sorted": 2,
    "tests/engine/test_testing_harness.py::test_each_input_format": 3,
    "tests/engine/test_testing_harness.py::test_compressed_input": 3,
    "tests/benchmarks/test_peers_harness.py::test_byte_range_runners_count_like_the_baseline": 3,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seen: dict[str, int] = {}
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        if test in SPREAD:
            seen[test] = n = seen.get(test, -1) + 1
            if n % SPREAD[test]:
                item.add_marker(pytest.mark.slow)
