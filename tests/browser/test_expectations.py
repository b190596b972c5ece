"""The browser test's verdict, on states made here (no browser): what it reports and what it lets pass."""

import pytest
from expectations import WIDGET_MIME, expected_cells, problems
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

import self_check

FIGURE = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})


def notebook():
    return new_notebook(cells=[
        new_markdown_cell("# title"),
        new_code_cell("# NBVAL_IGNORE_OUTPUT\nimport torch", outputs=[]),
        new_code_cell("draw(batch)", outputs=[FIGURE]),
        new_code_cell("explorer_widget(cfg)", outputs=[new_output("execute_result", data={WIDGET_MIME: {}})]),
    ])


def output(type="stream", mimes=(), images=0, widget=False, text="", stderr="", **more):
    return dict(type=type, name=more.get("name"), mimes=list(mimes), ename=more.get("ename"),
                evalue=more.get("evalue"), text=text, stderr=stderr, images=images, widget=widget)


def add(seen, index, out):
    seen[index]["outputs"].append(out)
    seen[index]["shown"] += 1


def seen_passing():
    return [
        {"type": "markdown"},
        {"type": "code", "count": 1, "shown": 1, "outputs": [output(stderr="UserWarning: only a warning")]},
        {"type": "code", "count": 2, "shown": 1, "outputs": [output("display_data", ["image/png"], images=1)]},
        {"type": "code", "count": 3, "shown": 1, "outputs": [output("execute_result", [WIDGET_MIME], widget=True)]},
    ]


def test_expected_cells_count_stored_figures_and_name_the_first_line_past_nbval_markers():
    assert [(c.index, c.first_line, c.figures) for c in expected_cells(notebook())] == [
        (1, "import torch", 0), (2, "draw(batch)", 1), (3, "explorer_widget(cfg)", 0)]


def test_a_clean_run_passes_and_a_warning_on_stderr_is_no_problem():
    assert problems("nb.ipynb", notebook(), seen_passing()) == []


@pytest.mark.parametrize("change, expected", [
    (lambda s: add(s, 1, output("error", ename="ValueError", evalue="bad")),
     "nb.ipynb cell 1 ('import torch'): raised ValueError: bad"),
    (lambda s: add(s, 1, output(stderr="Traceback (most recent call last):\n  ...\nKeyError: 3")),
     "nb.ipynb cell 1 ('import torch'): a traceback on stderr, ending 'KeyError: 3'"),
    (lambda s: s[2]["outputs"][0].update(images=0), "nb.ipynb cell 2 ('draw(batch)'): shows 0 of the 1 figure(s)"),
    (lambda s: s[3]["outputs"][0].update(widget=False, text="Loading widget..."),
     "nb.ipynb cell 3 ('explorer_widget(cfg)'): widget not rendered, the page shows 'Loading widget...'"),
    (lambda s: s[3]["outputs"][0].update(text="Error displaying widget: model not found"), "widget not rendered"),
    (lambda s: s[3].update(shown=0), "nb.ipynb cell 3 ('explorer_widget(cfg)'): the page shows 0 of its 1 outputs"),
    (lambda s: [s[i].update(count=None) for i in (2, 3)], "nb.ipynb: cells [2, 3] never ran"),
    (lambda s: s.pop(), "nb.ipynb: the browser shows 3 cells, the notebook has 4"),
])
def test_each_problem_is_reported_once_naming_the_notebook_and_the_cell(change, expected):
    seen = seen_passing()
    change(seen)
    found = problems("nb.ipynb", notebook(), seen)
    assert len(found) == 1 and expected in found[0], found


def test_the_self_check_accepts_exactly_its_expected_problems():
    exact = [f"{start}{words}" for start, words in self_check.EXPECTED]
    assert self_check.unexpected(exact) == []
    missing = self_check.unexpected(exact[1:])
    assert len(missing) == 1 and "did not report" in missing[0]
    extra = self_check.unexpected(exact + ["00_tour.ipynb cell 3 ('x'): raised KeyError: 1"])
    assert len(extra) == 1 and "00_tour.ipynb cell 3" in extra[0]


def test_the_self_check_notebook_stores_the_figure_it_no_longer_draws():
    nb = self_check.broken_notebook()
    assert [c.figures for c in expected_cells(nb)] == [0, 1, 1, 0, 0, 0, 0]
