"""The user's job: a class with ``map``, optional ``combine``, and ``reduce``.

A job file is ordinary Python that the *worker* imports from its own files (a path that
exists on the worker, or an installed module) — job code never travels on the wire. The
job record carries only the reference and a digest of the file, so a worker whose copy
differs refuses instead of computing something else.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from cmr import adapters, counters, formats, sidefiles
from cmr.errors import JobCodeError
from cmr.partition import stable_partition
from cmr.usercode import a_type
from cmr.wire import MAX_PARTITIONS

Pair = tuple[Any, Any]
MAX_STEPS = 64  # steps of one pipeline: each is a job of its own (queues, records)


@dataclass(frozen=True)
class Step:
    """One map/combine/reduce round of a pipeline (``Job.steps``). Step k > 0 reads what
    step k-1 wrote, as (key, value) pairs of the types reduce yielded (lists as tuples);
    only the last step writes the job's output.

    ``map`` None passes pairs through unchanged; ``reduce`` None makes a map-only step
    (each value of each key is written as it is); with neither, a step sorts: its records
    reach the output grouped and ordered by key (TeraSort's step). Hooks run once per task:
    ``map_init`` before a map task's records, ``map_final`` after them (the pairs it yields
    are mapped output too); ``reduce_init``/``reduce_final`` around a reduce task; ``combine_init``/
    ``combine_final`` around a map task's combining."""

    map: Callable[[Any, Any], Iterable[Pair]] | None = None
    combine: Callable[[Any, Iterator[Any]], Iterable[Pair]] | None = None
    reduce: Callable[[Any, Iterator[Any]], Iterable[Pair]] | None = None
    map_init: Callable[[], Any] | None = None
    map_final: Callable[[], Iterable[Pair] | None] | None = None
    combine_init: Callable[[], Any] | None = None
    combine_final: Callable[[], Iterable[Pair] | None] | None = None
    reduce_init: Callable[[], Any] | None = None
    reduce_final: Callable[[], Iterable[Pair] | None] | None = None
    reducers: int | None = None  # this step's partitions (None: the job's)
    sort_values: bool = False  # values reach reduce sorted (see Job.sort_values)
    value_order: Callable[[Any], Any] | None = None  # the values' sort key (None: natural)
    # The fast path for text input: all of a split's lines at once (Job.map_chunk). Only the
    # default step of a job that reads lines uses it.
    map_chunk: Callable[[str, bytes], Iterable[Pair]] | None = None


class Job:
    """Subclass this, defining ``map`` (or ``map_chunk``) and ``reduce``.

    Keys and values must be msgpack data (str, bytes, int, float, bool, None, lists and
    dicts of those; lists arrive as tuples). Keys must not contain dicts: values are grouped
    by key, and a list key is grouped as the tuple it arrives as.

    Key order: each output part holds its keys in this order: numbers (int and float
    together, by value; NaN after them), then str (by code point), then bytes, then tuples
    (lists arrive as tuples), compared element by element in this same order (a shorter
    tuple before its extensions), then False, True, then None. Keys of mixed types never
    make the sort fail. Which part a key lands in is ``partition``'s choice (a hash by
    default), so the order holds within a part, not across parts, unless ``total_order``.

    ``sort_values = True``: each key's values reach reduce sorted, in the same natural order
    as keys, or by ``value_order(value)`` when the class defines that method (a key
    function, as ``sorted`` takes). ``total_order = True``: keys are sampled at submit and
    partitioned by range (``partition`` must be the default), so part i's keys all sort
    before part i+1's, and the parts read in order are one sorted sequence.
    """

    reducers: ClassVar[int] = 4  # default partition count; ``--reducers`` overrides it
    # Line endings of the input: "lf" (lines end at "\n" only: a CRLF line keeps its "\r")
    # or "universal" ("\r\n", "\n" and a lone "\r" each end a line). A job's submission
    # may choose for it (``cmr run --lines``); map_chunk sees "\n"-separated lines either way.
    lines: ClassVar[str] = "lf"
    # How input files become records, and pairs become output (cmr.formats): input "lines",
    # "jsonlines", "csv", "fixed:<record_len>:<key_len>", "whole" or "pairs" (compressed
    # files are read too); output "text", "raw", "jsonlines" or "pairs".
    # ``cmr run --input-format`` / ``--output-format`` override them.
    input_format: ClassVar[str] = "lines"
    output_format: ClassVar[str] = "text"
    sort_values: ClassVar[bool] = False  # values of each key reach reduce sorted
    total_order: ClassVar[bool] = False  # parts concatenate into one sorted sequence
    # value_order(value) -> sort key of the value, when sort_values (None: natural order).
    value_order: Any = None

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params: dict[str, str] = dict(params or {})

    def setup(self) -> None:
        """Called once in each worker process before its first task of this job (open
        files, compile patterns, read ``self.params``).

        The instance's lifetime: one per job in each worker process. It serves every task of
        the job that the process runs, one after another, so what ``setup`` makes is shared
        by them, and so is anything a task leaves on ``self``. State of one task belongs in
        the step's hooks: reset it in ``map_init`` (``reduce_init``) and yield it in
        ``map_final`` (``reduce_final``); kept from ``__init__`` or ``setup`` and yielded in
        a final hook, it would be yielded again by the next task in the same process. (An
        mrjob job runs as mrjob runs it: a fresh instance for every task; see ``for_task``.)"""

    def for_task(self) -> Job:
        """The instance one task runs on: this one (see ``setup``). A framework whose jobs
        get an instance per task (mrjob, Hadoop Streaming) returns a fresh one made like
        this one; the engine calls it at the start of every map and reduce task."""
        return self

    def _cmr_map_task(self, step: int, first: str) -> None:
        """The engine's word that a map task of ``step`` starts, ``first`` the name of the
        input it reads first; before any of its code runs. For a framework that tells a task
        its input file (mrjob's ``mapreduce.map.input.file``); nothing here."""

    def map(self, key: str, value: str) -> Iterable[Pair]:
        """One input record: key is the input's name, value one line (UTF-8, errors
        replaced, without its ``\\n``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define map()")

    def map_chunk(self, source: str, data: bytes) -> Iterable[Pair]:
        """All records of a split at once: ``data`` is whole lines of ``source``. Override it
        for speed when per-line calls dominate; it must yield what ``map`` would."""
        # Decoded whole, then split: the same lines as decoding each (b"\n" never occurs
        # inside a UTF-8 sequence, and an invalid one ends at it either way), one call.
        map_line = self.map
        for line in data.decode("utf-8", "replace").split("\n"):
            yield from map_line(source, line)

    # ``combine`` is optional: a job without it is not combined. It must be associative
    # and commutative over values, and yield pairs with the same key.
    combine: Any = None

    def reduce(self, key: Any, values: Iterator[Any]) -> Iterable[Pair]:
        raise NotImplementedError(f"{type(self).__name__} does not define reduce()")

    def steps(self) -> Sequence[Step]:
        """The job's steps, run in order by one submission, each step's output feeding the
        next (a pipeline). Default: one step of this class's map, combine and reduce."""
        cls = type(self)
        custom_chunk = cls.map_chunk is not Job.map_chunk
        return [
            Step(
                map=self.map if cls.map is not Job.map else None,
                combine=self.combine,
                reduce=self.reduce,
                map_chunk=self.map_chunk if custom_chunk or cls.map is not Job.map else None,
            )
        ]

    def progress(self, **counters: int) -> None:
        """Add to live counters of the job (``cmr status``, progress displays), e.g.
        ``self.progress(ops=500, errors=2)``. For watching only; never for decisions."""
        from cmr import taskprogress

        taskprogress.report(**counters)

    def partition(self, key: Any, partitions: int) -> int:
        """Which reducer gets ``key``: stable across processes and machines."""
        return stable_partition(key, partitions)

    def format(self, key: Any, value: Any) -> str:
        """One output line (without the newline)."""
        return f"{_text(key)}\t{_text(value)}"

    # Side files (cmr.sidefiles), shipped with the job: paths relative to the job file's
    # directory, or absolute; ``cmr run --file PATH[#NAME]`` adds more. Name: the base name.
    files: ClassVar[Sequence[str]] = ()

    def file(self, name: str) -> str:
        """The local path of the side file ``name`` on this worker (in ``setup`` too)."""
        return sidefiles.path_in(self, name)

    def increment_counter(self, group: str, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``group``/``name`` (mrjob's): summed exactly once per
        winning task attempt into the job's ``counters``, shown by ``cmr status``."""
        counters.increment(group, name, n)

    def set_status(self, msg: str) -> None:
        """The task's status line (mrjob's), logged by the worker: for people, never decisions."""
        counters.set_status(msg)


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if type(x) is int:  # not bool (json: true/false); str(int) is its JSON text, ~10x faster
        return str(x)
    if isinstance(x, bytes):
        # Strict: bytes that are not UTF-8 would print as U+FFFD, and distinct keys alike.
        return x.decode("utf-8")
    if isinstance(x, tuple):
        x = list(x)
    return json.dumps(x, ensure_ascii=False, default=formats.json_default)


@dataclass(frozen=True)
class JobRef:
    """Where a worker finds the job class: ``path/to/file.py[:Class]`` or
    ``package.module[:Class]``, plus the sha256 of the source the client saw."""

    target: str
    digest: str

    @staticmethod
    def parse(spec: str) -> JobRef:
        target = spec
        src = _source_path(target)
        return JobRef(target, hashlib.sha256(src.read_bytes()).hexdigest())

    def path(self) -> Path:
        """The file this reference names (resolved from the path, nothing imported)."""
        return _source_path(self.target)


def _split(target: str) -> tuple[str, str | None]:
    # "C:\\x.py" style drive letters do not occur on our platforms; the last colon wins.
    head, sep, tail = target.rpartition(":")
    if sep and tail.isidentifier() and not tail.endswith(".py"):
        return head, tail
    return target, None


def _source_path(target: str) -> Path:
    where, _ = _split(target)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise JobCodeError(f"job file {where} does not exist")
        return path
    return module_source(where)


def module_source(name: str) -> Path:
    """The source file of module ``name``, found without importing anything.

    ``importlib.util.find_spec("a.b")`` imports ``a`` to find ``b``, which would run a
    package's code before the worker has checked the job's digest or whether it may run it at
    all; here each level is looked up on the path its parent *would* have."""
    parts = name.split(".")
    if not is_module_name(name):
        raise JobCodeError(f"job {name!r} is neither a .py file nor a dotted module name")
    path: list[str] | None = None  # sys.path for the top level
    spec = None
    for i in range(len(parts)):
        qualified = ".".join(parts[: i + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(qualified, path)
        except (ImportError, ValueError, OSError) as exc:
            raise JobCodeError(f"cannot find job module {name}: {exc}") from None
        if spec is None:
            raise JobCodeError(
                f"job {name!r} is neither a .py file nor an importable module "
                f"({qualified} not found)"
            )
        if i < len(parts) - 1:
            if spec.submodule_search_locations is None:
                raise JobCodeError(f"cannot find job module {name}: {qualified} is not a package")
            path = list(spec.submodule_search_locations)
    if spec is None or not spec.has_location or spec.origin is None:
        raise JobCodeError(f"job module {name} has no source file")
    return Path(spec.origin)


def location(target: str) -> str:
    """The file or module a job target names, without its ``:Class``."""
    return _split(target)[0]


def is_module_name(name: str) -> bool:
    """A dotted module name (``pkg.mod``), of bounded length."""
    return bool(name) and len(name) <= 200 and all(p.isidentifier() for p in name.split("."))


_loaded: dict[JobRef, type[Job]] = {}


def load_job_class(ref: JobRef) -> type[Job]:
    """Import the job class named by ref, refusing if the source differs from the client's."""
    if ref in _loaded:
        return _loaded[ref]
    src = _source_path(ref.target)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    if digest != ref.digest:
        raise JobCodeError(
            f"this worker's {src} differs from the submitted job's (sha256 {digest[:12]} "
            f"vs {ref.digest[:12]}): install the same version on every worker"
        )
    where, cls_name = _split(ref.target)
    try:
        if where.endswith(".py"):
            name = f"cmr_job_{ref.digest[:16]}"
            spec = importlib.util.spec_from_file_location(name, src)
            if spec is None or spec.loader is None:
                raise JobCodeError(f"cannot load {src}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except JobCodeError:
        raise
    except Exception as exc:
        raise JobCodeError(f"importing {src} failed: {type(exc).__name__}: {exc}") from exc
    candidates = _defined_in(module, Job)
    if not candidates:  # another framework's job (an mrjob job): run unmodified, if adapted
        candidates = _adapted_in(module, cls_name)
    if cls_name is not None and candidates and candidates[0].__name__ == cls_name:
        cls = candidates[0]
    elif cls_name is not None:
        found = getattr(module, cls_name, None)
        if not (isinstance(found, type) and issubclass(found, Job)):
            raise JobCodeError(f"{src} has no Job subclass named {cls_name}")
        cls = found
    elif len(candidates) == 1:
        cls = candidates[0]
    else:
        names = ", ".join(c.__name__ for c in candidates) or "none"
        raise JobCodeError(
            f"{src} must define exactly one cmr.Job subclass (found: {names}); "
            f"name one as {where}:ClassName"
        )
    check_job_class(cls)
    _loaded[ref] = cls
    return cls


def _defined_in(module: ModuleType, base: type) -> list[type]:
    """The subclasses of ``base`` that ``module`` defines (not those it imports)."""
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, base)
        and obj is not base
        and obj.__module__ == module.__name__
    ]


def _adapted_in(module: ModuleType, cls_name: str | None) -> list[type[Job]]:
    """The job class of another framework that ``module`` defines (or names ``cls_name``),
    adapted into a cmr.Job by the first installed adapter (:mod:`cmr.adapters`) whose
    framework the job's code imported; none when it defines none, or several unnamed (the
    caller's message lists the choices)."""
    for adapter in adapters.installed():
        base = adapter.job_base()
        if base is None:
            continue
        mine: list[type] = _defined_in(module, base) if cls_name is None else []
        found = getattr(module, cls_name, None) if cls_name is not None else None
        if isinstance(found, type) and issubclass(found, base) and found is not base:
            mine = [found]
        if len(mine) == 1:
            return [adapters.adapt(adapter, mine[0])]
    return []


LINE_ENDINGS = ("lf", "universal")


def check_job_class(cls: type[Job]) -> None:
    """Refuse a class that cannot run as a job, when it is loaded (at submit, on the client)
    rather than when its first task fails."""
    name = cls.__name__
    has_map = cls.map is not Job.map or cls.map_chunk is not Job.map_chunk
    missing = [
        what
        for what, ok in (("map()", has_map), ("reduce()", cls.reduce is not Job.reduce))
        if not ok
    ]
    if missing and cls.steps is Job.steps:
        raise JobCodeError(
            f"{name} defines no {' and no '.join(missing)}: a job needs map (or map_chunk) "
            "and reduce"
        )
    if cls.lines not in LINE_ENDINGS:
        raise JobCodeError(
            f"{name}.lines is {cls.lines!r}: it must be one of {', '.join(map(repr, LINE_ENDINGS))}"
        )
    check_formats(cls)
    reducers = cls.reducers
    if type(reducers) is not int or not 1 <= reducers <= MAX_PARTITIONS:
        raise JobCodeError(
            f"{name}.reducers is {reducers!r}: it must be an int from 1 to {MAX_PARTITIONS:,} "
            "(the default partition count; --reducers overrides it)"
        )
    try:
        inspect.signature(cls).bind({})
    except TypeError:
        raise JobCodeError(
            f"{name}.__init__ must accept the job's params (a dict), as cmr.Job's does: "
            f"`def __init__(self, params=None): super().__init__(params)`"
        ) from None
    except ValueError:
        pass  # no signature to read (a C type): the first task says it
    if cls.combine is not None and not callable(cls.combine):
        raise JobCodeError(f"{name}.combine is {cls.combine!r}: it must be a method, or None")
    for flag in ("sort_values", "total_order"):
        if type(getattr(cls, flag)) is not bool:
            raise JobCodeError(f"{name}.{flag} is {getattr(cls, flag)!r}: it must be True or False")
    if cls.value_order is not None and not callable(cls.value_order):
        raise JobCodeError(
            f"{name}.value_order is {cls.value_order!r}: it must be a method "
            "`def value_order(self, value)` returning the value's sort key, or None"
        )


def steps_of(job: Job) -> list[Step]:
    """The job's steps, checked: what a worker runs as step k is ``steps_of(job)[k]``.
    JobCodeError, naming the job, when ``steps()`` does not return a usable list."""
    name = type(job).__name__
    try:
        steps = list(job.steps())
    except JobCodeError:
        raise
    except TypeError as exc:
        raise JobCodeError(f"{name}.steps() must return a list of cmr.Step: {exc}") from None
    if not 1 <= len(steps) <= MAX_STEPS:
        raise JobCodeError(
            f"{name}.steps() returned {len(steps)} steps: a job has from 1 to {MAX_STEPS}"
        )
    for i, step in enumerate(steps, 1):
        if not isinstance(step, Step):
            raise JobCodeError(f"{name}.steps() item {i} is {a_type(step)}, not a cmr.Step")
        for what in (
            "map",
            "combine",
            "reduce",
            "map_init",
            "map_final",
            "combine_init",
            "combine_final",
            "reduce_init",
            "reduce_final",
            "value_order",
            "map_chunk",
        ):
            fn = getattr(step, what)
            if fn is not None and not callable(fn):
                raise JobCodeError(f"{name}.steps() step {i}: {what} is {fn!r}, not callable")
        r = step.reducers
        if r is not None and (type(r) is not int or not 1 <= r <= MAX_PARTITIONS):
            raise JobCodeError(
                f"{name}.steps() step {i}: reducers is {r!r}; it must be an int from 1 to "
                f"{MAX_PARTITIONS:,}, or None for the job's"
            )
    return steps


def check_formats(cls: type[Job], input_format: str = "") -> None:
    """The class's formats name formats, and a job reading records other than lines
    defines ``map`` (``map_chunk`` sees lines only). ``input_format``: a submission's."""
    name = cls.__name__
    try:
        fmt = formats.parse_input(input_format or cls.input_format)
    except formats.FormatError as exc:
        raise JobCodeError(f"{name}.input_format: {exc}") from None
    try:
        formats.check_output(cls.output_format)
    except formats.FormatError as exc:
        raise JobCodeError(f"{name}.output_format: {exc}") from None
    if fmt.name != "lines" and cls.map is Job.map and cls.steps is Job.steps:
        raise JobCodeError(
            f"{name} defines map_chunk only, but reads input format {fmt}: its records reach "
            "map(key, value); define map"
        )
