"""Pictures of the c2 compressor: the whole path, a ragged batch, the ring, the gate's weights.

Every function returns a :class:`matplotlib.figure.Figure` made without pyplot (so nothing is
shown twice in a notebook and no global state is kept), is deterministic, and uses the
Okabe-Ito palette, which stays distinct under the common colour-vision deficiencies.
Artists the tests count carry a ``gid``: ``"row"``, ``"group"``, ``"c2slot"``, ``"ring"``,
``"read"``, ``"park"``, ``"block"``, ``"edge"``. In a notebook, ``%matplotlib inline`` (or importing pyplot)
lets Jupyter show a returned Figure; ``fig.savefig(path)`` writes it to a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from .explorer import BatchExplanation, explain

# Okabe-Ito, without black (kept for edges and text) and yellow (too light on white).
REQUEST_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7")
PADDING_COLOUR = "#DDDDDD"
SENTINEL_COLOUR = "#BBBBBB"
EDGE = "#333333"


def request_colour(slot: int) -> str:
    """The colour of request slot ``slot`` in every picture."""
    return REQUEST_COLOURS[slot % len(REQUEST_COLOURS)]


def _font(n_cells: int) -> float:
    """Label size for ``n_cells`` cells across a figure (which widens with them, up to a cap)."""
    return 9.0 if n_cells <= 24 else 8.0 if n_cells <= 40 else 7.0


def _small(n_cells: int) -> float:
    return max(6.5, _font(n_cells) - 1.5)


def _n(count: int, word: str) -> str:
    """``3 rows``, ``1 row``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _legend(fig: Figure, handles: list) -> None:
    """The legend under the axes: in one line when the figure is wide enough, else in two."""
    ncol = len(handles) if fig.get_figwidth() >= 9.5 else 2
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)


def _request_boundaries(ax, ex: BatchExplanation, y0: float, y1: float) -> None:
    """Dashed lines between requests and before the padding rows, over ``[y0, y1]``."""
    for rows in ex.batch.row_ranges()[1:] + [range(ex.batch.live_rows, ex.batch.num_rows)]:
        if rows and rows.start > 0:
            ax.plot([rows.start - 0.5] * 2, [y0, y1], ls="--", lw=1.0, color=EDGE, zorder=1)


def _draw_rows(ax, ex: BatchExplanation, y: float, x_of, width: float, height: float = 0.7) -> None:
    """One rectangle per batch row at height ``y`` (``x_of(row)`` its centre), labelled with its pos."""
    fs = _font(ex.batch.num_rows)
    for r in ex.rows:
        x = x_of(r.row)
        if r.is_padding:
            face, hatch, text = PADDING_COLOUR, "///", "pad"
        else:
            face, hatch, text = request_colour(r.request_slot), None, str(r.pos)
        ax.add_patch(Rectangle((x - width / 2, y - height / 2), width, height, facecolor=face,
                               edgecolor=EDGE, hatch=hatch, lw=0.8, gid="row", zorder=2))
        box = dict(boxstyle="square,pad=0.05", facecolor=PADDING_COLOUR, lw=0) if r.is_padding else None
        ax.text(x, y, text, ha="center", va="center", fontsize=_small(ex.batch.num_rows) if r.is_padding else fs,
                color="#555555" if r.is_padding else "black", bbox=box, zorder=3)


def _request_labels(ax, ex: BatchExplanation, y: float, x_of) -> None:
    fs = _font(ex.batch.num_rows) - 0.5
    for slot, (req, rows) in enumerate(zip(ex.batch.requests, ex.batch.row_ranges())):
        if rows:
            x = (x_of(rows.start) + x_of(rows.stop - 1)) / 2
            ax.text(x, y, f"slot {slot}\nreq {req.pool_index}", ha="center", va="bottom",
                    fontsize=fs, color=request_colour(slot), fontweight="bold", linespacing=1.0)
    pad = range(ex.batch.live_rows, ex.batch.num_rows)
    if pad:
        ax.text((x_of(pad.start) + x_of(pad.stop - 1)) / 2, y, "padding\n(no request)", ha="center",
                va="bottom", fontsize=fs, color="#666666", linespacing=1.0)


def draw_batch(batch: ExtendBatch, ring_size: int, *, title: str | None = None) -> Figure:
    """A ragged extend batch: rows -> groups -> c2 slots.

    Top: one rectangle per row, coloured by request slot, with its ``pos``; padding rows grey and
    hatched; dashed lines at request boundaries. Middle: one bar per group, under the row that
    completes it (odd ``pos``) and its partner; a hatched bar when the partner is a ring row.
    Bottom: the c2 slot each group writes, with an arrow from the group.
    """
    ex = explain(batch, ring_size)
    T = batch.num_rows
    fs = _small(T)
    fig = Figure(figsize=(min(15.0, max(6.5, 0.3 * T + 2.2)), 4.2), layout="constrained")
    ax = fig.add_subplot()
    ident = lambda row: float(row)  # noqa: E731
    _request_boundaries(ax, ex, -0.45, 2.4)
    _draw_rows(ax, ex, 2.0, ident, 0.9)
    _request_labels(ax, ex, 2.45, ident)
    for r in ex.rows:
        if not r.completes_group:
            continue
        colour = request_colour(r.request_slot)
        from_ring = r.partner_ring_row is not None
        left = r.row - 0.45 if from_ring else r.row - 1.45
        ax.add_patch(FancyBboxPatch((left, 0.85), r.row + 0.45 - left, 0.3,
                                    boxstyle="round,pad=0,rounding_size=0.12", facecolor=colour, edgecolor=EDGE,
                                    hatch="xx" if from_ring else None, lw=0.8, gid="group", alpha=0.85, zorder=2))
        if from_ring:
            ax.text(r.row, 1.42, f"ring\nrow {r.partner_ring_row}", ha="center", va="center", fontsize=fs,
                    color=EDGE, linespacing=0.95, bbox=dict(boxstyle="square,pad=0.1", facecolor="white", lw=0),
                    zorder=3)
        ax.add_patch(Rectangle((r.row - 0.45, -0.3), 0.9, 0.6, facecolor="white", edgecolor=colour,
                               lw=1.6, gid="c2slot", zorder=2))
        ax.text(r.row, 0.0, str(r.c2_slot), ha="center", va="center", fontsize=_font(T), zorder=3)
        ax.add_patch(FancyArrowPatch(((left + r.row + 0.45) / 2, 0.85), (r.row, 0.3), arrowstyle="-|>",
                                     mutation_scale=8, lw=0.9, color=EDGE, shrinkA=0, shrinkB=1, zorder=3))
    ax.set_xlim(-0.7, T - 0.3)
    ax.set_ylim(-0.55, 3.05)
    ax.set_yticks([0.0, 1.0, 2.0], ["c2 slot\n(raw_out_loc // 2)", "groups\n(odd pos completes)", "rows\n(pos)"])
    step = 1 if T <= 32 else 2
    ax.set_xticks(range(0, T, step))
    ax.tick_params(axis="x", labelsize=fs)
    ax.set_xlabel("row of the flattened batch")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    groups = len(ex.group_rows)
    padding = f", {_n(T - batch.live_rows, 'padding row')}" if T > batch.live_rows else ""
    ax.set_title(title or f"{_n(batch.batch_size, 'request')}, {_n(batch.live_rows, 'live row')}{padding}: "
                 f"{_n(groups, 'group')} write {_n(groups, 'c2 slot')}", fontsize=10)
    handles = [
        Patch(facecolor="#999999", edgecolor=EDGE, label="group: partner is the previous row"),
        Patch(facecolor="white", edgecolor=EDGE, lw=1.6, label="c2 slot the group writes"),
    ]
    if ex.ring_reads:
        ring_label = "group: partner read from the ring"
        handles.insert(1, Patch(facecolor="#999999", edgecolor=EDGE, hatch="xx", label=ring_label))
    if T > batch.live_rows:
        pad_label = "padding row: writes nothing"
        handles.insert(0, Patch(facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///", label=pad_label))
    _legend(fig, handles)
    return fig


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
    """
    ex = explain(batch, ring_size, pool_requests)
    n_ring = pool_requests * ring_size + 1
    T = batch.num_rows
    W = float(max(T, 1.6 * n_ring, 8))
    row_w, ring_w = W / max(T, 1), W / n_ring
    x_row = lambda row: (row + 0.5) * row_w  # noqa: E731
    x_ring = lambda k: (k + 0.5) * ring_w  # noqa: E731

    held: dict[int, tuple[int | None, int]] = {}  # ring row -> (request slot in `batch`, for the colour; pos)
    if previous is not None:
        prev = explain(previous, ring_size, pool_requests)
        held = {k: (_slot_of(batch, prev.rows[row].req), prev.rows[row].pos) for k, row in prev.parked.items()}
    after = dict(held)
    after.update({k: (ex.rows[row].request_slot, ex.rows[row].pos) for k, row in ex.parked.items()})

    fig = Figure(figsize=(min(15.0, max(7.0, 0.3 * W + 2.2)), 4.8), layout="constrained")
    ax = fig.add_subplot()
    for y, contents, fresh in ((2.0, held, {}), (0.0, after, ex.parked)):
        _draw_ring_strip(ax, y, contents, fresh, pool_requests, ring_size, x_ring, ring_w)
    _draw_rows(ax, ex, 1.0, x_row, 0.9 * row_w, 0.5)
    for row, k in ex.ring_reads.items():
        colour = request_colour(ex.rows[row].request_slot)
        ax.add_patch(FancyArrowPatch((x_ring(k), 1.72), (x_row(row), 1.27), arrowstyle="-|>", mutation_scale=10,
                                     lw=1.4, ls="--", color=colour, gid="read", zorder=4))
    for k, row in ex.parked.items():
        colour = request_colour(ex.rows[row].request_slot)
        ax.add_patch(FancyArrowPatch((x_row(row), 0.73), (x_ring(k), 0.28), arrowstyle="-|>", mutation_scale=10,
                                     lw=1.4, color=colour, gid="park", zorder=4))
    ax.set_xlim(-0.2, W + 0.2)
    ax.set_ylim(-0.75, 2.75)
    ax.set_yticks([0.0, 1.0, 2.0], ["ring after\nthe batch", "batch rows\n(pos)", "ring before\nthe batch"])
    ax.set_xticks([])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title or f"ring: {ring_size} rows per pool request + 1 sentinel; "
                 f"{_n(len(ex.ring_reads), 'read')}, then {_n(len(ex.parked), 'parked row')}", fontsize=10)
    handles = [
        Line2D([], [], color=EDGE, ls="--", lw=1.4, label="read: odd first row's partner (before any write)"),
        Line2D([], [], color=EDGE, lw=1.4, label="park: a request's last ring_size rows"),
        Patch(facecolor=SENTINEL_COLOUR, edgecolor=EDGE, label="sentinel (kv 0, score -inf)"),
    ]
    _legend(fig, handles)
    return fig


def _slot_of(batch: ExtendBatch, pool_index: int) -> int | None:
    """The request slot of ``pool_index`` in ``batch`` (for its colour), or ``None``."""
    for slot, r in enumerate(batch.requests):
        if r.pool_index == pool_index:
            return slot
    return None


def _draw_ring_strip(ax, y, contents, fresh, pool_requests, ring_size, x_ring, ring_w) -> None:
    """One strip of ring rows at height ``y``; ``contents[k] = (colour slot, pos)`` for known rows,
    drawn solid when in ``fresh`` (written by this batch) and pale otherwise."""
    n_ring = pool_requests * ring_size + 1
    for k in range(n_ring):
        x = x_ring(k)
        if k == n_ring - 1:
            face, alpha, text = SENTINEL_COLOUR, 1.0, "sentinel"
        elif k in contents:
            slot, pos = contents[k]
            face = "#999999" if slot is None else request_colour(slot)
            alpha, text = (1.0 if k in fresh else 0.35), f"pos {pos}"
        else:
            face, alpha, text = "white", 1.0, ""
        ax.add_patch(Rectangle((x - 0.45 * ring_w, y - 0.25), 0.9 * ring_w, 0.5, facecolor=face, alpha=alpha,
                               edgecolor=EDGE, lw=0.8, gid="ring", zorder=2))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5, zorder=3)
        label_y = y + 0.3 if y > 1 else y - 0.3
        ax.text(x, label_y, str(k), ha="center", va="bottom" if y > 1 else "top", fontsize=7.5, color="#555555")
    for p in range(pool_requests):
        x = (x_ring(p * ring_size) + x_ring(p * ring_size + ring_size - 1)) / 2
        label_y = y + 0.52 if y > 1 else y - 0.52
        ax.text(x, label_y, f"req {p}", ha="center", va="bottom" if y > 1 else "top", fontsize=8)
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
    fig = Figure(figsize=(min(12.0, max(6.0, 0.22 * D + 2.5)), max(2.4, 0.42 * G + 1.4)), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(w0.detach().float().cpu().numpy(), cmap="PuOr", vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    labels = [f"pos {p}, {p + 1}" for p in group_pos] if group_pos is not None else [f"group {g}" for g in range(G)]
    ax.set_yticks(range(G), labels)
    ax.set_xticks(range(0, D, 4 if D > 32 else 2))
    ax.set_xlabel("channel")
    ax.set_ylabel("group")
    cbar = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cbar.set_label("w0: weight of the\npartner (even) row", fontsize=8)
    ax.set_title(title or "the gate: one softmax per channel, so each channel mixes the pair differently", fontsize=10)
    return fig


# The path diagram: (key, title, subtitle, kind, column, row) of each block.
_KINDS = {"data": "#CFE8F7", "op": "#FBE3B8", "store": "#C7EBDD"}
_BLOCKS = (
    ("x", "x", "[T, hidden] bf16", "data", 0, 0),
    ("proj", "source projection", "one GEMM with wkv_gate", "op", 1, 0),
    ("kvs", "| kv | score |", "[T, 2D] fp32", "data", 2, 0),
    ("pair", "pair", "previous row or ring", "op", 3, 0),
    ("gate", "gate", "per-channel softmax", "op", 4, 0),
    ("norm", "RMSNorm", "over D, -> bf16", "op", 5, 0),
    ("ring", "ring", "[req*R + pos % R] fp32", "store", 1.5, 1),
    ("latent", "latent", "pre-RoPE, [T, D] bf16", "data", 5, 1),
    ("rope", "RoPE", "rope dims, group pos", "op", 4, 1),
    ("kvc", "kv_cache", "[c2 slot], odd rows", "store", 3, 1),
    ("wk", "wk", "D -> I, -> bf16", "op", 5, 2),
    ("knorm", "k_norm", "RMSNorm over I", "op", 4, 2),
    ("krope", "RoPE", "rope dims, group pos", "op", 3, 2),
    ("idx", "index_k", "[c2 slot], odd rows", "store", 2, 2),
)
_EDGES = (
    ("x", "proj"), ("proj", "kvs"), ("kvs", "pair"), ("pair", "gate"), ("gate", "norm"), ("norm", "latent"),
    ("latent", "rope"), ("rope", "kvc"), ("latent", "wk"), ("wk", "knorm"), ("knorm", "krope"), ("krope", "idx"),
    ("kvs", "ring"), ("ring", "pair"),
)
# edge -> (label, offset from the arrow's middle, horizontal alignment)
_EDGE_LABELS = {
    ("kvs", "ring"): ("park: each request's\nlast ring_size rows", (-0.2, 0.0), "right"),
    ("ring", "pair"): ("read: partner of an\nodd first row", (0.25, -0.1), "left"),
}


def draw_path(cfg: Config | None = None, *, title: str | None = None) -> Figure:
    """Block diagram of one source layer's c2 compressor, from ``x`` to both caches and the ring.

    Blue: tensors; orange: operations; green: what the batch writes (caches, ring). With ``cfg``
    the title gives its sizes.
    """
    bw, bh, dx, dy = 2.7, 1.0, 3.2, 1.9
    pos = {key: (col * dx + bw / 2, -row * dy) for key, _, _, _, col, row in _BLOCKS}
    fig = Figure(figsize=(13.0, 4.6), layout="constrained")
    ax = fig.add_subplot()
    for key, name, sub, kind, _, _ in _BLOCKS:
        x, y = pos[key]
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor=_KINDS[kind], edgecolor=EDGE, lw=1.0, gid="block"))
        ax.text(x, y + 0.15, name, ha="center", va="center", fontsize=10.5, fontweight="bold")
        ax.text(x, y - 0.22, sub, ha="center", va="center", fontsize=8)
    for a, b in _EDGES:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        start, end = _edge_point(xa, ya, xb, yb, bw, bh), _edge_point(xb, yb, xa, ya, bw, bh)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.1, color=EDGE,
                                     shrinkA=1, shrinkB=1, gid="edge"))
        if (a, b) in _EDGE_LABELS:
            label, offset, ha = _EDGE_LABELS[a, b]
            ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], label, ha=ha,
                    va="center", fontsize=8, color="#444444", linespacing=1.0)
    ax.set_xlim(-0.2, 5 * dx + bw + 0.2)
    ax.set_ylim(-2 * dy - 0.6, 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    sizes = (f" ({cfg.hidden} hidden, D = {cfg.D_nope} + {cfg.rope_dim} rope, I = {cfg.index_dim}, "
             f"ring_size {cfg.ring_size})" if cfg is not None else "")
    ax.set_title(title or f"one ratio-2 source layer{sizes}", fontsize=11)
    handles = [Patch(facecolor=c, edgecolor=EDGE, label=k) for k, c in
               (("tensor", _KINDS["data"]), ("operation", _KINDS["op"]), ("written by the batch", _KINDS["store"]))]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8.5, frameon=False)
    return fig


def _edge_point(x0, y0, x1, y1, bw, bh) -> tuple[float, float]:
    """Where the line from the centre ``(x0, y0)`` towards ``(x1, y1)`` leaves a ``bw`` x ``bh`` box."""
    dx, dy = x1 - x0, y1 - y0
    tx = (bw / 2) / abs(dx) if dx else float("inf")
    ty = (bh / 2) / abs(dy) if dy else float("inf")
    t = min(tx, ty)
    return x0 + dx * t, y0 + dy * t
