"""A notebook broken on purpose, run first by ``make browser-test`` to prove the checks still bite.

Each way a notebook can look wrong to a reader is in it once: a figure the stored notebook had
and the run does not draw, a widget whose model does not exist, a traceback printed on stderr
by a caught exception, an error, and a cell after it that never runs. A working widget and a
working figure sit beside them and must not be reported. The run must report exactly the
expected problems; anything else means the browser test has gone blind (or sees ghosts).
"""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_notebook, new_output

NAME = "self_check_broken.ipynb"

_FIGURE = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})
_CELLS = [
    ("import ipywidgets\nipywidgets.IntSlider(value=3, description='works')", []),
    ("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3]);", [_FIGURE]),
    ("print('the figure this cell stored is not drawn any more')", [_FIGURE]),
    ("from IPython.display import display\n"
     "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'no-such-model', 'version_major': 2,"
     " 'version_minor': 0}, 'text/plain': 'a widget'}, raw=True)", []),
    ("import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()", []),
    ("raise ValueError('broken on purpose')", []),
    ("print('never reached')", []),
]

# Each problem the run must report, as (start of the line, words in it); nothing else may be reported.
EXPECTED = [
    (f"{NAME} cell 2 ", "shows 0 of the 1 figure(s) the notebook stored"),
    (f"{NAME} cell 3 ", "widget not rendered"),
    (f"{NAME} cell 4 ", "a traceback on stderr, ending 'ZeroDivisionError: division by zero'"),
    (f"{NAME} cell 5 ", "raised ValueError: broken on purpose"),
    (f"{NAME}: ", "cells [6] never ran"),
]


def broken_notebook():
    """The notebook, as ``nbformat`` builds it (stored outputs included)."""
    nb = new_notebook(cells=[new_code_cell(source, outputs=outputs) for source, outputs in _CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def unexpected(found: list[str]) -> list[str]:
    """What is wrong with the problems ``found`` in the broken notebook: missing or extra ones."""
    def matches(line, want):
        return line.startswith(want[0]) and want[1] in line

    missing = [f"self-check: the browser test did not report {' ... '.join(want)!r}" for want in EXPECTED
               if not any(matches(line, want) for line in found)]
    extra = [f"self-check: the browser test reported {line!r}, which the notebook was not broken for"
             for line in found if not any(matches(line, want) for want in EXPECTED)]
    return missing + extra
