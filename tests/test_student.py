"""Student copies: the stubs, the copies `make student` writes, and every stub through its check.

For each notebook with exercises, one kernel (nbclient) runs the full notebook's code cells up
to its last check cell. After each check cell, a probe runs that exercise's stub in place of
its solution, calls the check, and puts the solution back, so the cells after it run as in the
notebook. The probe reports whether the check passed on the solution and on the stub, and
whether anything raised. A fixture notebook made here (the four cell tags, checks defined in
the notebook) keeps this machinery tested when no notebook has exercises yet.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from c2graph.workshop.student import (STUB, Exercise, add_missing_student_copies, catch_up, cell_tags, find_exercises,
                                      progress, stub_source, student_copy, write_student_copies)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MARKER = "C2GRAPH-PROBE "
KERNEL_TIMEOUT_S = 300  # one cell's limit, as nbval's on the CPU (Triton's interpreter is slow)


# --- the stub of one solution cell ---------------------------------------------------------------

SOLUTION_CELL = '''import torch
from math import tau

SCALE = 2


def partner_row(pos,
                req,
                ring_size: int = 2) -> int:
    """The ring row of the partner of the row at ``pos`` of pool request ``req``."""
    # the previous position, wrapped into the request's ring rows
    prev = pos - 1

    def wrap(p):
        return p % ring_size

    return req * ring_size + wrap(prev)
    # said after the last line: still the solution's


# not the function's: kept
@functools.lru_cache
def one_line(x): return x + SCALE

def commented(x):
    # x: [T] fp32 -> [T] fp32, twice x
    return x * 2

async def only_docstring():
    """Nothing but a docstring."""

class Ring:
    def park(self, row):
        """Park ``row``."""
        self.rows.append(row)
'''


def _bodies(source: str) -> dict[str, list[ast.stmt]]:
    tree = ast.parse(source)
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {n.name: n.body for n in nodes}


def test_stub_keeps_signatures_docstrings_and_imports_and_raises_in_every_body():
    stubbed = stub_source(SOLUTION_CELL)
    bodies = _bodies(stubbed)
    assert set(bodies) == {"partner_row", "one_line", "commented", "only_docstring", "park"}  # `wrap` went with its body
    for name, body in bodies.items():
        raises = body[-1]
        assert isinstance(raises, ast.Raise) and ast.unparse(raises) == ast.unparse(ast.parse(STUB).body[0]), name
        assert len(body) <= 2, (name, [ast.unparse(s) for s in body])
    for kept in ('def partner_row(pos,\n                req,\n                ring_size: int = 2) -> int:\n'
                 '    """The ring row of the partner of the row at ``pos`` of pool request ``req``."""\n    raise',
                 "import torch\nfrom math import tau\n\nSCALE = 2\n", "# not the function's: kept\n@functools.lru_cache\n",
                 "def commented(x):\n    # x: [T] fp32 -> [T] fp32, twice x\n    raise",
                 '    """Nothing but a docstring."""\n    raise', '        """Park ``row``."""\n        raise'):
        assert kept in stubbed, kept
    for gone in ("prev = pos - 1", "said after the last line", "x + SCALE", "x * 2", "self.rows.append"):
        assert gone not in stubbed, gone


def test_stubbed_functions_raise_not_implemented_with_the_exercise_message():
    namespace = {"functools": __import__("functools")}
    exec(stub_source(SOLUTION_CELL), namespace)
    for call in (lambda: namespace["partner_row"](3, 1), lambda: namespace["one_line"](1),
                 lambda: namespace["commented"](1), lambda: namespace["Ring"]().park(0)):
        with pytest.raises(NotImplementedError, match="exercise: write this function"):
            call()


NESTED_SOLUTIONS = '''import torch
if torch.cuda.is_available():
    def scale(x):
        """x: [T] fp32 -> [T] fp32."""
        return x * 3  # SOLUTION-1
else:
    def scale(x):
        return x * 4  # SOLUTION-2
try:
    from math import isqrt
except ImportError:
    def isqrt(n):
        return int(n ** 0.5)  # SOLUTION-3
finally:
    def done(x): return x - 6  # SOLUTION-4
for _ in range(1):
    def looped():
        return 5  # SOLUTION-5
class Outer:
    class Inner:
        def method(self):
            """Nested twice."""
            return 7  # SOLUTION-6

        async def waits(self):
            return 8  # SOLUTION-7
    @staticmethod
    def helper():
        def inner():
            return 9  # SOLUTION-8
        return inner()
match 1:
    case 1:
        def matched():
            return 10  # SOLUTION-9
'''


def test_no_solution_survives_under_if_try_loops_match_or_in_nested_classes():
    stubbed = stub_source(NESTED_SOLUTIONS)
    assert "SOLUTION" not in stubbed, stubbed
    bodies = _bodies(stubbed)
    assert set(bodies) == {"scale", "isqrt", "done", "looped", "method", "waits", "helper", "matched"}
    for name, body in bodies.items():
        assert ast.unparse(body[-1]) == ast.unparse(ast.parse(STUB).body[0]) and len(body) <= 2, name
    assert 'if torch.cuda.is_available():\n    def scale(x):\n        """x: [T] fp32 -> [T] fp32."""\n        raise' in stubbed
    namespace = {}
    exec(stubbed, namespace)
    for call in (lambda: namespace["scale"](1), lambda: namespace["done"](1), lambda: namespace["looped"](),
                 lambda: namespace["Outer"].Inner().method(), lambda: namespace["Outer"].helper(),
                 lambda: namespace["matched"]()):
        with pytest.raises(NotImplementedError, match="exercise: write this function"):
            call()


@pytest.mark.parametrize("source, expected", [
    ("x = 1\n", "define at least one function"),
    ("%timeit f()\ndef f():\n    return 1\n", "plain Python"),
    ('def f(): "doc"; return 1\n', "own line"),
])
def test_stub_refuses_what_is_not_a_solution_cell(source, expected):
    with pytest.raises(ValueError, match=expected):
        stub_source(source)


# --- a fixture notebook with the four tags -------------------------------------------------------

SETUP = '''import torch
from c2graph.workshop import run_check


def check_group_position(fn):
    """pass when fn(pos) is the group position pos - pos % 2 for random positions."""
    def cases():
        pos = torch.randint(0, 1000, (64,))
        got = fn(pos)
        return [(torch.equal(got, pos - pos % 2), "group positions of 64 random rows")]
    return run_check("group position", cases)


def check_c2_slots(c2_slot, stores):
    """pass when the c2 slot and the store decision agree with raw_out_loc // 2 and odd, live rows."""
    def cases():
        loc = torch.randint(0, 500, (64,))
        pos = torch.randint(0, 1000, (64,))
        want = (pos % 2 == 1) & (loc != 0)
        return [(torch.equal(c2_slot(loc), loc // 2), "c2 slots"),
                (torch.equal(stores(pos, loc), want), "rows that store")]
    return run_check("c2 slots", cases)'''

FIRST_SOLUTION = '''import torch


def group_position(pos):
    """pos: [T] int64 -> [T] int64, the even position of each row's group."""
    return pos - pos % 2'''

SECOND_SOLUTION = '''def c2_slot(raw_out_loc):
    """raw_out_loc: [T] int64 -> [T] int64, the c2 slot a completing row stores at."""
    return raw_out_loc // 2


def stores(pos, raw_out_loc):
    """-> [T] bool: the rows that complete a group and are not padding."""
    return (pos % 2 == 1) & (raw_out_loc != 0)'''


def fixture_notebook():
    """A small notebook with two exercises (one with two functions), stored outputs included."""
    def code(source, tags=(), outputs=()):
        cell = new_code_cell(source, execution_count=1, outputs=list(outputs))
        if tags:
            cell.metadata["tags"] = list(tags)
        return cell

    def markdown(source, tags=()):
        cell = new_markdown_cell(source)
        if tags:
            cell.metadata["tags"] = list(tags)
        return cell

    picture = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
    printed = new_output("stream", name="stdout", text="group position: pass\n")
    nb = new_notebook(cells=[
        markdown("# Fixture: two exercises"),
        code(SETUP),
        markdown("Write `group_position(pos)`: the even position of each row's group.", ["exercise"]),
        code(FIRST_SOLUTION, ["solution"]),
        markdown("Predict: what is the group position of row pos 7?", ["predict"]),
        code("check_group_position(group_position)", ["check"], [printed]),
        code("print(group_position(torch.arange(6)).tolist())", outputs=[picture]),
        markdown("Write `c2_slot` and `stores`.", ["exercise"]),
        code(SECOND_SOLUTION, ["solution"]),
        code("check_c2_slots(c2_slot, stores)", ["check"], [printed]),
        code("print(c2_slot(torch.arange(4)).tolist(), group_position(torch.tensor([3])).tolist())"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2, "version_minor": 0}}
    return nb


def test_find_exercises_pairs_each_solution_with_the_next_check():
    assert [(e.solution, e.check) for e in find_exercises(fixture_notebook(), "fixture")] == [(3, 5), (8, 9)]
    nb = fixture_notebook()
    nb.cells = nb.cells[:9]
    with pytest.raises(ValueError, match=r"fixture: the 'solution' cell 8 has no 'check' cell after it"):
        find_exercises(nb, "fixture")


def test_student_copy_of_the_fixture_stubs_solutions_clears_outputs_and_changes_nothing_else():
    nb = fixture_notebook()
    before = json.dumps(nb, sort_keys=True)
    copy = student_copy(nb, "fixture")
    assert json.dumps(nb, sort_keys=True) == before  # the full notebook is not touched
    nbformat.validate(copy)
    assert "widgets" not in copy.metadata and copy.metadata.kernelspec == nb.metadata.kernelspec
    assert len(copy.cells) == len(nb.cells)
    for i, (full, student) in enumerate(zip(nb.cells, copy.cells)):
        assert cell_tags(student) == cell_tags(full) and student.cell_type == full.cell_type, i
        if student.cell_type == "code":
            assert student.outputs == [] and student.execution_count is None, i
        if "solution" in cell_tags(full):
            assert student.source == stub_source(full.source) and STUB in student.source, i
        else:
            assert student.source == full.source, i


def _probe_helper() -> str:
    """The kernel's first cell: defines ``__c2graph_probe(stub, check, solution)``."""
    return f'''def __c2graph_probe(stub, check, solution):
    import ast, json, linecache, traceback
    from IPython.core.inputtransformer2 import TransformerManager
    from c2graph.workshop import CheckResult
    ns = get_ipython().user_ns

    def run(source):  # the cell's statements, then the value of its last expression
        code = TransformerManager().transform_cell(source)
        # kept in linecache as IPython keeps a cell's source: compiled Triton reads it back
        name = f"<exercise-{{len(linecache.cache)}}>"
        linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, name, "exec"), ns)
        return None if last is None else eval(compile(ast.Expression(last.value), name, "eval"), ns)

    def outcome(result):
        return {{"check_result": isinstance(result, CheckResult), "ok": bool(getattr(result, "ok", False)),
                 "text": str(result)}}

    report = {{}}
    try:
        report["solution"] = outcome(run(check))
        run(stub)
        report["stub"] = outcome(run(check))
    except BaseException:
        report["raised"] = traceback.format_exc()
    finally:
        run(solution)
    print({MARKER!r} + json.dumps(report))'''


def probe_exercises(nb, name: str, path: Path) -> dict[Exercise, dict]:
    """Run ``nb`` up to its last check cell in a kernel, probing every exercise after its check."""
    exercises = find_exercises(nb, name)
    if not exercises:
        return {}
    cells, probes = [new_code_cell(_probe_helper())], []
    for i, cell in enumerate(nb.cells[:max(e.check for e in exercises) + 1]):
        if cell.cell_type != "code":
            continue
        cells.append(new_code_cell(cell.source))
        for exercise in (e for e in exercises if e.check == i):
            solution = nb.cells[exercise.solution].source
            call = f"__c2graph_probe({stub_source(solution)!r}, {cell.source!r}, {solution!r})"
            probes.append((exercise, len(cells)))
            cells.append(new_code_cell(call))
    probe_nb = new_notebook(cells=cells, metadata=nb.metadata)
    client = NotebookClient(probe_nb, timeout=KERNEL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path)}})
    client.execute()
    reports = {}
    for exercise, index in probes:
        text = "".join(o.get("text", "") for o in probe_nb.cells[index].outputs if o.output_type == "stream")
        lines = [line for line in text.splitlines() if line.startswith(MARKER)]
        assert lines, f"{exercise}: the probe printed nothing; its outputs: {probe_nb.cells[index].outputs}"
        reports[exercise] = json.loads(lines[-1][len(MARKER):])
    return reports


@functools.cache
def notebook_reports(path: Path) -> dict[Exercise, dict]:
    return probe_exercises(nbformat.read(path, as_version=4), path.name, path.parent)


def assert_stub_fails_its_check(exercise: Exercise, report: dict) -> None:
    assert "raised" not in report, f"{exercise}: running the check raised:\n{report['raised']}"
    for side in ("solution", "stub"):
        assert report[side]["check_result"], f"{exercise}: the check returned {report[side]['text']!r}, not a CheckResult"
    assert report["solution"]["ok"], f"{exercise}: the committed solution does not pass its check:\n{report['solution']['text']}"
    assert not report["stub"]["ok"], f"{exercise}: the check passes on the stub:\n{report['stub']['text']}"


def test_every_stub_of_the_fixture_fails_its_check_and_the_notebook_runs_on(tmp_path):
    reports = probe_exercises(fixture_notebook(), "fixture", tmp_path)
    assert len(reports) == 2
    for exercise, report in reports.items():
        assert_stub_fails_its_check(exercise, report)
        assert "not written yet" in report["stub"]["text"], report


def test_a_check_that_passes_on_the_stub_is_caught(tmp_path):
    nb = fixture_notebook()
    nb.cells[5].source = "run_check('lenient', lambda: [(True, 'anything goes')])"
    (exercise, report), _ = probe_exercises(nb, "fixture", tmp_path).items()
    with pytest.raises(AssertionError, match="passes on the stub"):
        assert_stub_fails_its_check(exercise, report)


def _exercises():
    found = [pytest.param(path, e, id=f"{path.stem}:{e.solution}")
             for path in NOTEBOOKS for e in find_exercises(nbformat.read(path, as_version=4), path.name)]
    return found or [pytest.param(None, None, id="no-exercises")]


@pytest.mark.parametrize("path, exercise", _exercises())
def test_every_stub_in_the_notebooks_fails_its_check(path, exercise):
    assert exercise is not None, ("no notebook has an exercise (no cell tagged 'solution'): the workshop "
                                  "notebooks lost their tags, or NOTEBOOKS points at the wrong folder")
    assert_stub_fails_its_check(exercise, notebook_reports(path)[exercise])


# --- make student --------------------------------------------------------------------------------

def _digests(paths) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_student_copies_of_every_notebook_are_valid_have_no_outputs_and_leave_the_notebooks_alone(tmp_path):
    out = tmp_path / "student"
    before = _digests(NOTEBOOKS)
    command = [sys.executable, "-m", "c2graph.workshop.student", str(ROOT / "notebooks"), str(out)]
    for _ in range(2):  # made, then made afresh over copies as they were made
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    assert _digests(NOTEBOOKS) == before
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
    assert not list(out.glob("INSTRUCTOR*"))
    for path in NOTEBOOKS:
        full, copy = nbformat.read(path, as_version=4), nbformat.read(out / path.name, as_version=4)
        nbformat.validate(copy)
        assert len(copy.cells) == len(full.cells), path.name
        for i, (a, b) in enumerate(zip(full.cells, copy.cells)):
            if b.cell_type == "code":
                assert b.outputs == [] and b.execution_count is None, (path.name, i)
            assert b.source == (stub_source(a.source) if "solution" in cell_tags(a) else a.source), (path.name, i)


def _fixture_notebooks(tmp_path) -> Path:
    folder = tmp_path / "course" / "notebooks"
    folder.mkdir(parents=True)
    nbformat.write(fixture_notebook(), folder / "01_fixture.ipynb")
    nbformat.write(fixture_notebook(), folder / "02_fixture.ipynb")
    (folder / "GLOSSARY.md").write_text("words\n")
    return folder


def test_make_student_over_a_students_work_refuses_naming_it_and_deletes_nothing(tmp_path):
    notebooks = _fixture_notebooks(tmp_path)
    student = tmp_path / "student"
    write_student_copies(notebooks, student)
    edited = student / "02_fixture.ipynb"
    edited.write_text(edited.read_text().replace("NotImplementedError", "NotImplementedError  # mine"))
    (student / ".ipynb_checkpoints").mkdir()
    (student / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in student.iterdir() if p.is_file()}
    command = [sys.executable, "-m", "c2graph.workshop.student", str(notebooks), str(student)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == (f"c2graph student copies: student: {student} holds edited copies: 02_fixture.ipynb; files it "
                          "did not make: .ipynb_checkpoints, notes.txt; nothing was written (a student's work is never "
                          "written over): move them away, or keep them and add only the missing copies with --keep\n")
    assert {p.name: p.read_bytes() for p in student.iterdir() if p.is_file()} == before
    (student / "notes.txt").unlink()
    (student / ".ipynb_checkpoints").rmdir()
    edited.unlink()
    (student / "01_fixture.ipynb").unlink()  # a copy deleted is simply made again
    assert [p.name for p in write_student_copies(notebooks, student)] == ["01_fixture.ipynb", "02_fixture.ipynb"]


@pytest.mark.parametrize("where", ["the parent", "the grandparent"])
def test_a_student_folder_that_holds_the_notebooks_is_refused_before_anything_is_touched(tmp_path, where):
    notebooks = _fixture_notebooks(tmp_path)
    student = notebooks.parent if where == "the parent" else notebooks.parent.parent
    (notebooks.parent / "README.md").write_text("the course")
    before = sorted((p, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    for write in (write_student_copies, add_missing_student_copies):
        with pytest.raises(ValueError, match=f"student: {student} holds the notebooks' folder {notebooks}, expected a "
                                             "folder of its own"):
            write(notebooks, student)
    assert sorted((p, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) == before


def test_a_folder_of_other_files_is_refused_and_keep_adds_only_what_is_missing(tmp_path):
    notebooks = _fixture_notebooks(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files it did not make: thesis.tex; nothing was written"):
        write_student_copies(notebooks, home)
    assert [p.name for p in home.iterdir()] == ["thesis.tex"]
    written = add_missing_student_copies(notebooks, home)
    assert sorted(p.name for p in written) == ["01_fixture.ipynb", "02_fixture.ipynb", "GLOSSARY.md"]
    assert (home / "thesis.tex").read_text() == "mine"


def test_catch_up_fills_the_cells_as_handed_out_and_keeps_an_edited_one(tmp_path):
    notebooks = _fixture_notebooks(tmp_path)
    student = tmp_path / "student"
    write_student_copies(notebooks, student)
    copy = student / "02_fixture.ipynb"
    nb = nbformat.read(copy, as_version=4)
    nb.cells[8].source = nb.cells[8].source.replace("raise NotImplementedError", "return 0  # mine\n    raise NotImplementedError")
    nb.cells[1].source += "\n# a note of mine"
    nbformat.write(nb, copy)
    said = catch_up(notebooks, student, "02", [1, 2])
    assert said == ["02_fixture.ipynb exercise 1: its solution is in its cell now: run the notebook from the top",
                    "02_fixture.ipynb exercise 2: kept as you wrote it (its cell is not the one handed out)"]
    after = nbformat.read(copy, as_version=4)
    assert after.cells[3].source == FIRST_SOLUTION and "# mine" in after.cells[8].source
    assert after.cells[1].source.endswith("# a note of mine")
    assert catch_up(notebooks, student, "02", [1])[0] == "02_fixture.ipynb exercise 1: solved already"
    assert nbformat.read(student / "01_fixture.ipynb", as_version=4).cells[3].source == stub_source(FIRST_SOLUTION)
    for bad, words in ((("07", [1]), "notebook: '07' names 0 notebooks"), (("02", [3]), "numbers: \\[3\\], expected exercises 1 to 2")):
        with pytest.raises(ValueError, match=words):
            catch_up(notebooks, student, *bad)


def test_catch_up_of_02_gives_the_first_two_puzzles_solutions(tmp_path):
    """make catch-up's default (02:1,2): puzzles 1 and 2 of notebook 02, which its assembly builds on."""
    makefile = (ROOT / "Makefile").read_text()
    assert "CATCH_UP ?= 02:1,2" in makefile
    add_missing_student_copies(ROOT / "notebooks", tmp_path)
    catch_up(ROOT / "notebooks", tmp_path, "02", [1, 2])
    (full,) = (ROOT / "notebooks").glob("02_*.ipynb")
    answers, copy = nbformat.read(full, as_version=4), nbformat.read(tmp_path / full.name, as_version=4)
    solutions = find_exercises(answers, full.name)
    assert [copy.cells[e.solution].source for e in solutions[:2]] == [answers.cells[e.solution].source for e in solutions[:2]]
    assert all(copy.cells[e.solution].source == stub_source(answers.cells[e.solution].source) for e in solutions[2:])
    assert "def row_slots" in copy.cells[solutions[0].solution].source


def test_progress_reads_each_checks_saved_verdict(tmp_path):
    notebooks = _fixture_notebooks(tmp_path)
    student = tmp_path / "student"
    write_student_copies(notebooks, student)
    assert progress(student) == [f"0{k}_fixture.ipynb: exercise {n}: not run" for k in (1, 2) for n in (1, 2)]
    nb = nbformat.read(student / "01_fixture.ipynb", as_version=4)
    nb.cells[5].outputs = [new_output("stream", name="stdout", text="group position: pass\n  pass: 64 rows\n")]
    nb.cells[9].outputs = [new_output("stream", name="stdout", text="c2 slots: not yet\n  FAIL: c2 slots\n")]
    nbformat.write(nb, student / "01_fixture.ipynb")
    nb = nbformat.read(student / "02_fixture.ipynb", as_version=4)
    nb.cells[5].outputs = [new_output("error", ename="NameError", evalue="x", traceback=[])]
    nb.cells[1].source = "print(check_setup())"
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="ready: Python and every package\n")]
    nbformat.write(nb, student / "02_fixture.ipynb")
    assert progress(student) == ["01_fixture.ipynb: exercise 1: pass", "01_fixture.ipynb: exercise 2: not yet",
                                 "02_fixture.ipynb: set-up: ready: Python and every package",
                                 "02_fixture.ipynb: exercise 1: raised", "02_fixture.ipynb: exercise 2: not run"]


def test_write_student_copies_refuses_to_write_over_the_notebooks(tmp_path):
    with pytest.raises(ValueError, match="student: .* is the notebooks' folder itself"):
        write_student_copies(ROOT / "notebooks", ROOT / "notebooks")
    with pytest.raises(ValueError, match="notebooks: no .ipynb file"):
        write_student_copies(tmp_path, tmp_path / "student")


def test_keep_makes_only_the_missing_copies_and_never_writes_over_a_students_edits(tmp_path):
    out = tmp_path / "student"
    command = [sys.executable, "-m", "c2graph.workshop.student", "--keep", str(ROOT / "notebooks"), str(out)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"student copies in {out}/: {len(NOTEBOOKS)} made, 0 kept as they were\n"
    edited = out / NOTEBOOKS[1].name
    edited.write_text(edited.read_text().replace("NotImplementedError", "NotImplementedError  # mine"))
    mine = edited.read_bytes()
    (out / NOTEBOOKS[0].name).unlink()  # a copy the student deleted comes back
    (out / "notes.txt").write_text("keep me")
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"student copies in {out}/: 1 made, {len(NOTEBOOKS) - 1} kept as they were\n"
    assert edited.read_bytes() == mine and (out / "notes.txt").read_text() == "keep me"
    fresh = nbformat.read(out / NOTEBOOKS[0].name, as_version=4)
    assert fresh.cells == student_copy(nbformat.read(NOTEBOOKS[0], as_version=4), NOTEBOOKS[0].name).cells
    with pytest.raises(ValueError, match="student: .* is the notebooks' folder itself"):
        add_missing_student_copies(ROOT / "notebooks", ROOT / "notebooks")
