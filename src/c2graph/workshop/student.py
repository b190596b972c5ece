"""Student copies of the notebooks: every exercise's solution replaced by a stub.

``make student`` (``python -m c2graph.workshop.student notebooks student``) writes one copy of
every notebook to ``student/``, made afresh: it deletes and rewrites only the copies it made there
itself, as it made them (``MANIFEST`` lists them), and refuses, naming them, when the folder holds
an edited copy or anything else. ``make workshop`` (``... --keep``) and the hub write only the
copies that are missing, so a student's edits are never overwritten. In a copy, every function of
a cell tagged ``solution`` keeps its signature and docstring, and its body becomes one line::

    raise NotImplementedError("exercise: write this function (see the task above)")

The cell's imports and constants stay. Every output and execution count is cleared, and the
notebook's saved widget state dropped; everything else (the other cells, their tags, the
notebook's metadata) is unchanged. The full notebooks are only read.

``find_exercises`` pairs each ``solution`` cell with the first ``check`` cell after it; the
tests use it to run every stub through its check and prove that the check fails on it.
:func:`catch_up` puts chosen solutions into a student's copy (02's puzzles 1 and 2, for a student
who starts the room without them) and :func:`progress` reads what the saved copies show of the
work (the pre-work an instructor asks for).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
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

    Every function (``def`` and ``async def``, decorated or not) is stubbed: at the top, under
    ``if``, ``try``, ``with``, a loop or ``match``, and the methods of classes, nested ones too. Kept: the signature, however many lines it takes, the
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
    if not functions:
        raise ValueError("source: a solution cell must define at least one function, found none")
    lines = source.split("\n")
    for node in sorted(functions, key=lambda n: n.lineno, reverse=True):
        start, stop, stub = _replacement(node, lines)
        lines[start - 1:stop] = stub
    return "\n".join(lines)


def _functions(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of ``body`` whose body is not itself inside a function: at the top, under any
    ``if``, ``try``, ``with``, loop or ``match``, and the methods of classes however deeply nested."""
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)  # its body goes whole, the functions inside it with it
            continue
        children = list(ast.iter_child_nodes(node))
        inner = [c for c in children if isinstance(c, ast.stmt)]
        inner += [s for c in children if isinstance(c, (ast.excepthandler, ast.match_case)) for s in c.body]
        found += _functions(inner)
    return found


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


MANIFEST = ".c2graph-copies.json"
"""The file of a student folder that lists the copies c2graph made there, each with the digest of the
bytes it wrote: a copy whose bytes differ is a student's work, and a file not listed is not c2graph's."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _made(student: Path) -> dict[str, str]:
    path = student / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(student: Path, made: dict[str, str]) -> None:
    (student / MANIFEST).write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")


def _sources(notebooks: Path, student: Path) -> list[Path]:
    """The notebooks to copy, once ``notebooks`` and ``student`` are checked (``ValueError`` naming the argument)."""
    sources = sorted(notebooks.glob("*.ipynb"))
    if not sources:
        raise ValueError(f"notebooks: no .ipynb file in {notebooks}, expected the notebooks' folder")
    if student.resolve() == notebooks.resolve():
        raise ValueError(f"student: {student} is the notebooks' folder itself, expected another folder")
    if student.resolve() in notebooks.resolve().parents:
        raise ValueError(f"student: {student} holds the notebooks' folder {notebooks}, expected a folder of its own")
    if student.exists() and not student.is_dir():
        raise ValueError(f"student: {student} is a file, expected a folder")
    return sources


def not_as_made(student: Path) -> tuple[list[str], list[str]]:
    """What in ``student`` is not a copy as c2graph made it: (the copies edited since, in order; the
    files and folders c2graph did not make there, such as JupyterLab's checkpoints)."""
    made = _made(student)
    edited, others = [], []
    for entry in sorted(student.iterdir()) if student.is_dir() else []:
        if entry.name == MANIFEST:
            continue
        if entry.name not in made or not entry.is_file():
            others.append(entry.name)
        elif _digest(entry) != made[entry.name]:
            edited.append(entry.name)
    return edited, others


def write_student_copies(notebooks: Path, student: Path) -> list[Path]:
    """Write a student copy of every ``*.ipynb`` in ``notebooks`` to ``student`` (made afresh).

    Also copies the files named in ``SHARED_FILES`` that exist. Returns the notebooks written. It
    deletes and writes only the files it made there itself (listed in ``MANIFEST``), and only while
    each is as it wrote it: a ``ValueError`` names every edited copy and every file it did not make,
    and nothing is written. Every notebook is stubbed before anything is written, so a bad one
    leaves ``student`` as it was.
    """
    notebooks, student = Path(notebooks), Path(student)
    sources = _sources(notebooks, student)
    edited, others = not_as_made(student)
    if edited or others:
        found = [f"{what}: {', '.join(names)}" for what, names in (("edited copies", edited), ("files it did not make", others))
                 if names]
        raise ValueError(f"student: {student} holds {'; '.join(found)}; nothing was written (a student's work is "
                         f"never written over): move them away, or keep them and add only the missing copies with --keep")
    copies = {path.name: student_copy(nbformat.read(path, as_version=4), path.name) for path in sources}
    student.mkdir(parents=True, exist_ok=True)
    for name in _made(student):
        (student / name).unlink(missing_ok=True)
    made = {}
    for name, nb in copies.items():
        nbformat.validate(nb)
        nbformat.write(nb, student / name)
        made[name] = _digest(student / name)
    for name in SHARED_FILES:
        if (notebooks / name).is_file():
            shutil.copy2(notebooks / name, student / name)
            made[name] = _digest(student / name)
    _record(student, made)
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
    made, written = _made(student), []
    for name, nb in copies.items():
        nbformat.validate(nb)
        nbformat.write(nb, student / name)
        written.append(student / name)
    for name in SHARED_FILES:
        if (notebooks / name).is_file() and not (student / name).exists():
            shutil.copy2(notebooks / name, student / name)
            written.append(student / name)
    if written:
        _record(student, {**made, **{p.name: _digest(p) for p in written}})
    return written


def catch_up(notebooks: Path, student: Path, notebook: str, numbers: list[int]) -> list[str]:
    """Put the solutions of exercises ``numbers`` (1 for the notebook's first ``solution`` cell) of the
    notebook whose name starts with ``notebook`` (e.g. ``"02"``) into the student's copy of it, in the
    cells still as handed out (the stub); a cell the student has edited is kept as it is. Returns one
    line per exercise saying which. ``ValueError`` names an argument that matches nothing."""
    notebooks, student = Path(notebooks), Path(student)
    full = [p for p in _sources(notebooks, student) if p.name.startswith(notebook)]
    if len(full) != 1:
        raise ValueError(f"notebook: {notebook!r} names {len(full)} notebooks of {notebooks}, expected one")
    path = student / full[0].name
    if not path.is_file():
        raise ValueError(f"student: {student} has no copy of {full[0].name}; make it with --keep first")
    answers, copy = nbformat.read(full[0], as_version=4), nbformat.read(path, as_version=4)
    solutions = [e.solution for e in find_exercises(answers, full[0].name)]
    if not numbers or not all(1 <= n <= len(solutions) for n in numbers):
        raise ValueError(f"numbers: {numbers}, expected exercises 1 to {len(solutions)} of {full[0].name}")
    said, changed = [], False
    for n in numbers:
        solution = answers.cells[solutions[n - 1]].source
        mine = next((c for c in copy.cells if SOLUTION in cell_tags(c) and c.source in (solution, stub_source(solution))), None)
        if mine is None:
            said.append(f"{full[0].name} exercise {n}: kept as you wrote it (its cell is not the one handed out)")
        elif mine.source == solution:
            said.append(f"{full[0].name} exercise {n}: solved already")
        else:
            mine.source, changed = solution, True
            said.append(f"{full[0].name} exercise {n}: its solution is in its cell now: run the notebook from the top")
    if changed:
        nbformat.write(copy, path)
    return said


def progress(student: Path) -> list[str]:
    """What the saved copies in ``student`` show of the work: notebook 00's set-up line, then each
    exercise's check as last run and saved (``pass``, ``not yet``, ``raised`` or ``not run``)."""
    lines = []
    for path in sorted(Path(student).glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code" and "check_setup()" in cell.source:
                said = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream").strip()
                lines.append(f"{path.name}: set-up: {said.splitlines()[0] if said else 'not run'}")
        for n, exercise in enumerate(find_exercises(nb, path.name), 1):
            outputs = nb.cells[exercise.check].outputs
            text = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
            verdict = ("raised" if any(o.get("output_type") == "error" for o in outputs) else
                       "pass" if text.split("\n")[0].endswith(": pass") else "not yet" if text.strip() else "not run")
            lines.append(f"{path.name}: exercise {n}: {verdict}")
    return lines


USAGE = ("usage: python -m c2graph.workshop.student [--keep] [NOTEBOOKS [STUDENT]]\n"
         "       python -m c2graph.workshop.student --catch-up NN:K,K NOTEBOOKS STUDENT\n"
         "       python -m c2graph.workshop.student --progress STUDENT")


def main(argv: list[str] | None = None) -> int:
    """``python -m c2graph.workshop.student [--keep] [NOTEBOOKS [STUDENT]]`` (default ``notebooks
    student``): made afresh, or with ``--keep`` only the missing copies added; ``--catch-up 02:1,2
    NOTEBOOKS STUDENT`` (:func:`catch_up`); ``--progress STUDENT`` (:func:`progress`). A refusal is
    one line on stderr."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        if args[:1] == ["--progress"] and len(args) == 2:
            print("\n".join(progress(Path(args[1]))) or f"no notebook copies in {args[1]}")
            return 0
        if args[:1] == ["--catch-up"] and len(args) == 4 and ":" in args[1]:
            notebook, numbers = args[1].split(":")
            print("\n".join(catch_up(Path(args[2]), Path(args[3]), notebook, [int(n) for n in numbers.split(",")])))
            return 0
    except ValueError as e:
        print(f"c2graph student copies: {e}", file=sys.stderr)
        return 1
    keep = "--keep" in args
    args = [a for a in args if a != "--keep"]
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    notebooks = Path(args[0]) if args else Path("notebooks")
    student = Path(args[1]) if len(args) > 1 else Path("student")
    try:
        if keep:
            written = add_missing_student_copies(notebooks, student)
            made = sum(p.suffix == ".ipynb" for p in written)
            kept = len(list(student.glob("*.ipynb"))) - made
            print(f"student copies in {student}/: {made} made, {kept} kept as they were")
            return 0
        written = write_student_copies(notebooks, student)
    except ValueError as e:
        print(f"c2graph student copies: {e}", file=sys.stderr)
        return 1
    stubs = sum(SOLUTION in cell_tags(c) for p in written for c in nbformat.read(p, as_version=4).cells)
    print(f"wrote {len(written)} student notebooks to {student}/ ({stubs} solution cells stubbed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
