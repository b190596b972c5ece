"""Pictures of the c2 compressor: a ragged batch, the ring, the gate's weights (and the path
diagram of :mod:`c2graph.pictures.diagram`, re-exported here).

Every function returns a :class:`matplotlib.figure.Figure` made without pyplot (so nothing is
shown twice in a notebook and no global state is kept), is deterministic, reads the batch's row
plan (:meth:`~c2graph.compressor.batch.ExtendBatch.plan`), colours request slots with
:func:`~c2graph.pictures.style.request_colour`, and keeps to the size bounds of
:mod:`c2graph.pictures.style` (at most 12 inches wide, no text under 9 points). Artists the
tests count carry a ``gid``: ``"row"``, ``"group"``, ``"c2slot"``, ``"ring"``, ``"read"``,
``"park"``. In a notebook, ``%matplotlib inline`` (or importing pyplot) lets Jupyter show a
returned Figure; ``fig.savefig(path)`` writes it to a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.rows import BatchPlan, Partner, plan_rows
from .diagram import draw_path
from .style import (
    EDGE,
    FONT,
    MIN_FONT,
    MUTED,
    PADDING_COLOUR,
    REQUEST_COLOURS,
    SENTINEL_COLOUR,
    TITLE_FONT,
    figure_width,
    legend_below,
    plural,
    request_colour,
    request_label,
    spaced,
    text_colour,
    text_width,
)

__all__ = ["REQUEST_COLOURS", "PADDING_COLOUR", "draw_batch", "draw_gate_weights", "draw_path", "draw_ring",
           "request_colour"]

_Y_LABELS_INCHES = 1.7
"""About what the y tick labels and margins of a row picture take, beside its axes."""


def _points_per_unit(fig: Figure, units: float) -> float:
    """Points per data unit along x, for ``units`` data units across the axes."""
    return (fig.get_figwidth() - _Y_LABELS_INCHES) * 72.0 / max(units, 1.0)


def _request_boundaries(ax, plan: BatchPlan, y0: float, y1: float) -> None:
    """Dashed lines between requests and before the padding rows, over ``[y0, y1]`` (x: the row)."""
    batch = plan.batch
    for rows in plan.request_rows[1:] + [range(batch.live_rows, batch.num_rows)]:
        if rows and rows.start > 0:
            ax.plot([rows.start - 0.5] * 2, [y0, y1], ls="--", lw=1.0, color=EDGE, zorder=1)


def _draw_rows(ax, plan: BatchPlan, y: float, x_of, width: float, ppu: float, height: float = 0.7) -> None:
    """One rectangle per batch row at height ``y`` (``x_of(row)`` its centre, ``width`` wide, in
    data units of ``ppu`` points), coloured by request slot and labelled with its pos; padding
    rows grey, hatched and labelled ``pad``. Labels that would overlap are left out."""
    xs = [x_of(r.row) for r in plan.rows]
    texts = ["pad" if r.is_padding else str(r.pos) for r in plan.rows]
    keep = spaced(xs, texts, ppu)
    for r, x, text, shown in zip(plan.rows, xs, texts, keep):
        ax.add_patch(Rectangle((x - width / 2, y - height / 2), width, height, facecolor=request_colour(r.request_slot),
                               edgecolor=EDGE, hatch="///" if r.is_padding else None, lw=0.8, gid="row", zorder=2))
        if shown:
            box = dict(boxstyle="square,pad=0.05", facecolor=PADDING_COLOUR, lw=0) if r.is_padding else None
            ax.text(x, y, text, ha="center", va="center", fontsize=MIN_FONT if r.is_padding else FONT,
                    color=MUTED if r.is_padding else text_colour(request_colour(r.request_slot)), bbox=box, zorder=3)


def _request_labels(ax, plan: BatchPlan, y: float, ppu: float) -> list[Patch]:
    """Each request's request slot and ``req`` above its rows, in its colour, where they fit;
    legend entries for those that do not."""
    batch, missing = plan.batch, []
    for slot, (req, rows) in enumerate(zip(batch.requests, plan.request_rows)):
        if not rows:
            continue
        room = len(rows) * ppu - 4.0
        name, req_text = request_label(slot), f"req {req.pool_index}"
        for text in (f"{name}\n{req_text}", f"request\nslot {slot}\n{req_text}"):
            if text_width(text) <= room:
                ax.text((rows.start + rows.stop - 1) / 2, y, text, ha="center", va="bottom", fontsize=FONT,
                        color=request_colour(slot), fontweight="bold", linespacing=1.0)
                break
        else:
            missing.append(Patch(facecolor=request_colour(slot), edgecolor=EDGE, label=f"{name} ({req_text})"))
    pad = range(batch.live_rows, batch.num_rows)
    if pad and text_width("padding\n(no request)") <= len(pad) * ppu - 4.0:
        ax.text((pad.start + pad.stop - 1) / 2, y, "padding\n(no request)", ha="center", va="bottom",
                fontsize=FONT, color=MUTED, linespacing=1.0)
    return missing


def draw_batch(batch: ExtendBatch, ring_size: int, *, title: str | None = None) -> Figure:
    """A ragged extend batch: rows -> groups -> c2 slots.

    Top: one rectangle per row, coloured by request slot, with its ``pos``; padding rows grey and
    hatched; dashed lines at request boundaries. Middle: one bar per group, under the row that
    completes it (odd ``pos``) and its partner; a hatched bar when the partner is a ring row.
    Bottom: the c2 slot each group writes, with an arrow from the group. With many rows, labels
    that would overlap are left out (every row and bar is still drawn).
    """
    plan = plan_rows(batch, ring_size)
    T = batch.num_rows
    fig = Figure(figsize=(figure_width(0.3 * T + 2.4, 6.5), 4.4), layout="constrained")
    ax = fig.add_subplot()
    ppu = _points_per_unit(fig, T + 0.4)
    _request_boundaries(ax, plan, -0.45, 2.4)
    _draw_rows(ax, plan, 2.0, float, 0.9, ppu)
    missing = _request_labels(ax, plan, 2.45, ppu)
    groups = [r for r in plan.rows if r.completes_group]
    show_slot = spaced([float(r.row) for r in groups], [str(r.c2_slot) for r in groups], ppu)
    ring_labels = [f"ring\nrow {r.partner_ring_row}" if r.partner is Partner.RING else "" for r in groups]
    show_ring = spaced([float(r.row) for r in groups], ring_labels, ppu, MIN_FONT)
    for r, slot_label, ring_label in zip(groups, show_slot, show_ring):
        colour = request_colour(r.request_slot)
        from_ring = r.partner is Partner.RING
        left = r.row - 0.45 if from_ring else r.row - 1.45
        ax.add_patch(FancyBboxPatch((left, 0.85), r.row + 0.45 - left, 0.3,
                                    boxstyle="round,pad=0,rounding_size=0.12", facecolor=colour, edgecolor=EDGE,
                                    hatch="xx" if from_ring else None, lw=0.8, gid="group", alpha=0.85, zorder=2))
        if from_ring and ring_label:
            ax.text(r.row, 1.42, f"ring\nrow {r.partner_ring_row}", ha="center", va="center", fontsize=MIN_FONT,
                    color=EDGE, linespacing=0.95, bbox=dict(boxstyle="square,pad=0.1", facecolor="white", lw=0),
                    zorder=3)
        ax.add_patch(Rectangle((r.row - 0.45, -0.3), 0.9, 0.6, facecolor="white", edgecolor=colour,
                               lw=1.6, gid="c2slot", zorder=2))
        if slot_label:
            ax.text(r.row, 0.0, str(r.c2_slot), ha="center", va="center", fontsize=FONT, zorder=3)
        ax.add_patch(FancyArrowPatch(((left + r.row + 0.45) / 2, 0.85), (r.row, 0.3), arrowstyle="-|>",
                                     mutation_scale=8, lw=0.9, color=EDGE, shrinkA=0, shrinkB=1, zorder=3))
    ax.set_xlim(-0.7, T - 0.3)
    ax.set_ylim(-0.55, 3.35)
    ax.set_yticks([0.0, 1.0, 2.0], ["c2 slot\n(raw_out_loc // 2)", "groups\n(odd pos completes)", "rows\n(pos)"])
    ax.set_xticks(_row_ticks(T, ppu))
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("row of the flattened batch")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    n_groups = len(groups)
    padding = f", {plural(T - batch.live_rows, 'padding row')}" if T > batch.live_rows else ""
    ax.set_title(title or f"{plural(batch.batch_size, 'request')}, {plural(batch.live_rows, 'live row')}{padding}: "
                 f"{plural(n_groups, 'group')} write {plural(n_groups, 'c2 slot')}", fontsize=TITLE_FONT)
    handles = [
        Patch(facecolor="#999999", edgecolor=EDGE, label="group: partner is the previous row"),
        Patch(facecolor="white", edgecolor=EDGE, lw=1.6, label="c2 slot the group writes"),
    ]
    if plan.ring_reads:
        ring_label = "group: partner read from the ring"
        handles.insert(1, Patch(facecolor="#999999", edgecolor=EDGE, hatch="xx", label=ring_label))
    if T > batch.live_rows:
        pad_label = "padding row: writes nothing"
        handles.insert(0, Patch(facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///", label=pad_label))
    legend_below(fig, missing + handles)
    return fig


def _row_ticks(T: int, ppu: float) -> range:
    """Row numbers along the x axis, every row or every few rows so that they do not overlap."""
    step = 1
    while step < T and text_width(str(T - 1)) + 4.0 > step * ppu:
        step *= 2
    return range(0, T, step)


def _check_pool_requests(pool_requests, *batches: ExtendBatch | None) -> None:
    needed = 1 + max((r.pool_index for b in batches if b is not None for r in b.requests), default=0)
    if isinstance(pool_requests, bool) or not isinstance(pool_requests, int) or pool_requests < needed:
        raise ValueError(
            f"pool_requests = {pool_requests!r}; expected an int >= {needed} (the batch has pool_index {needed - 1})"
        )


def draw_ring(
    batch: ExtendBatch,
    pool_requests: int,
    ring_size: int,
    *,
    previous: ExtendBatch | None = None,
    title: str | None = None,
) -> Figure:
    """The ring around one batch: the ring before it (top), the batch's rows (middle), the ring after.

    The ring has ``ring_size`` rows per pool request (``pool_requests`` of them) and one sentinel
    row at the end. Arrows down from the top strip: the ring row an odd first row reads its partner
    from (every read happens before any write). Arrows down to the bottom strip: each request's
    last ``min(rows, ring_size)`` rows parked at ``req * ring_size + pos % ring_size``. With
    ``previous`` (the batch before this one), the top strip says which pos each ring row holds.
    Ring rows are coloured by the request slot their request has in ``batch``.
    """
    _check_pool_requests(pool_requests, batch, previous)
    plan = plan_rows(batch, ring_size)
    n_ring = pool_requests * ring_size + 1
    T = batch.num_rows
    W = float(max(T, 1.6 * n_ring, 8))
    row_w, ring_w = W / max(T, 1), W / n_ring
    x_row = lambda row: (row + 0.5) * row_w  # noqa: E731
    x_ring = lambda k: (k + 0.5) * ring_w  # noqa: E731

    slot_of = {r.pool_index: slot for slot, r in enumerate(batch.requests)}
    held: dict[int, tuple[int | None, int]] = {}  # ring row -> (request slot in `batch`, for the colour; pos)
    if previous is not None:
        prev = plan_rows(previous, ring_size)
        held = {k: (slot_of.get(prev.rows[row].req), prev.rows[row].pos) for k, row in prev.parked.items()}
    after = dict(held)
    after.update({k: (plan.rows[row].request_slot, plan.rows[row].pos) for k, row in plan.parked.items()})

    fig = Figure(figsize=(figure_width(0.3 * W + 2.2, 7.0), 4.9), layout="constrained")
    ax = fig.add_subplot()
    ppu = _points_per_unit(fig, W + 0.4)
    for y, contents, fresh in ((2.0, held, {}), (0.0, after, plan.parked)):
        _draw_ring_strip(ax, y, contents, fresh, pool_requests, ring_size, x_ring, ring_w, ppu)
    _draw_rows(ax, plan, 1.0, x_row, 0.9 * row_w, ppu, 0.5)
    for row, k in plan.ring_reads.items():
        ax.add_patch(FancyArrowPatch((x_ring(k), 1.72), (x_row(row), 1.27), arrowstyle="-|>", mutation_scale=10,
                                     lw=1.4, ls="--", color=request_colour(plan.rows[row].request_slot), gid="read",
                                     zorder=4))
    for k, row in plan.parked.items():
        ax.add_patch(FancyArrowPatch((x_row(row), 0.73), (x_ring(k), 0.28), arrowstyle="-|>", mutation_scale=10,
                                     lw=1.4, color=request_colour(plan.rows[row].request_slot), gid="park", zorder=4))
    ax.set_xlim(-0.2, W + 0.2)
    ax.set_ylim(-0.8, 2.8)
    ax.set_yticks([0.0, 1.0, 2.0], ["ring after\nthe batch", "batch rows\n(pos)", "ring before\nthe batch"])
    ax.set_xticks([])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title or f"ring: {ring_size} rows per pool request + 1 sentinel; "
                 f"{plural(len(plan.ring_reads), 'read')}, then {plural(len(plan.parked), 'parked row')}",
                 fontsize=TITLE_FONT)
    handles = [
        Line2D([], [], color=EDGE, ls="--", lw=1.4, label="read: odd first row's partner (before any write)"),
        Line2D([], [], color=EDGE, lw=1.4, label="park: a request's last ring_size rows"),
        Patch(facecolor=SENTINEL_COLOUR, edgecolor=EDGE, label="sentinel (kv 0, score -inf)"),
    ]
    legend_below(fig, handles)
    return fig


def _draw_ring_strip(ax, y, contents, fresh, pool_requests, ring_size, x_ring, ring_w, ppu) -> None:
    """One strip of ring rows at height ``y``; ``contents[k] = (request slot, pos)`` for known rows,
    drawn solid when in ``fresh`` (written by this batch) and pale otherwise."""
    n_ring = pool_requests * ring_size + 1
    above = y > 1
    texts, inks = [], []
    for k in range(n_ring):
        if k == n_ring - 1:
            face, alpha, text = SENTINEL_COLOUR, 1.0, "sentinel"
        elif k in contents:
            slot, pos = contents[k]
            face = "#999999" if slot is None else request_colour(slot)
            alpha, text = (1.0 if k in fresh else 0.35), f"pos {pos}"
        else:
            face, alpha, text = "white", 1.0, ""
        ax.add_patch(Rectangle((x_ring(k) - 0.45 * ring_w, y - 0.25), 0.9 * ring_w, 0.5, facecolor=face, alpha=alpha,
                               edgecolor=EDGE, lw=0.8, gid="ring", zorder=2))
        texts.append(text)
        inks.append(text_colour(face) if alpha == 1.0 else "black")
    xs = [x_ring(k) for k in range(n_ring)]
    for x, text, ink, shown in zip(xs, texts, inks, spaced(xs, texts, ppu)):
        if shown:
            ax.text(x, y, text, ha="center", va="center", fontsize=FONT, color=ink, zorder=3)
    indices = [str(k) for k in range(n_ring)]
    for x, text, shown in zip(xs, indices, spaced(xs, indices, ppu, MIN_FONT)):
        if shown:
            ax.text(x, y + 0.3 if above else y - 0.3, text, ha="center", va="bottom" if above else "top",
                    fontsize=MIN_FONT, color=MUTED)
    for p in range(pool_requests):
        x = (x_ring(p * ring_size) + x_ring(p * ring_size + ring_size - 1)) / 2
        if text_width(f"req {p}") <= ring_size * ring_w * ppu:
            ax.text(x, y + 0.55 if above else y - 0.55, f"req {p}", ha="center", va="bottom" if above else "top",
                    fontsize=FONT)
        if p:
            edge = x_ring(p * ring_size) - 0.5 * ring_w
            ax.plot([edge, edge], [y - 0.3, y + 0.3], color=EDGE, lw=1.6, zorder=3)


def draw_gate_weights(w0: torch.Tensor, group_pos: Sequence[int] | None = None, *, title: str | None = None) -> Figure:
    """Heatmap of the gate's partner weight ``w0`` (``[G, D]``, values in ``[0, 1]``): groups down, channels across.

    ``w0 = softmax(score_prev, score)[0]`` per channel; ``1 - w0`` weights the row that completes
    the group. 0.5 (white) is an even mix. ``group_pos`` labels each group by its group position.
    """
    if not isinstance(w0, torch.Tensor) or w0.dim() != 2:
        shape = tuple(w0.shape) if isinstance(w0, torch.Tensor) else type(w0).__name__
        raise ValueError(f"w0 has shape {shape}; expected [groups, D]")
    G, D = w0.shape
    if group_pos is not None and len(group_pos) != G:
        raise ValueError(f"group_pos has {len(group_pos)} entries; expected one per group ({G})")
    fig = Figure(figsize=(figure_width(0.22 * D + 2.5), max(2.4, 0.42 * G + 1.4)), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(w0.detach().float().cpu().numpy(), cmap="PuOr", vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    labels = [f"pos {p}, {p + 1}" for p in group_pos] if group_pos is not None else [f"group {g}" for g in range(G)]
    ax.set_yticks(range(G), labels)
    step = 2  # channel numbers every `step` channels, as many as fit side by side
    while D / step * (text_width(str(D)) + 6.0) > (fig.get_figwidth() - 3.0) * 72.0:
        step *= 2
    ax.set_xticks(range(0, D, step))
    ax.set_xlabel("channel")
    ax.set_ylabel("group")
    cbar = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cbar.set_label("w0: weight of the\npartner (even) row", fontsize=FONT)
    ax.set_title(title or "the gate: one softmax per channel, so each channel mixes the pair differently",
                 fontsize=TITLE_FONT)
    return fig
