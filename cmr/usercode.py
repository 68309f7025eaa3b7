"""The job's code as the user sees it: errors said in terms of their methods, and keys in
their natural order.

A mistake in user code is reported as what the user wrote did: which method (``WordCount.map
raised ValueError: boom``, ``WordCount.map yielded 'ab' (a str); expected (key, value)
pairs``), with the user's own traceback frames only: cmr's and msgpack's frames say nothing
the user can act on. The hot loops in :mod:`cmr.cpu` do not check what user code yields
pair by pair beyond one type test; when something fails they ask here what the user did.
"""

from __future__ import annotations

import math
import os
import sysconfig
import traceback
from collections.abc import Iterable, Iterator
from types import FrameType, GeneratorType, TracebackType
from typing import Any

import msgpack

from cmr.errors import CmrError

_CMR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_MSGPACK_DIR = os.path.dirname(os.path.abspath(msgpack.__file__)) + os.sep
# The standard library is the user's when their code calls it (``json.loads`` in a map),
# but never the user's own code: a failure seen only in its frames (``json.dumps`` in the
# default ``format``) is judged by what the user yielded.
_STDLIB_DIRS = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    if p
)
SHOWN = 120  # characters of a yielded value quoted in a message

WIRE_TYPES = "str, bytes, int, float, bool, None, and lists, tuples and dicts of those"
KEY_TYPES = "str, bytes, int, float, bool, None, or lists/tuples of those"


class UserCodeError(CmrError):
    """A mistake of the job's code that cmr found: the message names the method, what it
    did, and what was expected. It is the whole report: no traceback of cmr's."""


def ours(filename: str) -> bool:
    """A frame of cmr or msgpack (never the user's to read)."""
    if filename.startswith("msgpack/"):
        return True  # msgpack's Cython frames name their .pyx relative to the package
    path = os.path.abspath(filename)
    return path.startswith(_CMR_DIR) or path.startswith(_MSGPACK_DIR)


def _users(filename: str) -> bool:
    if ours(filename):
        return False
    path = os.path.abspath(filename)
    # Installed packages may lie under the stdlib's directory (a Python without a venv).
    return not path.startswith(_STDLIB_DIRS) or any(
        d in path for d in ("/site-packages/", "/dist-packages/")
    )


def _frames(tb: TracebackType | None) -> Iterator[FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def culprit(exc: BaseException) -> str | None:
    """The user's method an exception came out of (the outermost user frame of its
    traceback, e.g. ``WordCount.map``), or None when it never passed through user code."""
    for frame in _frames(exc.__traceback__):
        if _users(frame.f_code.co_filename):
            return frame.f_code.co_qualname
    return None


def users_traceback(exc: BaseException) -> str:
    """The traceback with cmr's and msgpack's frames left out (causes and contexts too)."""
    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()

    def strip(t: traceback.TracebackException | None) -> None:
        if t is None or id(t) in seen:
            return
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if not ours(f.filename)])
        strip(t.__cause__)
        strip(t.__context__)
        for sub in getattr(t, "exceptions", None) or ():
            strip(sub)

    strip(te)
    return "".join(te.format())


def describe(exc: BaseException) -> str:
    """A task's error as text for the job record: a UserCodeError's message, or the method
    that raised and the user's frames; an error of cmr's own keeps its whole traceback."""
    if isinstance(exc, UserCodeError):
        return str(exc)
    method = culprit(exc)
    if method is None:
        if isinstance(exc, CmrError):
            return f"{type(exc).__name__}: {exc}"  # said for people already
        return "".join(traceback.format_exception(exc, limit=-12))
    return f"{method} raised {_exc_line(exc)}\n{users_traceback(exc)}"


def _exc_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def quote(x: Any) -> str:
    """A yielded value as a message shows it: its repr, cut short, and its type."""
    try:
        text = repr(x)
    except Exception:  # a user's __repr__ may raise too
        text = f"<{type(x).__name__} object>"
    if len(text) > SHOWN:
        text = text[: SHOWN - 3] + "..."
    return f"{text} ({a_type(x)})"


def a_type(x: Any) -> str:
    """'a str', 'an int': the type of ``x`` as a message says it."""
    kind = type(x).__name__
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def innermost_code(exc: BaseException) -> Any:
    """The code object of the frame an exception was raised in."""
    frames = list(_frames(exc.__traceback__))
    return frames[-1].f_code if frames else None


def location(source: Any) -> str:
    """Where a user's generator stands (the line of its last ``yield``), following
    ``yield from`` to the innermost generator: ', at FILE line N', or '' if not known."""
    found = ""
    while isinstance(source, GeneratorType):
        frame = source.gi_frame
        if frame is None:
            break
        if not ours(frame.f_code.co_filename):
            found = f", at {frame.f_code.co_filename} line {frame.f_lineno}"
        source = source.gi_yieldfrom
    return found


def as_pair(pair: Any, method: str, source: Any = None) -> tuple[Any, Any]:
    """A yielded item that is not a tuple: a 2-list is a pair, anything else a mistake (a
    2-character string would unpack as a pair, silently)."""
    if isinstance(pair, list | tuple) and len(pair) == 2:  # a namedtuple too
        return pair[0], pair[1]
    raise bad_pair(pair, method, source)


def bad_pair(pair: Any, method: str, source: Any = None) -> UserCodeError:
    what = quote(pair)
    if isinstance(pair, tuple):
        what = f"a tuple of {len(pair)}: {what}"
    return UserCodeError(
        f"{method} yielded {what}{location(source)}; expected (key, value) pairs: "
        f"`yield key, value`"
    )


def wire_problem(x: Any, depth: int = 0) -> str | None:
    """What in ``x`` is not msgpack wire data, or None when all of it is."""
    if depth > 100:
        return "data nested more than 100 deep"
    t = type(x)
    if x is None or t in (bool, float, bytes, bytearray):
        return None
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return f"{quote(x)}, which is not valid Unicode (a lone surrogate)"
        return None
    if isinstance(x, int):
        if -(2**63) <= x < 2**64:
            return None
        return f"{quote(x)}, outside the 64-bit range of wire ints"
    if isinstance(x, list | tuple):
        for e in x:
            if (problem := wire_problem(e, depth + 1)) is not None:
                return problem
        return None
    if isinstance(x, dict):
        for k, v in x.items():
            problem = wire_problem(k, depth + 1) or wire_problem(v, depth + 1)
            if problem is not None:
                return problem
        return None
    try:
        msgpack.packb(x, use_bin_type=True)  # a subclass of a type msgpack knows
    except Exception:
        return quote(x)
    return None


NOTHING: Any = object()  # no source known: pairs flushed from combined groups


def not_pairs(method: str, returned: Any, exc: BaseException | None = None) -> UserCodeError:
    what = f"returned {quote(returned)}, not an" if returned is not NOTHING else "returned no"
    why = f" ({exc})" if exc is not None else ""
    return UserCodeError(
        f"{method} {what} iterable of (key, value) pairs{why}: `yield key, value` in it, "
        "or return a list of pairs"
    )


class PairTooBig(ValueError):
    """A pair past what one shuffled pair may take (cmr.wire.MAX_DECODED packed)."""


def bad_output(
    method: str, pair: Any, exc: BaseException, source: Any = NOTHING, *, wire: bool = True
) -> BaseException:
    """What was wrong with what the user's method returned or yielded, now that cmr failed
    to handle it (``source``: what the method returned; ``pair``: its last item; ``wire``:
    whether the pairs go on the wire): a UserCodeError saying so, or ``exc`` itself when all
    looks right (a fault of cmr's)."""
    if source is not NOTHING and not isinstance(source, Iterable):
        return not_pairs(method, source)
    if type(pair) is list and len(pair) == 2:
        pair = tuple(pair)
    if not (isinstance(pair, tuple) and len(pair) == 2):
        return bad_pair(pair, method, source)
    key, value = pair
    if isinstance(exc, PairTooBig):
        return UserCodeError(
            f"{method} yielded a pair for key {quote(key)}{location(source)}: {exc}"
        )
    if isinstance(key, dict):
        return UserCodeError(
            f"{method} yielded a dict as a key: {quote(key)}{location(source)}; keys must be "
            f"{KEY_TYPES}"
        )
    for what, x in (("key", key), ("value", value)) if wire else ():
        problem = wire_problem(x)
        if problem is not None:
            return UserCodeError(
                f"{method} yielded a {what} that is not wire data: {problem}{location(source)}; "
                f"keys and values must be {WIRE_TYPES}"
            )
    return exc


def key_of(key: Any, method: str) -> Any:
    """A key as the reducer will see it (lists arrive as tuples): hashable, so values can be
    grouped by it. Called when grouping by the key as it is failed."""
    if isinstance(key, list | tuple):
        return tuple(key_of(k, method) for k in key)
    try:
        hash(key)
    except TypeError:
        raise UserCodeError(
            f"{method} yielded a key with a {type(key).__name__} in it: {quote(key)}; keys "
            f"must be {KEY_TYPES}"
        ) from None
    return key


def unhashable_key(key: Any, method: str) -> UserCodeError:
    return UserCodeError(
        f"{method} yielded a key that cannot be grouped by: {quote(key)}; keys must be {KEY_TYPES}"
    )


def bad_partition(method: str, got: Any, key: Any, partitions: int) -> UserCodeError:
    return UserCodeError(
        f"{method} returned {quote(got)} for the key {quote(key)}; it must return an int "
        f"from 0 to {partitions - 1} (the job has {partitions} partitions)"
    )


def not_a_line(method: str, got: Any) -> UserCodeError:
    return UserCodeError(
        f"{method} returned {quote(got)}; it must return a str: one output line, without "
        "its newline"
    )


def unrenderable(
    method: str, pair: tuple[Any, Any], exc: BaseException, source: Any = None
) -> UserCodeError:
    key, value = pair
    return UserCodeError(
        f"{method} yielded ({quote(key)}, {quote(value)}){location(source)}, which "
        f"Job.format cannot write faithfully ({exc}): yield {WIRE_TYPES} (dict keys: str, "
        f"int, float, bool, None), or override format()"
    )


# Key order. Keys of one part are written in this order: numbers, then str, then bytes, then
# tuples (lists arrive as tuples) compared element by element in this same order, then
# False < True, then None, then anything else by its msgpack encoding. NaN sorts after every
# other number. It is a total order over wire data, so sorting never raises, and the same
# function orders the reducer's in-memory sort and its merge of spilled runs.
_NUMBER, _NAN, _STR, _BYTES, _TUPLE, _BOOL, _NONE, _OTHER = range(8)


def sort_key(key: Any) -> tuple[int, Any]:
    t = type(key)
    if t is str:
        return (_STR, key)
    if t is int:
        return (_NUMBER, key)
    if t is tuple or t is list:
        return (_TUPLE, tuple(sort_key(k) for k in key))
    if t is float:
        return (_NAN, 0) if math.isnan(key) else (_NUMBER, key)
    if t is bytes:
        return (_BYTES, key)
    if t is bool:
        return (_BOOL, key)
    if key is None:
        return (_NONE, 0)
    return (_OTHER, msgpack.packb(key, use_bin_type=True))
