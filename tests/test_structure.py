"""The package's structure, read from its imports with ``ast`` (nothing is imported).

Every ``import`` counts: at the top of a module, inside a function (a lazy import) and under
``if TYPE_CHECKING:`` (a reader following the names still walks that arrow). The rooms stack in
the order of :data:`LAYERS` (``docs/design.md``, "The map"): a module may import from its own room
or from a room below it, never from one above; no modules import each other in a circle; and no
module is longer than :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "c2graph"

#: The rooms, from the bottom up: the first word of a module's dotted name below ``c2graph``
#: (``c2graph.graphs.graph`` is in ``graphs``); the package's own ``__init__`` is the top.
LAYERS = ("_runtime", "compressor", "graphs", "prefill", "measure", "pictures", "workshop",
          "dp", "__main__", "__init__")

MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = ["c2graph", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, wherever in the file the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from .x import y``: y is a module of its own where one of that name exists
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import c2graph.a.b`` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> int:
    room = name.split(".")[1] if "." in name else "__init__"
    if room not in LAYERS:
        raise AssertionError(f"{name} is in a room ({room!r}) that LAYERS does not place")
    return LAYERS.index(room)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_reader_finds_the_imports_it_should():
    """The reader itself: relative, lazy, type-only and ``from package import module`` imports."""
    graph = import_graph()
    assert "c2graph.compressor.batch" in graph["c2graph.compressor.torch_path"]
    assert "c2graph._runtime" in graph["c2graph"]
    assert graph["c2graph.compressor.arguments"] == set()
    assert len(graph) > 50


def test_no_circle():
    found = circles(import_graph())
    assert not found, "modules that import each other in a circle:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_arrow_back_up():
    up = [f"{a} (room {layer(a)}) imports {b} (room {layer(b)})"
          for a, targets in import_graph().items() for b in sorted(targets) if layer(b) > layer(a)]
    assert not up, f"imports against the order {' < '.join(LAYERS)}:\n" + "\n".join(up)


def test_the_graph_toolkit_stands_alone():
    """``graphs/`` is a general toolkit: it imports nothing of the package but itself and ``_runtime``."""
    graph = import_graph()
    outside = [f"{a} imports {b}" for a in sorted(graph) if a.startswith("c2graph.graphs")
               for b in sorted(graph[a]) if not b.startswith(("c2graph.graphs", "c2graph._runtime"))]
    assert not outside, "\n".join(outside)


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_over_max_lines(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; expected at most {MAX_LINES}"


@pytest.mark.parametrize("room", ["compressor", "graphs", "prefill", "measure", "pictures", "workshop"])
def test_a_rooms_page_names_each_of_its_modules(room):
    """The room's ``__init__`` docstring lists every module in it (``:mod:`.name```)."""
    folder = PACKAGE / room
    page = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    missing = [p.stem for p in sorted(folder.glob("*.py")) if p.stem != "__init__" and f":mod:`.{p.stem}`" not in page]
    assert not missing, f"c2graph.{room}'s page does not name {missing}"


MIRRORS = {"gate", "rms_norm", "rope", "ring_row", "main"}
"""Names two modules may both define: a torch-path step and the kernel stage that computes the same
thing (``torch_path`` / ``fused_math``, ``ring`` / ``fused_rows``), and the ``main`` of each command."""


def test_one_name_per_concept():
    """A public function or class is defined in one module only (``capture`` once stood in three,
    each for something else), but for the mirrors."""
    defined: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(name)
    twice = {n: where for n, where in defined.items() if len(where) > 1 and n not in MIRRORS}
    assert not twice, twice
    assert set(MIRRORS) <= set(defined), "a mirror no longer exists: take it off the list"


def test_a_circle_and_an_arrow_up_are_seen():
    """The checks fail where they should: a made-up circle and a made-up arrow back up."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("c2graph.graphs.graph") < layer("c2graph.measure.timing")
