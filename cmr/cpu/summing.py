"""Sums of int values, added by C: the fast path of a combine that is exactly
``yield key, sum(values)`` (Hadoop's IntSumReducer as a combiner; a word count's).

Such a function's output for int values is known without calling it: one pair, the key and
the values' total, whatever grouping the values come in (int addition is exact). So a map
task adds the values itself, in bulk: its dicts of counts (a ``map_chunk`` returning a
Counter's items) are merged into the task's totals with no loop of ours per pair, where
the general way held each key's values in a list and called the combine on them. From the
first value that is no int on, the task goes the general way, calling the job's own
function, so what it sends is the same either way (cmr.cpu.mapping). A reducer whose
reduce is such a function, over str keys and int values, writes each key's line itself
from the sorted pairs, with no call per key (cmr.cpu.reducing); adding them up by hashing
instead was measured slower than sorting the pairs on real text (1.6 million distinct
words).

A function is recognised by its compiled code, compared instruction by instruction with
this module's own ``yield key, sum(values)`` (names of the arguments, docstrings,
annotations and line numbers aside), and only while ``sum`` is the builtin where it runs.
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import itertools
import operator
from collections.abc import Callable, Mapping
from types import CodeType, FunctionType
from typing import Any


def _method(self: Any, key: Any, values: Any) -> Any:
    yield key, sum(values)


def _function(key: Any, values: Any) -> Any:
    yield key, sum(values)


# What kind of function it is: a generator, with *args or **kwargs, a coroutine.
_KINDS = (
    inspect.CO_GENERATOR
    | inspect.CO_VARARGS
    | inspect.CO_VARKEYWORDS
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


def _shape(code: CodeType) -> tuple[Any, ...]:
    """The code's instructions, locals by slot and everything else by value: what a function
    does, apart from what it calls its arguments and where its lines are."""
    flags = code.co_flags & _KINDS  # not the nesting or the __future__ imports
    out: list[Any] = [code.co_argcount, code.co_kwonlyargcount, flags, code.co_names]
    for ins in dis.get_instructions(code):
        if ins.opname in ("NOP", "CACHE", "EXTENDED_ARG"):
            continue
        if ins.opcode in dis.haslocal:
            out.append((ins.opname, ins.arg))
        elif ins.opcode in dis.hasconst:
            out.append((ins.opname, type(ins.argval), ins.argval))
        else:
            out.append((ins.opname, ins.argval))
    return tuple(out)


_SHAPES = {_shape(_method.__code__), _shape(_function.__code__)}


@functools.lru_cache(maxsize=256)
def _sums(code: CodeType) -> bool:
    return _shape(code) in _SHAPES


_SUM = builtins.sum  # the builtin as cmr found it (a job may replace builtins.sum)


def is_sum(fn: Callable[..., Any] | None) -> bool:
    """Whether calling ``fn(key, values)`` is ``yield key, sum(values)``: its code is that,
    it closes over nothing, and ``sum`` is the builtin where it runs (the one cmr found:
    a job that replaced ``builtins.sum`` calls its own)."""
    if fn is None:
        return False
    bound = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", fn) if bound is not None else fn
    if type(func) is not FunctionType or func.__closure__ or func.__kwdefaults__:
        return False
    code = func.__code__
    if code.co_argcount != (3 if bound is not None else 2):
        return False
    used: dict[str, Any] = getattr(func, "__builtins__", {})  # what its code's names fall back on
    if "sum" in func.__globals__ or used.get("sum") is not _SUM:
        return False
    return _sums(code)


def all_ints(values: Any) -> bool:
    """Whether every value is an int (exactly: a bool is not), by C; True when none."""
    return set(map(type, values)) <= {int}


def merge(totals: dict[Any, int], counts: Mapping[Any, int]) -> None:
    """Add ``counts`` (a mapping of int values) into ``totals``, by C: each key's total is
    its old one (0 if none) plus its count. Keys equal to one already held (1 and 1.0) add
    to it, as a dict groups them."""
    if not totals:
        totals.update(counts)
        return
    # Every old total is read before any new one is stored (the keys of a mapping are
    # distinct, so each is stored once).
    added = list(map(operator.add, counts.values(), map(totals.get, counts, itertools.repeat(0))))
    totals.update(zip(counts, added, strict=True))
