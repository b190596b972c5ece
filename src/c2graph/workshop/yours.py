"""Notebook 03 runs the reader's own compressor: the ``my_*`` functions of their notebook 01.

:func:`load_yours` reads notebook 01 as last saved (the student copy the reader worked in, or
the full notebook), takes every top-level ``def my_*`` of its code cells, with the helpers they
call (the notebook's other top-level ``def``s, ``class``es and constants that they reach), and
keeps the reader's version of each, except where it must fall back to the reference version of
:mod:`c2graph.workshop.my_compressor`, and says so: a function still a stub, one that uses a name
notebook 01 does not define (named), an exercise whose check does not pass (with the check's first
failing line), or, for all of them, a ``my_compress`` that does not compute what the library's
torch path computes on a test batch (bitwise, from poisoned pools).
"""

from __future__ import annotations

import ast
import builtins
import linecache
import symtable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer, project
from ..compressor.torch_path import compress_torch
from ..measure.compare import compare_pools
from . import my_compressor
from .practice import practice_pools

NAMES = ("my_project", "my_previous_is_partner", "my_ring_read_rows", "my_pair", "my_gate", "my_rms_norm",
         "my_rope", "my_index_key", "my_store", "my_park", "my_park_mask", "my_compress")
"""Notebook 01's functions that notebook 03 uses, in the order 01 writes them."""
CHECKS = {"my_previous_is_partner": my_compressor.check_previous_is_partner,
          "my_ring_read_rows": my_compressor.check_ring_read_rows,
          "my_park_mask": my_compressor.check_park_mask}
"""01's exercises: a function of these is used only when its check passes."""
TEST_BATCHES = ([(1, 0, 5), (2, 0, 12)], [(0, 0, 7), (1, 5, 6), (2, 12, 3)])
"""The test of the assembled ``my_compress``: notebook 01's earlier and ragged batches (ring partners included)."""


@dataclass
class Yours:
    """What :func:`load_yours` found: ``functions`` (name -> the function 03 will run) and, for each
    name that falls back to the reference version, why."""

    notebook: str
    functions: dict = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        yours = [n for n in NAMES if n not in self.fallbacks]
        lines = [f"from {self.notebook}: yours: {', '.join(yours) if yours else 'none'}"]
        by_reason: dict[str, list[str]] = {}
        for name, why in self.fallbacks.items():
            by_reason.setdefault(why, []).append(name)
        lines += [f"the reference version of {', '.join(names)}: {why}" for why, names in by_reason.items()]
        return "\n".join(lines)

    __repr__ = __str__


def load_yours(notebook: str | Path) -> Yours:
    """The ``my_*`` functions of ``notebook`` (notebook 01's path), checked, with the reference
    version in place of each one that is not written, fails its check, or, for all of them, when the
    whole ``my_compress`` differs from the torch path."""
    path = Path(notebook)
    result = Yours(path.name)
    reference = {name: getattr(my_compressor, name) for name in NAMES}
    if not path.is_file():
        result.functions = reference
        result.fallbacks = {name: f"{path} was not found next to this notebook" for name in NAMES}
        return result
    imports, found, helpers = _definitions(nbformat.read(path, as_version=4))
    try:
        needed, reached = _helpers_of(found, helpers)
        namespace = _run(imports, {**needed, **found}, f"<{path.name}: your functions>")
    except Exception as e:  # the reader's cells fail as they are defined: say so, never raise
        result.functions = reference
        why = f"defining your functions raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        result.fallbacks = {name: why for name in NAMES}
        return result
    for name, used in reached.items():
        missing = sorted(n for n in used if n not in namespace and not hasattr(builtins, n))
        if missing:
            result.fallbacks[name] = (f"it uses {', '.join(f'`{n}`' for n in missing)}, which notebook 01 does not "
                                      "define at the top level of a code cell (a `def`, a `class`, an import or a "
                                      "constant); define it there, then save notebook 01")
    for name in NAMES:
        if name not in found:
            result.fallbacks[name] = "not defined in notebook 01"
        elif name in result.fallbacks:
            continue
        elif _is_stub(found[name]):
            result.fallbacks[name] = "not written yet (still the stub)"
    namespace.update({name: reference[name] for name in result.fallbacks})
    for name, check in CHECKS.items():
        verdict = check(namespace[name]) if name not in result.fallbacks else None
        if verdict is not None and not verdict.ok:
            failed = next((line for line in verdict.lines if not line.startswith("pass")), "")
            result.fallbacks[name] = f"its check ({check.__name__}) does not pass yet: {failed}"
            namespace[name] = reference[name]
    differs = _differs_from_the_torch_path(namespace["my_compress"])
    if differs:
        result.fallbacks = {name: f"your my_compress differs from the torch path ({differs})" for name in NAMES}
        namespace.update(reference)
    result.functions = {name: namespace[name] for name in NAMES}
    return result


def _definitions(nb) -> tuple[list[ast.stmt], dict[str, ast.FunctionDef], dict[str, ast.stmt]]:
    """The notebook's top-level imports; the last top-level ``def`` of each name of :data:`NAMES` in
    its code cells; and every other last top-level ``def``, ``class`` and constant (a name assigned a
    literal, such as ``RING = 2``), the helpers those may call (IPython's ``%`` and ``!`` lines left
    out; a cell that is not Python is skipped)."""
    imports, found, helpers = [], {}, {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            body = ast.parse(text).body
        except SyntaxError:
            continue
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(node)
            elif isinstance(node, ast.FunctionDef) and node.name in NAMES:
                found[node.name] = node
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                helpers[node.name] = node
            elif isinstance(node, ast.Assign) and _is_literal(node.value):
                helpers.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return imports, found, helpers


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _globals_used(node: ast.stmt) -> set[str]:
    """The global names a definition reads (its nested functions, lambdas and comprehensions included)."""
    table, names, stack = symtable.symtable(ast.unparse(node), "<definition>", "exec"), set(), []
    stack += table.get_children()
    while stack:
        child = stack.pop()
        stack += child.get_children()
        names |= {s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()}
    # a decorator, a default value or a base class is read where the definition runs
    names |= {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    return names - {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else names


def _helpers_of(found: dict[str, ast.FunctionDef],
                helpers: dict[str, ast.stmt]) -> tuple[dict[str, ast.stmt], dict[str, set[str]]]:
    """The helpers the reader's functions reach (calls of calls included), and, for each function of
    :data:`NAMES`, every global name it reaches that no helper defines (an import, a builtin, another
    ``my_*`` function, or a name defined nowhere: what it would raise ``NameError`` on)."""
    needed: dict[str, ast.stmt] = {}
    reached: dict[str, set[str]] = {}
    for name, node in found.items():
        todo, seen = [node], set()
        while todo:
            for used in _globals_used(todo.pop()) - seen:
                seen.add(used)
                if used in helpers:
                    needed[used] = helpers[used]
                    todo.append(helpers[used])
        reached[name] = seen - set(helpers)
    return needed, reached


def _run(imports: list[ast.stmt], found: dict[str, ast.stmt], filename: str) -> dict:
    """Run the imports, then the constants, then define the functions and classes in one namespace,
    their source kept for ``inspect``."""
    head = "\n".join(["import torch"] + [ast.unparse(node) for node in imports])
    nodes = list({id(node): node for node in found.values()}.values())  # `A = B = 1` once
    nodes.sort(key=lambda node: not isinstance(node, ast.Assign))
    source = head + "\n\n\n" + "\n\n\n".join(ast.unparse(node) for node in nodes) + "\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict = {"__name__": "notebook_01"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _is_stub(node: ast.FunctionDef) -> bool:
    """The body, after its docstring, is only ``raise NotImplementedError(...)``."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    return (len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None
            and "NotImplementedError" in ast.unparse(body[0].exc))


def _differs_from_the_torch_path(compress) -> str | None:
    """Run ``compress`` and the torch path on :data:`TEST_BATCHES` from poisoned pools; ``None`` when
    both caches and the ring are bitwise equal (c2 slot 0 aside), else what differs, in words."""
    cfg = Config.tiny()
    layer = SourceLayer(cfg, seed=0, use_fused_gate=False)
    alloc = ReqToTokenPool(cfg, pool_requests=6, max_seq_len=64, seed=0)
    mine, want = practice_pools(cfg), practice_pools(cfg)
    try:
        for i, requests in enumerate(TEST_BATCHES):
            batch = ExtendBatch.build(requests, alloc)
            x = layer.random_hidden(batch.num_rows, seed=i + 1)
            compress(layer, x, batch, mine)
            compress_torch(layer, *project(layer, x), batch, want)
    except Exception as e:  # the reader's code raised: say so, never raise
        return f"it raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    wrong = [str(c) for c in compare_pools(mine, want) if not c]
    return "; ".join(wrong) or None


__all__ = ["NAMES", "Yours", "load_yours"]
