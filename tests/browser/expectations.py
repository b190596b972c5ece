"""What each notebook must show in the browser, and the verdict on what it did show.

The expectations come from the committed notebook: every cell whose stored outputs hold a
figure must show as many loaded ``img`` elements after the run in JupyterLab. The verdict reads
the state the browser reported (one dict per cell, made by ``STATE_JS`` in ``run_notebooks``)
and names the notebook and the cell of every problem: an error output, a traceback on stderr, a
cell that never ran, a figure missing, a widget that did not render.
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# What a widget output shows instead of the widget: for good when its model is missing or failed,
# or while its model has not arrived.
WIDGET_ERRORS = ("Error displaying widget", "Error rendering widget", "model not found")
WIDGET_FAILURES = WIDGET_ERRORS + ("Loading widget",)


@dataclass(frozen=True)
class Expected:
    """One code cell of the committed notebook: where it is and how many figures it stored."""

    index: int
    first_line: str
    figures: int


def _first_line(source) -> str:
    text = "".join(source) if isinstance(source, list) else source
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("# NBVAL")]
    return (lines[0] if lines else "").strip()[:60]


def expected_cells(nb: dict) -> list[Expected]:
    """Every code cell of ``nb`` (a notebook as JSON) with the number of figures it stored."""
    cells = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        figures = sum(any(m in o.get("data", {}) for m in IMAGE_MIMES) for o in cell.get("outputs", []))
        cells.append(Expected(i, _first_line(cell["source"]), figures))
    return cells


def problems(name: str, nb: dict, seen: list[dict]) -> list[str]:
    """Every problem in ``seen`` (the browser's cells after Run All), one line each, naming the cell.

    ``seen[i]`` has ``type`` and, for a code cell: ``count`` (its execution count, None if it
    never ran), ``shown`` (output views in the page) and ``outputs``, one dict per output of the
    cell's model: ``type``, ``name``, ``mimes``, ``ename``, ``evalue``, ``text`` (what the page
    shows), ``stderr`` (the text of its stderr view), ``images`` (loaded ``img`` elements) and
    ``widget`` (whether a widget view is in it).
    """
    if len(seen) != len(nb["cells"]):
        return [f"{name}: the browser shows {len(seen)} cells, the notebook has {len(nb['cells'])}"]
    found, never_ran = [], []
    for want in expected_cells(nb):
        cell = seen[want.index]
        where = f"{name} cell {want.index} ({want.first_line!r})"
        if cell["count"] is None:
            never_ran.append(want.index)
        if cell["shown"] < len(cell["outputs"]):
            found.append(f"{where}: the page shows {cell['shown']} of its {len(cell['outputs'])} outputs")
        for out in cell["outputs"]:
            if out["type"] == "error":
                found.append(f"{where}: raised {out['ename']}: {out['evalue']}")
            elif out["type"] == "stream" and "Traceback" in out["stderr"]:
                found.append(f"{where}: a traceback on stderr, ending {out['stderr'].strip().splitlines()[-1][:120]!r}")
            if WIDGET_MIME in out["mimes"] and (not out["widget"] or any(t in out["text"] for t in WIDGET_FAILURES)):
                found.append(f"{where}: widget not rendered, the page shows {out['text'][:120]!r}")
        loaded = sum(out["images"] for out in cell["outputs"])
        if cell["count"] is not None and loaded < want.figures:
            found.append(f"{where}: shows {loaded} of the {want.figures} figure(s) the notebook stored")
    if never_ran:
        found.append(f"{name}: cells {never_ran} never ran")
    return found
