"""The import graph of ``cmr/``: no cycles, and an engine that imports neither a backend
implementation nor the mrjob compat layer.

The graph is read from the source with ``ast``, nothing imported: an edge for every
``import`` and ``from ... import`` of a cmr module, at module level and inside functions
alike (an import hidden in a function is still a cycle: it only moves the failure to the
first call). Two kinds of import are left out, each for a stated reason:

- imports under ``if TYPE_CHECKING:``: they never run (annotations only, as strings under
  ``from __future__ import annotations``); the ``else`` branch of such an ``if`` counts.
- a module's implicit import of its parent packages (``import cmr.cpu.mapping`` runs
  ``cmr/__init__.py`` and ``cmr/cpu/__init__.py`` first): Python initialises a package
  before its modules, whatever the package imports. An explicit ``from cmr import Job``
  is an edge to ``cmr`` like any other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "cmr"

# The fronts: they build a backend (or are one), so they may import its implementations.
# Every other module of cmr is the engine. cmr.mrjob is the compat layer: it imports the
# engine, which reaches it only through the cmr.adapters entry point.
FRONTS = (
    "cmr.backends",  # the backends themselves, their protocol and middleware
    "cmr.cli",  # the commands
    "cmr.api",  # cmr.run: picks and builds the backend
    "cmr.testing",  # cmr.testing.run: the embedded backend, in-process
    "cmr.fleet",  # deploys workers on AWS
    "cmr.loadgen",  # measures the services themselves
    "cmr.__main__",  # python -m cmr: the CLI
)
COMPAT = ("cmr.mrjob",)
# What no engine module may import: a backend's implementation, or the compat layer.
FORBIDDEN = ("cmr.backends.embedded", "cmr.backends.aws", *COMPAT)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    type_checking: bool  # under ``if TYPE_CHECKING:``


def modules(root: Path) -> dict[str, Path]:
    """Each module of the package at ``root``, by dotted name (a package by its own)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, guarded: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement in ``tree``, at any depth, and whether it is under ``if
    TYPE_CHECKING:`` (its ``else`` branch is not)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in node.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), guarded)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, guarded
        yield from _imports(node, guarded)


def edges(root: Path) -> list[Edge]:
    """The import graph of the package at ``root`` (see the module's text)."""
    mods = modules(root)

    def owner(name: str) -> str | None:
        # The module a dotted name lives in: itself, or the longest prefix that is one.
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, guarded in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            else:
                assert isinstance(node, ast.ImportFrom)
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                # ``from pkg import name``: the submodule pkg.name if it is one, else pkg.
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in mods else owner(module)
                    for a in node.names
                ]
            for target in targets:
                if target is not None and target != name:
                    out.append(Edge(name, target, node.lineno, guarded))
    return out


def cycles(graph: list[Edge]) -> list[tuple[set[str], list[Edge]]]:
    """Each strongly connected component of more than one module (modules that all reach
    each other), with a shortest cycle through its first module: the edges, in order."""
    succ: dict[str, list[Edge]] = {}
    for e in graph:
        succ.setdefault(e.source, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graph is ~150 modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in succ.get(v, []):
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted({e.source for e in graph} | {e.target for e in graph}):
        if v not in index:
            connect(v)
    found = []
    for component in components:
        start = min(component)
        inside = {v: [e for e in succ.get(v, []) if e.target in component] for v in component}
        if len(component) == 1 and not any(e.target == start for e in inside[start]):
            continue
        # A shortest way back to start, breadth first, from start's own edges.
        paths: dict[str, list[Edge]] = {start: []}
        frontier = [start]
        while frontier and not any(e.target == start for v in frontier for e in inside[v]):
            nxt = []
            for v in frontier:
                for e in inside[v]:
                    if e.target not in paths:
                        paths[e.target] = [*paths[v], e]
                        nxt.append(e.target)
            frontier = nxt
        last = next(e for v in frontier for e in inside[v] if e.target == start)
        found.append((component, [*paths[last.source], last]))
    return found


def runtime(graph: list[Edge]) -> list[Edge]:
    return [e for e in graph if not e.type_checking]


def _named(component: set[str], cycle: list[Edge]) -> str:
    named = " -> ".join(f"{e.source} (line {e.line})" for e in cycle) + f" -> {cycle[0].source}"
    others = sorted(component - {e.source for e in cycle})
    return named + (f"; in one cycle with these too: {', '.join(others)}" if others else "")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def engine(name: str) -> bool:
    return not _within(name, FRONTS + COMPAT)


def test_cmr_has_no_import_cycle() -> None:
    found = cycles(runtime(edges(ROOT)))
    assert not found, "import cycles in cmr (each: module (line of its import) -> ...):\n" + (
        "\n".join(_named(*c) for c in found)
    )


def test_the_engine_imports_no_backend_implementation_nor_the_compat_layer() -> None:
    # Imports under TYPE_CHECKING count here: an annotation naming EmbeddedBlobs is the
    # engine knowing the implementation all the same.
    graph = edges(ROOT)
    mods = modules(ROOT)
    assert any(engine(m) for m in mods) and any(not engine(m) for m in mods)
    wrong = sorted(
        {
            f"{e.source} imports {e.target} (line {e.line})"
            for e in graph
            if engine(e.source) and _within(e.target, FORBIDDEN)
        }
    )
    assert not wrong, "the engine must not import these (cmr.adapters is the seam):\n" + (
        "\n".join(wrong)
    )


def test_the_graph_holds_what_the_sources_import() -> None:
    """The graph the tests above read is the real one: ``from cmr import x`` of a
    submodule, an import inside a function, and one under TYPE_CHECKING (marked, and left
    out of the runtime graph)."""
    graph = edges(ROOT)
    pairs = {(e.source, e.target, e.type_checking) for e in graph}
    assert ("cmr.job", "cmr.formats", False) in pairs  # from cmr import ..., formats, ...
    assert ("cmr.job", "cmr.taskprogress", False) in pairs  # inside Job.progress
    assert ("cmr.sidefiles", "cmr.records", True) in pairs  # annotations only
    assert ("cmr.sidefiles", "cmr.records") not in {(e.source, e.target) for e in runtime(graph)}
    assert ("cmr.mrjob", "cmr.job", False) in pairs  # the compat layer imports the engine


@pytest.mark.parametrize("guard", ["TYPE_CHECKING", "typing.TYPE_CHECKING"])
def test_a_cycle_through_a_function_is_named_and_type_checking_is_not_one(
    tmp_path: Path, guard: str
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import A\n",  # the package's own: no cycle with pkg.a
        "a.py": "import typing\n\nclass A:\n    pass\n\ndef f():\n    from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "from .. import c\n",
        "c.py": "def g():\n    import pkg.a\n",
        # Only for annotations: d and a would be a cycle if it counted. Its else counts.
        "d.py": f"import typing\nif {guard}:\n    import pkg.a\nelse:\n    import pkg.e\n",
        "e.py": "from pkg import d\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    found = cycles(runtime(edges(pkg)))
    assert [_named(*c) for c in found] == [
        "pkg.a (line 7) -> pkg.sub.b (line 1) -> pkg.c (line 2) -> pkg.a",
        "pkg.d (line 5) -> pkg.e (line 1) -> pkg.d",
    ]


def test_a_component_names_all_its_modules(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "from pkg import a, c\n",
        "c.py": "def f():\n    from pkg import a\n",
    }.items():
        (pkg / name).write_text(text)
    assert [_named(*c) for c in cycles(runtime(edges(pkg)))] == [
        "pkg.a (line 1) -> pkg.b (line 1) -> pkg.a; in one cycle with these too: pkg.c"
    ]
