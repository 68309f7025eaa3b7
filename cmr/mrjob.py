"""Run an mrjob job (a file defining an ``mrjob.job.MRJob`` subclass) unmodified on cmr.

This module plugs into the engine through its seam for other frameworks (:mod:`cmr.adapters`;
the engine never imports it by name): pyproject.toml names ``adapter`` as the entry point
``mrjob`` of the group ``cmr.adapters``. ``cmr.job.load_job_class`` hands a module that
defines no ``cmr.Job`` but one ``MRJob`` subclass to ``adapt``, which returns a ``cmr.Job``
subclass whose ``steps()`` are the MRJob's ``MRStep``s. mrjob itself is an optional extra
(``pip install cmr[mrjob]``): nothing here imports it before a job file has.

What travels between steps is what travels in Hadoop Streaming, which mrjob was written for:
each pair is a line its protocol wrote (``pick_protocols``: the job's INPUT, INTERNAL and
OUTPUT protocols, or its own choice), split at the first tab into the key (grouped and
partitioned by its bytes) and the rest (the tab and the value). So the mrjob code reads the
types its protocol gives (a tuple it yielded comes back a list under JSON), ``SORT_VALUES``
sorts a key's values by their encoded bytes as Hadoop does, and the last step writes the
OUTPUT protocol's lines as they are (output format ``raw``).

Refused when the job is loaded, each with one line: protocols that evaluate code (pickle,
repr: data, never code, on the wire), and what needs Hadoop or Spark (jar and Spark steps,
``*_cmd`` and ``*_pre_filter`` shell commands, Hadoop input/output formats, partitioners,
libjars, archives and dirs, jobconf other than the reducer count).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cmr import sidefiles
from cmr.errors import JobCodeError, UsageError
from cmr.job import Job, Pair

if TYPE_CHECKING:
    from cmr.job import Step

# The job's argv (after ``cmr run ... --``), a JSON list: each item a str, or a file arg's
# value as [its path on the client, its side file's name on a worker] (see MRJobAdapter.made).
ARGS_PARAM = "mrjob.args"
INPUT_PARAM = "mrjob.input"  # [the input's URI, whether it is one file] (input_param)
MAX_ARGS = 1000

# Protocols whose read evaluates its input: pickle runs code, repr goes through eval.
CODE_PROTOCOLS = ("PickleProtocol", "PickleValueProtocol", "ReprProtocol", "ReprValueProtocol")

# MRStep's shell-command fields: they need Hadoop Streaming's subprocess plumbing.
SHELL_FIELDS = (
    "mapper_cmd",
    "mapper_pre_filter",
    "combiner_cmd",
    "combiner_pre_filter",
    "reducer_cmd",
    "reducer_pre_filter",
)
# Jobconf that says how many reducers a step has: the one Hadoop setting cmr honours.
REDUCES_CONF = ("mapreduce.job.reduces", "mapred.reduce.tasks")

# Environment variables mrjob.compat.jobconf_from_env reads for the map task's input file
# ("mapreduce.map.input.file", and its Hadoop 1 name "map.input.file").
INPUT_FILE_ENV = ("mapreduce_map_input_file", "map_input_file")


def _mrjob_base() -> type | None:
    """mrjob.job.MRJob if the job's code imported it (never imported here first)."""
    module = sys.modules.get("mrjob.job")
    found = getattr(module, "MRJob", None)
    return found if isinstance(found, type) else None


def adapt(mr_cls: type) -> type[Job]:
    """A cmr.Job subclass that runs the MRJob subclass ``mr_cls``'s steps."""
    probe = _probe(mr_cls)
    if probe is not None:
        files: tuple[str, ...] = tuple(probe.files())  # absolute, "#name" kept
        raw = any(_field(s, "mapper_raw") for s in probe.steps()[:1])
    else:  # it needs arguments to be made, or to say its steps: what its class says
        files = tuple(getattr(mr_cls, "FILES", ()) or ())
        raw = getattr(mr_cls, "mapper_raw", None) is not getattr(_mrjob_base(), "mapper_raw", 0)
    ns = {
        "__module__": mr_cls.__module__,
        "__qualname__": mr_cls.__qualname__,
        "__doc__": mr_cls.__doc__,
        "mrjob_class": mr_cls,
        "files": files,
        "input_format": "whole" if raw else "lines",
        "output_format": "raw",
    }
    return type(mr_cls.__name__, (MRJobAdapter,), ns)


def _probe(mr_cls: type) -> Any:
    """An instance made with no arguments (what FILES and steps() say), or None when the
    job needs arguments to be made (a required passthru arg) or to say its steps."""
    try:
        probe = mr_cls([])
        # steps() may need the arguments too (a step chosen by them): the run's instance,
        # made with them, says its steps or fails with a line naming the job.
        probe.steps()
    except Exception:
        return None
    return probe


def _field(step: Any, name: str) -> Any:
    """What the MRStep was given for ``name`` (None: nothing; ``step[name]`` would give
    mrjob's identity mapper or reducer instead)."""
    given = getattr(step, "_steps", None)
    return given.get(name) if isinstance(given, dict) else None


def _has(step: Any, kind: str) -> bool:
    """Whether the step runs a Python ``kind`` (mapper, combiner, reducer) task: one of its
    functions or hooks is given (mrjob fills in the identity function then)."""
    return bool(getattr(step, f"has_explicit_{kind}", False))


def _argv(params: dict[str, str], name: str, on_worker: bool) -> list[str]:
    """The job's argv from its params (a stranger's data on a worker: checked): a file arg's
    value is its path on the client, its side file's name on a worker."""
    text = params.get(ARGS_PARAM)
    if text is None:
        return []
    try:
        args = json.loads(text)
    except ValueError:
        args = None

    def item(a: Any) -> str | None:
        if isinstance(a, str):
            return a
        if isinstance(a, list) and len(a) == 2 and all(isinstance(x, str) for x in a):
            return str(a[1] if on_worker else a[0])
        return None

    got = [item(a) for a in args] if isinstance(args, list) and len(args) <= MAX_ARGS else None
    if got is None or any(a is None for a in got):
        raise JobCodeError(
            f"{name}: param {ARGS_PARAM} must be a JSON list of strings and [path, name] pairs"
        )
    return [a for a in got if a is not None]


class MRJobAdapter(Job):
    """A cmr job running an MRJob: made by ``adapt``; ``self.mr`` is the MRJob instance,
    made with the job's own argument parsing from the args given after ``cmr run ... --``."""

    mrjob_class: ClassVar[type]

    def __init__(self, params: dict[str, str] | None = None) -> None:
        super().__init__(params)
        # Made when first needed, where the job's code runs (a worker: among its side files).
        self._mr: Any = None
        self._steps: list[Step] | None = None
        self._wd: str | None = None

    @property
    def mr(self) -> Any:
        """The MRJob instance (see ``made``)."""
        if self._mr is None:
            self._mr = self.made()
        return self._mr

    def made(self) -> Any:
        """A new instance of the MRJob, made from the job's arguments as mrjob makes one: on
        the client with each file arg's path as given, on a worker in the side files'
        directory with the file's name there (a job may open it in ``load_args``)."""
        cls = self.mrjob_class
        name = cls.__name__
        on_worker = bool(sidefiles.serving())
        args = _argv(self.params, name, on_worker)
        self.enter()
        try:
            mr = cls(args)
        except Exception as exc:  # argparse's error, raised by MRJob(args=...) as ValueError
            # The hint only when none were given: given ones came after -- already.
            given = " ".join(args) or "(no arguments)"
            hint = "" if args else " (give the job's arguments after --: cmr run JOB ... -- ARGS)"
            raise JobCodeError(f"{name} {given}: {exc}{hint}") from None
        # Counters and status go to cmr's, with mrjob's own checks and comma rule.
        mr.increment_counter = self._increment_counter
        mr.set_status = lambda msg: self.set_status(str(msg))
        return mr

    def for_task(self) -> MRJobAdapter:
        """Under mrjob (and Hadoop Streaming, one process per task) an MRJob instance lives
        for one task: what ``__init__`` or ``mapper_init`` puts on ``self`` and
        ``mapper_final`` yields is that task's alone. So every map and reduce task gets a
        fresh MRJob here (and its combiner another: mrjob runs the combiner as a task of its
        own), never the one an earlier task of the same process ran on."""
        fresh = copy.copy(self)  # params and line endings: the job's
        fresh._mr, fresh._steps = None, None  # made anew when the task asks its steps
        return fresh

    def _cmr_map_task(self, step: int, first: str) -> None:
        """A map task starts: under Hadoop it reads one split of one file, whose URI its
        mapper_init (and the job's __init__) see; cmr packs small files into one task, so
        they see its first file's, and map each file's as it moves on (``mapping``)."""
        if step == 0 and first:
            self.mapping(first)

    def mapping(self, source: str) -> None:
        """What jobconf_from_env('mapreduce.map.input.file') says while map reads ``source``."""
        uri = input_uri(self.params, source)
        for var in INPUT_FILE_ENV:
            os.environ[var] = uri

    def _increment_counter(self, group: Any, counter: Any, amount: int = 1) -> None:
        if not isinstance(amount, int):
            raise TypeError(f"amount must be an integer, not {amount!r}")
        # mrjob replaces commas (Hadoop Streaming's separator): the same names as mrjob's.
        group = str(group).replace(",", ";")
        counter = str(counter).replace(",", ";")
        self.increment_counter(group, counter, amount)

    def steps(self) -> Sequence[Step]:
        if self._steps is None:
            self._steps = _steps_of(self)
        return self._steps

    def enter(self) -> None:
        """Make the side files' directory the working directory, as mrjob's runners do (a
        job opens its FILES and file args by bare name), before any of the job's code runs
        (its ``__init__`` and ``load_args`` too). On the client, none: paths are as given."""
        if self._wd is None:  # a job without side files stays where it is (cmr.testing's too)
            d = sidefiles.serving()
            self._wd = d if d and os.path.isdir(d) and os.listdir(d) else ""
        if self._wd and _cwd[0] != self._wd:
            os.chdir(self._wd)
            _cwd[0] = self._wd

    @classmethod
    def submission(cls, argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        """The params and extra side files (``PATH#NAME``) for running with ``argv`` (what
        was given after ``--``): file args ship their file, and the job sees its name."""
        name = cls.mrjob_class.__name__
        from mrjob.options import _parse_raw_args  # type: ignore[import-untyped]

        try:
            mr = cls.mrjob_class(list(argv))
        except Exception as exc:
            raise UsageError(f"{name} {' '.join(argv)}: {exc}") from None
        files: list[str] = []
        out: list[str | list[str]] = []
        for dest, option, values in _parse_raw_args(mr.arg_parser, list(argv)):
            if option is None and not values:
                continue  # the input paths' positional, given none
            if dest in mr._file_arg_dests:
                path = values[0]
                files.append(path if "#" in path else f"{path}#{_file_name(path)}")
                # The client makes the job from the path, a worker from the name (mrjob's
                # runners do the same): load_args may open it on both.
                out += [option, [os.path.abspath(path.partition("#")[0]), _file_name(path)]]
            elif dest in mr._passthru_arg_dests:
                out += ([option] if option else []) + list(values)
            else:
                what = option or " ".join(values)
                raise UsageError(
                    f"{name}: {what} is an option of mrjob's runners, not of the job: cmr runs "
                    "the job itself (inputs: --input; give only the job's own arguments after --)"
                )
        return {ARGS_PARAM: json.dumps(out)}, files


_cwd = [""]  # the directory enter() last made the working directory in this process


def _file_name(path: str) -> str:
    head, sep, tail = path.partition("#")
    return tail if sep and tail else os.path.basename(head.rstrip("/"))


def _refuse_protocol(name: str, where: str, fn: Any) -> None:
    proto = getattr(fn, "__self__", None)
    for klass in type(proto).__mro__ if proto is not None else ():
        if klass.__name__ in CODE_PROTOCOLS and klass.__module__ == "mrjob.protocol":
            raise JobCodeError(
                f"{name} uses {type(proto).__name__} for {where}: it evaluates the data it "
                "reads (pickle or eval), and cmr puts data, never code, on the wire; use "
                "JSONProtocol (the default), JSONValueProtocol, RawProtocol or RawValueProtocol"
            )


def _check_job(a: MRJobAdapter) -> None:
    """Refuse what needs Hadoop or Spark, naming it."""
    mr, name = a.mr, a.mrjob_class.__name__
    needs = [
        ("HADOOP_INPUT_FORMAT", mr.hadoop_input_format()),
        ("HADOOP_OUTPUT_FORMAT", mr.hadoop_output_format()),
        ("PARTITIONER", mr.partitioner()),
        ("LIBJARS", mr.libjars()),
        ("ARCHIVES", mr.archives()),
        ("DIRS", mr.dirs()),
    ]
    for what, value in needs:
        if value:
            raise JobCodeError(
                f"{name} sets {what} ({value!r}): that needs Hadoop; cmr runs the job's "
                "Python steps only"
            )
    _reducers(mr.jobconf(), name)


def _reducers(conf: dict[str, Any] | None, name: str) -> int | None:
    found = None
    for key, value in (conf or {}).items():
        if key not in REDUCES_CONF:
            raise JobCodeError(
                f"{name} sets jobconf {key!r}: Hadoop settings need Hadoop; cmr honours "
                f"only {' and '.join(REDUCES_CONF)}"
            )
        try:
            found = int(value)
        except (TypeError, ValueError):
            raise JobCodeError(f"{name}: jobconf {key} is {value!r}, not a number") from None
    return found


def _steps_of(a: MRJobAdapter) -> list[Step]:
    mr, name = a.mr, a.mrjob_class.__name__
    _check_job(a)
    from mrjob.step import MRStep  # type: ignore[import-untyped]

    try:
        mr_steps = list(mr.steps())
    except Exception as exc:  # the job's steps() (or MRStep's checks of what it was given)
        raise JobCodeError(f"{name}.steps() raised {type(exc).__name__}: {exc}") from None
    # The combiner's own instance (see MRJobAdapter.for_task), made only for a job that has one.
    combiner_steps = (
        list(a.made().steps()) if any(_has(s, "combiner") for s in mr_steps) else mr_steps
    )
    if not mr_steps:
        raise JobCodeError(f"{name} has no steps: define mapper, reducer or steps()")
    out = []
    for i, step in enumerate(mr_steps):
        where = f"{name} step {i + 1}"
        if not isinstance(step, MRStep):
            kind = type(step).__name__
            tool = "Spark" if "Spark" in kind else "Hadoop"
            raise JobCodeError(
                f"{where} is a {kind}: that needs {tool}; cmr runs MRSteps (mapper, combiner, "
                "reducer) only"
            )
        for field in SHELL_FIELDS:
            if _field(step, field):
                raise JobCodeError(
                    f"{where} uses {field} (a shell command): that needs Hadoop Streaming; "
                    "cmr runs the job's Python mapper, combiner and reducer only"
                )
        for kind in ("mapper", "combiner", "reducer"):
            if not _has(step, kind):
                continue  # mrjob picks no protocol for a task the step does not have
            for fn in mr.pick_protocols(i, kind):
                _refuse_protocol(name, f"step {i + 1}'s {kind}", fn)
        if i == 0 and a.input_format == "whole" and not _field(step, "mapper_raw"):
            raise JobCodeError(
                f"{where}: with these arguments it has no mapper_raw, but its class does: cmr "
                "decides the input format when it loads the job"
            )
        if _field(step, "mapper_raw") and (i > 0 or a.input_format != "whole"):
            raise JobCodeError(f"{where}: mapper_raw is for the first step only")
        out.append(_step(a, i, step, combiner_steps[i], last=i == len(mr_steps) - 1))
    return out


def _split(line: bytes) -> Pair:
    """A protocol's line as Hadoop Streaming shuffles it: the key is the bytes before the
    first tab; the rest (tab included, b"" when there is none) keeps the line exact."""
    tab = line.find(b"\t")
    return (line, b"") if tab < 0 else (line[:tab], line[tab:])


def _step(a: MRJobAdapter, i: int, s: Any, cs: Any, last: bool) -> Step:
    """Step ``i`` of the MRJob: ``s`` as the mapper's and reducer's instance made it, ``cs``
    as the combiner's."""
    from cmr.job import Step

    mr = a.mr
    of = {"mapper": s, "combiner": cs, "reducer": s}

    def encoder(kind: str) -> Callable[[Iterable[Pair] | None], Iterator[Pair]]:
        write = mr.pick_protocols(i, kind)[1]
        final = last and (kind == "reducer" or (kind == "mapper" and not _has(s, "reducer")))
        if final:  # the job's output: the OUTPUT protocol's lines, as they are

            def out(pairs: Iterable[Pair] | None) -> Iterator[Pair]:
                for k, v in pairs or ():
                    yield write(k, v) + b"\n", None

            return out

        def shuffled(pairs: Iterable[Pair] | None) -> Iterator[Pair]:
            for k, v in pairs or ():
                yield _split(write(k, v))

        return shuffled

    def grouped(kind: str) -> Callable[[Any, Iterator[Any]], Iterable[Pair]]:
        fn, read, encode = of[kind][kind], mr.pick_protocols(i, kind)[0], encoder(kind)

        def call(key: bytes, tails: Iterator[bytes]) -> Iterator[Pair]:
            a.enter()
            first = next(tails)
            k, v = read(key + first)

            def values() -> Iterator[Any]:
                yield v
                for tail in tails:
                    yield read(key + tail)[1]

            yield from encode(fn(k, values()))

        return call

    def hooks(kind: str) -> tuple[Callable[[], None] | None, Callable[[], Iterable[Pair]] | None]:
        init, final = _field(of[kind], kind + "_init"), _field(of[kind], kind + "_final")
        if init is None and final is None:
            return None, None
        encode = encoder(kind)
        pending: list[Pair] = []

        def on_init() -> None:
            a.enter()
            pending.clear()
            if init is not None:  # mrjob lets init yield pairs too: sent with final's
                pending.extend(encode(init()))

        def on_final() -> Iterator[Pair]:
            a.enter()
            yield from pending
            pending.clear()
            if final is not None:
                yield from encode(final())

        return on_init, on_final

    mapper = s["mapper"] if _has(s, "mapper") else None  # mrjob's identity if only hooks
    raw = _field(s, "mapper_raw")
    if mapper is not None:
        m_read = mr.pick_protocols(i, "mapper")[0]
        m_encode = encoder("mapper")
    map_fn: Callable[[Any, Any], Iterable[Pair]] | None = None
    chunk_fn: Callable[[str, bytes], Iterable[Pair]] | None = None
    if raw:

        def map_raw(source: str, data: bytes) -> Iterator[Pair]:
            a.enter()
            a.mapping(source)
            with tempfile.TemporaryDirectory(prefix="cmr-mrjob-") as tmp:
                path = Path(tmp, os.path.basename(source.rstrip("/")) or "input")
                path.write_bytes(data)
                yield from m_encode(raw(str(path), source))

        map_fn = map_raw
    elif i == 0:
        # Input lines, as mrjob reads them: bytes without "\r\n", decoded by the INPUT
        # protocol; with no mapper they go on as they are (Hadoop's identity mapper).
        def map_lines(source: str, data: bytes) -> Iterator[Pair]:
            a.enter()
            a.mapping(source)
            for given in data.split(b"\n"):
                line = given.rstrip(b"\r\n")
                if mapper is None:
                    yield _split(line)
                else:
                    yield from m_encode(mapper(*m_read(line)))

        chunk_fn = map_lines
    elif mapper is not None:

        def map_pairs(key: bytes, tail: bytes) -> Iterator[Pair]:
            a.enter()
            yield from m_encode(mapper(*m_read(key + tail)))

        map_fn = map_pairs
    map_init, map_final = hooks("mapper")
    combine_init, combine_final = hooks("combiner")
    reduce_init, reduce_final = hooks("reducer")
    return Step(
        map=map_fn,
        map_chunk=chunk_fn,
        combine=grouped("combiner") if _has(s, "combiner") else None,
        reduce=grouped("reducer") if _has(s, "reducer") else None,
        map_init=map_init,
        map_final=map_final,
        combine_init=combine_init,
        combine_final=combine_final,
        reduce_init=reduce_init,
        reduce_final=reduce_final,
        reducers=_reducers(_field(s, "jobconf"), a.mrjob_class.__name__)
        or _reducers(mr.jobconf(), a.mrjob_class.__name__),
        # Hadoop sorts a key's values by their encoded bytes: the natural order of the
        # bytes each value travels as (the tab and the value's encoding).
        sort_values=bool(mr.sort_values()),
        value_order=None,
    )


def input_uri(params: dict[str, str], source: str) -> str:
    """The URI of the input file map calls ``source`` (a name below the inputs' common
    directory, ``INPUT_PARAM``, which submit sets), as Hadoop gives it to a map task: each
    file's own, whatever input it came from."""
    try:
        given = json.loads(params.get(INPUT_PARAM, "null"))
    except ValueError:
        given = None
    if not (isinstance(given, list) and len(given) == 2 and isinstance(given[0], str)):
        return source
    root, is_file = given
    return root if is_file else f"{root if root.endswith('/') else root + '/'}{source}"


def input_param(base: str, one_file: bool) -> str:
    """``INPUT_PARAM``'s value: the directory map's names are below, or the one input file
    (``one_file``); a local path becomes a file:// URI, as mrjob's runners give it."""
    return json.dumps([base if "://" in base else "file://" + base, one_file])


class Adapter:
    """mrjob's adapter (:class:`cmr.adapters.JobAdapter`): the entry point ``mrjob`` of the
    group ``cmr.adapters`` names ``adapter``, this class's one instance."""

    def job_base(self) -> type | None:
        return _mrjob_base()

    def adapt(self, cls: type) -> type[Job]:
        return adapt(cls)

    def submission(self, cls: type[Job], argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        """The job's arguments, and the files its file args name; its input's URI is known
        once submit has listed the inputs (globs, prefixes): ``inputs_listed`` sets it."""
        assert issubclass(cls, MRJobAdapter), "cmr.adapters asks the adapter of its classes"
        params, files = cls.submission(argv)
        return {**params, INPUT_PARAM: ""}, files

    def inputs_listed(self, params: Mapping[str, str], root: str, one_file: bool) -> dict[str, str]:
        """With the URI map's names are below (``INPUT_PARAM``, mrjob's
        ``mapreduce.map.input.file``), for a job whose submission asked for it."""
        if INPUT_PARAM not in params:
            return dict(params)
        return {**params, INPUT_PARAM: input_param(root, one_file)}


adapter = Adapter()
