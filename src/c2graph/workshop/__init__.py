"""Workshop mode: the checks behind the notebooks' exercises.

Each exercise has three cells, found by their cell tags:

- ``exercise`` (markdown): the task, in words;
- ``solution`` (code): the reader's function(s), top-level ``def``s with docstrings. The committed
  notebook holds a working solution; ``make student`` writes copies to ``student/`` in which
  every such body raises ``NotImplementedError``;
- ``check`` (code): one call, ``check_something(the_function)``, that says pass, or shows in
  words (and where it helps, a picture) which rows or slots differ. A check never raises because
  the reader's function is wrong or unfinished: it reports it.

A ``predict`` (markdown) cell asks the reader to predict a result before the cell that shows it;
the answers are in ``notebooks/INSTRUCTOR.md``.

Modules: :mod:`.check` (what every check returns), :mod:`.setup_check` (notebook 00's one-line
set-up check), :mod:`.my_compressor` (notebook 01's functions and the checks of its exercises),
:mod:`.puzzles` and :mod:`.kernel` (notebook 02's puzzles and their checks), :mod:`.assembly`
(notebook 02's kernel assembled from the reader's pieces) and :mod:`.assembly_stages` (its check,
stage by stage), :mod:`.launch` (launching a reader's
Triton function, its errors in the reader's terms), :mod:`.practice` (the practice batches and
pools every check of notebooks 01 and 03 runs on, the check's seeded generator, the words and
pictures of a failed check, and notebook 03's capture of the reader's function), :mod:`.yours`
(notebook 03 loads the reader's own functions from their notebook 01), :mod:`.my_graph`
(notebook 03's workbench and checks), :mod:`.offsets` (notebook 04's), :mod:`.floors` (notebook
05's), :mod:`.student` (the student copies), :mod:`.broken_offsets` (the prefill graph runner with
its offsets handled the ways that break in a graph: notebooks 03 and 04 run them), :mod:`.figures`
(``python -m c2graph figures FOLDER``: the pictures a reader needs outside Jupyter, the broken
variant's wrong slots among them).

The notebooks define Triton kernels of their own: importing this package calls
:func:`c2graph.interpret_triton`, so on a machine without CUDA the kernels a notebook decorates
after it run in Triton's interpreter, as the package's own do (a notebook's process, and the
processes it starts, keep ``TRITON_INTERPRET=1``).
"""

from .._runtime import interpret_triton
from .check import CheckResult, run_check

interpret_triton()

__all__ = ["CheckResult", "run_check"]
