"""Student copies of the notebooks: every exercise's solution replaced by a stub.

``make student`` (``python -m c2graph.workshop.student notebooks student``) writes one copy of
every notebook to ``student/``, made fresh each time. ``make workshop`` (``... --keep``) and the
hub write only the copies that are missing, so a student's edits are never overwritten. In a copy, each cell tagged ``solution``
keeps its imports, its function signatures and their docstrings, and every function body
becomes one line::

    raise NotImplementedError("exercise: write this function (see the task above)")

Every output and execution count is cleared, and the notebook's saved widget state dropped;
everything else (the other cells, their tags, the notebook's metadata) is unchanged. The full
notebooks are only read.

``find_exercises`` pairs each ``solution`` cell with the first ``check`` cell after it; the
tests use it to run every stub through its check and prove that the check fails on it.
"""

from __future__ import annotations

import ast
import copy
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

STUB = 'raise NotImplementedError("exercise: write this function (see the task above)")'
SOLUTION, CHECK = "solution", "check"
# Files of the notebooks' folder that students get as they are; the instructor's notes are not
# among them (they hold the answers).
SHARED_FILES = ("GLOSSARY.md",)


def cell_tags(cell) -> list[str]:
    """The cell's tags (``metadata.tags``), an empty list when it has none."""
    return list(cell.get("metadata", {}).get("tags", []))


def stub_source(source: str) -> str:
    """``source`` (a solution cell) with every function body replaced by ``STUB``.

    Top-level functions (``def`` and ``async def``, decorated or not) and the methods of
    top-level classes are stubbed. Kept: the signature, however many lines it takes, the
    docstring (or, in a function without one, the comments before its first statement), and
    every other statement of the cell (imports, constants). Everything after the docstring goes,
    nested functions and comments indented under the body's last line included.
    Raises ``ValueError`` when ``source`` is not plain Python or defines no function.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"source: a solution cell must be plain Python; line {e.lineno}: {e.msg}") from e
    functions = _functions(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            functions += _functions(node.body)
    if not functions:
        raise ValueError("source: a solution cell must define at least one function, found none")
    lines = source.split("\n")
    for node in sorted(functions, key=lambda n: n.lineno, reverse=True):
        start, stop, stub = _replacement(node, lines)
        lines[start - 1:stop] = stub
    return "\n".join(lines)


def _functions(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _leading(text: str) -> str:
    return text[:len(text) - len(text.lstrip())]


def _replacement(node, lines: list[str]) -> tuple[int, int, list[str]]:
    """Lines ``start..stop`` (1-based, inclusive; ``stop == start - 1`` inserts) and what replaces them."""
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    line = lines[first.lineno - 1]
    head = line.encode()[:first.col_offset].decode()
    stop = _with_trailing_comments(node, lines)
    if head.strip():  # the body shares its line with the header (`def f(x): return x`)
        if docstring:
            raise ValueError(f"source: the docstring of {node.name!r} must be on its own line, not after the colon")
        return first.lineno, stop, [head.rstrip(), _leading(lines[node.lineno - 1]) + "    " + STUB]
    if docstring:
        return first.end_lineno + 1, stop, [_leading(line) + STUB]
    return first.lineno, stop, [_leading(line) + STUB]


def _with_trailing_comments(node, lines: list[str]) -> int:
    """The body's last line, moved past comment lines indented deeper than the ``def``."""
    stop = k = node.end_lineno
    while k < len(lines):
        text = lines[k]
        k += 1
        if not text.strip():
            continue
        if not (text.lstrip().startswith("#") and len(_leading(text)) > node.col_offset):
            break
        stop = k
    return stop


@dataclass(frozen=True)
class Exercise:
    """One exercise of a notebook: its ``solution`` cell and the first ``check`` cell after it."""

    notebook: str
    solution: int  # cell index
    check: int  # cell index

    def __str__(self) -> str:
        return f"{self.notebook} cells {self.solution}->{self.check}"


def find_exercises(nb, name: str = "notebook") -> list[Exercise]:
    """Every ``solution`` cell of ``nb`` with the first ``check`` cell after it, in order.

    Raises ``ValueError`` naming the notebook and the cell when a ``solution`` cell is not a code
    cell or has no ``check`` cell after it.
    """
    found = []
    for i, cell in enumerate(nb.cells):
        if SOLUTION not in cell_tags(cell):
            continue
        if cell.cell_type != "code":
            raise ValueError(f"{name}: cell {i} is tagged {SOLUTION!r} but is a {cell.cell_type} cell, expected code")
        check = next((j for j in range(i + 1, len(nb.cells)) if CHECK in cell_tags(nb.cells[j])), None)
        if check is None:
            raise ValueError(f"{name}: the {SOLUTION!r} cell {i} has no {CHECK!r} cell after it")
        found.append(Exercise(name, i, check))
    return found


def student_copy(nb, name: str = "notebook"):
    """A copy of ``nb`` (an ``nbformat`` notebook) with solutions stubbed and outputs cleared.

    ``nb`` itself is not changed. Raises ``ValueError`` naming the notebook and the cell when a
    solution cell cannot be stubbed.
    """
    out = copy.deepcopy(nb)
    out.metadata.pop("widgets", None)  # saved widget state is output too
    for i, cell in enumerate(out.cells):
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if SOLUTION in cell_tags(cell):
            if cell.cell_type != "code":
                raise ValueError(f"{name}: cell {i} is tagged {SOLUTION!r} but is a {cell.cell_type} cell, expected code")
            try:
                cell.source = stub_source(cell.source)
            except ValueError as e:
                raise ValueError(f"{name}: cell {i}: {e}") from None
    return out


def _sources(notebooks: Path, student: Path) -> list[Path]:
    """The notebooks to copy, once ``notebooks`` and ``student`` are checked (``ValueError`` naming the argument)."""
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise ValueError(f"notebooks: no .ipynb file in {notebooks}, expected the notebooks' folder")
    if student.resolve() == notebooks.resolve():
        raise ValueError(f"student: {student} is the notebooks' folder itself, expected another folder")
    return sources


def write_student_copies(notebooks: Path, student: Path) -> list[Path]:
    """Write a student copy of every ``*.ipynb`` in ``notebooks`` to ``student`` (made afresh).

    Also copies the files named in ``SHARED_FILES`` that exist. Returns the notebooks written.
    Every notebook is stubbed before anything is written, so a bad one leaves ``student`` as it was.
    """
    notebooks, student = Path(notebooks), Path(student)
    sources = _sources(notebooks, student)
    copies = {path.name: student_copy(nbformat.read(path, as_version=4), path.name) for path in sources}
    if student.exists():
        shutil.rmtree(student)
    student.mkdir(parents=True)
    for name, nb in copies.items():
        nbformat.validate(nb)
        nbformat.write(nb, student / name)
    for name in SHARED_FILES:
        if (notebooks / name).is_file():
            shutil.copy2(notebooks / name, student / name)
    return [student / name for name in copies]


def add_missing_student_copies(notebooks: Path, student: Path) -> list[Path]:
    """Write the student copies (and ``SHARED_FILES``) that ``student`` lacks; keep every file there.

    A student's own copy, edited or not, is never written over; a notebook added to ``notebooks``
    since is added. Returns the files written (none when every copy is there already).
    """
    notebooks, student = Path(notebooks), Path(student)
    sources = _sources(notebooks, student)
    missing = [p for p in sources if not (student / p.name).exists()]
    copies = {p.name: student_copy(nbformat.read(p, as_version=4), p.name) for p in missing}
    student.mkdir(parents=True, exist_ok=True)
    written = []
    for name, nb in copies.items():
        nbformat.validate(nb)
        nbformat.write(nb, student / name)
        written.append(student / name)
    for name in SHARED_FILES:
        if (notebooks / name).is_file() and not (student / name).exists():
            shutil.copy2(notebooks / name, student / name)
            written.append(student / name)
    return written


USAGE = "usage: python -m c2graph.workshop.student [--keep] [NOTEBOOKS [STUDENT]]"


def main(argv: list[str] | None = None) -> int:
    """``python -m c2graph.workshop.student [--keep] [NOTEBOOKS [STUDENT]]`` (default ``notebooks
    student``): made afresh, or with ``--keep`` only the missing copies added."""
    args = sys.argv[1:] if argv is None else argv
    keep = "--keep" in args
    args = [a for a in args if a != "--keep"]
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    notebooks = Path(args[0]) if args else Path("notebooks")
    student = Path(args[1]) if len(args) > 1 else Path("student")
    if keep:
        written = add_missing_student_copies(notebooks, student)
        kept = len(list(student.glob("*.ipynb"))) - sum(p.suffix == ".ipynb" for p in written)
        print(f"student copies in {student}/: {sum(p.suffix == '.ipynb' for p in written)} made, {kept} kept as they were")
        return 0
    written = write_student_copies(notebooks, student)
    stubs = sum(SOLUTION in cell_tags(c) for p in written for c in nbformat.read(p, as_version=4).cells)
    print(f"wrote {len(written)} student notebooks to {student}/ ({stubs} solution cells stubbed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
