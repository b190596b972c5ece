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
05's), :mod:`.student` (the student copies).
"""

from .check import CheckResult, run_check

__all__ = ["CheckResult", "run_check"]
