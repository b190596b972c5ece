"""Pictures of ``low_ratio_extend_offsets``: the static offsets tensor and the rows it describes.

- :func:`draw_offsets`: for several batches (a ragged one, one with request slots past the batch,
  one padded to a bucket, an idle rank's), the ``[2, request_slots]`` tensor above the batch's rows;
  each request slot's column points at the first of its rows, slots past the batch at the end of
  the live rows with count 0, and padding rows belong to no column.
- :func:`draw_offsets_diff`: a tensor the reader built next to the right one, the wrong cells marked.

Figures are made without pyplot (nothing shown twice, no global state), one colour per request
slot as in every picture of the package, labels of 9 pt or more at a width that fits a notebook.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Rectangle

from ..compressor.batch import ExtendBatch
from .draw import EDGE, PADDING_COLOUR, request_colour

WIDTH = 9.5  # inches: a notebook column at 100% zoom
WRONG = "#C0392B"


def _table(ax, offsets: list[list[int]], live_slots: int, x0: float, y0: float, w: float,
           wrong: set[tuple[int, int]] = frozenset(), labels: bool = True) -> None:
    """The ``[2, S]`` tensor as cells of width ``w`` from ``(x0, y0)``: first rows on top, counts below."""
    for r in range(len(offsets[0])):
        face = request_colour(r) if r < live_slots else "white"
        for k in (0, 1):
            bad = (k, r) in wrong
            ax.add_patch(Rectangle((x0 + r * w, y0 - k), w, 1, facecolor=face, alpha=0.85 if r < live_slots else 1,
                                   edgecolor=WRONG if bad else EDGE, lw=2.5 if bad else 0.8, gid="offset",
                                   zorder=3 if bad else 2))
            ax.text(x0 + (r + 0.5) * w, y0 - k + 0.5, str(offsets[k][r]), ha="center", va="center", fontsize=10,
                    color=WRONG if bad else "black", fontweight="bold" if bad else "normal", zorder=4)
        ax.text(x0 + (r + 0.5) * w, y0 + 1.15, f"request slot {r}" if w >= 2.6 else f"slot {r}", ha="center",
                va="bottom", fontsize=9, color=EDGE if r < live_slots else "#777777")
    if labels:
        ax.text(x0 - 0.3, y0 + 0.5, "[0, r] first row", ha="right", va="center", fontsize=9)
        ax.text(x0 - 0.3, y0 - 0.5, "[1, r] row count", ha="right", va="center", fontsize=9)


def _rows(ax, batch: ExtendBatch, y: float) -> None:
    """One cell per row at height ``y``, coloured by request slot; padding grey and hatched."""
    for slot, rows in enumerate(batch.row_ranges()):
        if rows:
            ax.add_patch(Rectangle((rows.start, y), len(rows), 1, facecolor=request_colour(slot), edgecolor=EDGE,
                                   lw=0.8, gid="live"))
    T, live = batch.num_rows, batch.live_rows
    if T > live:
        ax.add_patch(Rectangle((live, y), T - live, 1, facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///",
                               lw=0.8, gid="padding"))
        ax.text((live + T) / 2, y - 0.25, "padding: in no slot", ha="center", va="top", fontsize=9, color="#555555")
    for row in range(T + 1):
        if row % 4 == 0 or row == T:
            ax.text(row, y + 1.1, str(row), ha="center", va="bottom", fontsize=9, color="#555555")
    ax.text(-0.3, y + 0.5, "rows", ha="right", va="center", fontsize=9)


def _panel(ax, name: str, batch: ExtendBatch, cols: int) -> None:
    starts, counts = batch.extend_offsets.cpu().tolist()
    S, T = batch.request_slots, max(batch.num_rows, 1)
    w = T / max(cols, S)
    _table(ax, [starts, counts], batch.batch_size, 0.0, 3.2, w)
    _rows(ax, batch, 0.0)
    for r in range(S):
        target = (starts[r] if counts[r] else batch.live_rows, 1.0)
        ax.add_artist(ConnectionPatch((r * w + w / 2, 2.2), target, "data", "data", arrowstyle="-|>",
                                      mutation_scale=10, lw=1.0, color=request_colour(r) if counts[r] else "#888888",
                                      linestyle="-" if counts[r] else ":"))
    past = S - batch.batch_size
    note = f"{batch.batch_size} request(s), {batch.live_rows} live rows, {T if batch.num_rows else 0} rows"
    if past:
        which = f"request slot {S - 1}" if past == 1 else f"request slots {batch.batch_size}..{S - 1}"
        note += f"; {which} past the batch: count 0, first row {batch.live_rows}"
    ax.set_title(f"{name}: {note}", fontsize=10, loc="left")
    ax.set_xlim(-4.2 * T / 16, T + 0.5)
    ax.set_ylim(-0.9, 4.9)
    ax.set_axis_off()


def draw_offsets(batches: Mapping[str, ExtendBatch], *, title: str | None = None) -> Figure:
    """``low_ratio_extend_offsets`` of each batch above its rows, one panel a batch (name: title)."""
    if not batches or not all(isinstance(b, ExtendBatch) for b in batches.values()):
        raise ValueError("batches must be a non-empty dict of name -> ExtendBatch")
    cols = max(b.request_slots for b in batches.values())
    fig = Figure(figsize=(WIDTH, 2.3 * len(batches) + 0.4), layout="constrained")
    axes = fig.subplots(len(batches), 1, squeeze=False)[:, 0]
    for ax, (name, batch) in zip(axes, batches.items()):
        _panel(ax, name, batch, cols)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def draw_offsets_diff(got: torch.Tensor, want: torch.Tensor, *, title: str | None = None) -> Figure:
    """A ``[2, S]`` offsets tensor ``got`` beside the right one, the cells that differ in red."""
    g, w = got.detach().cpu().tolist(), want.detach().cpu().tolist()
    S = len(w[0])
    wrong = {(k, r) for k in (0, 1) for r in range(S) if g[k][r] != w[k][r]}
    live = sum(1 for c in w[1] if c) if any(w[1]) else 0
    fig = Figure(figsize=(WIDTH, 0.9 + 0.9 * 3.2), layout="constrained")
    ax = fig.subplots()
    width = 4.0
    for y0, table, marks, name in ((5.2, g, wrong, "yours"), (1.0, w, set(), "expected")):
        _table(ax, table, live, 0.0, y0, width, marks)
        ax.text(S * width + 0.5, y0, name, ha="left", va="center", fontsize=10, fontweight="bold")
    ax.set_xlim(-7.0, S * width + 4.0)
    ax.set_ylim(-0.3, 7.6)
    ax.set_axis_off()
    ax.set_title(title or f"{len(wrong)} cell(s) differ (red)", fontsize=10)
    return fig
