"""The block diagram of one source layer's c2 compressor, from ``x`` to both caches and the ring.

Like every picture of the package, :func:`draw_path` returns a :class:`matplotlib.figure.Figure`
made without pyplot and keeps to :mod:`c2graph.pictures.style`. Its blocks carry the ``gid``
``"block"``, its arrows ``"edge"``.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from ..compressor.config import Config
from .style import EDGE, MAX_WIDTH, MIN_FONT, legend_below

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
    fig = Figure(figsize=(MAX_WIDTH, 4.6), layout="constrained")
    ax = fig.add_subplot()
    for key, name, sub, kind, _, _ in _BLOCKS:
        x, y = pos[key]
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor=_KINDS[kind], edgecolor=EDGE, lw=1.0, gid="block"))
        ax.text(x, y + 0.17, name, ha="center", va="center", fontsize=10.5, fontweight="bold")
        ax.text(x, y - 0.22, sub, ha="center", va="center", fontsize=MIN_FONT)
    for a, b in _EDGES:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        start, end = _edge_point(xa, ya, xb, yb, bw, bh), _edge_point(xb, yb, xa, ya, bw, bh)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.1, color=EDGE,
                                     shrinkA=1, shrinkB=1, gid="edge"))
        if (a, b) in _EDGE_LABELS:
            label, offset, ha = _EDGE_LABELS[a, b]
            ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], label, ha=ha,
                    va="center", fontsize=MIN_FONT, color="#444444", linespacing=1.0)
    ax.set_xlim(-0.2, 5 * dx + bw + 0.2)
    ax.set_ylim(-2 * dy - 0.6, 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    sizes = (f" ({cfg.hidden} hidden, D = {cfg.D_nope} + {cfg.rope_dim} rope, I = {cfg.index_dim}, "
             f"ring_size {cfg.ring_size})" if cfg is not None else "")
    ax.set_title(title or f"one ratio-2 source layer{sizes}", fontsize=11)
    handles = [Patch(facecolor=c, edgecolor=EDGE, label=k) for k, c in
               (("tensor", _KINDS["data"]), ("operation", _KINDS["op"]), ("written by the batch", _KINDS["store"]))]
    legend_below(fig, handles, ncol=3)
    return fig


def _edge_point(x0, y0, x1, y1, bw, bh) -> tuple[float, float]:
    """Where the line from the centre ``(x0, y0)`` towards ``(x1, y1)`` leaves a ``bw`` x ``bh`` box."""
    dx, dy = x1 - x0, y1 - y0
    tx = (bw / 2) / abs(dx) if dx else float("inf")
    ty = (bh / 2) / abs(dy) if dy else float("inf")
    t = min(tx, ty)
    return x0 + dx * t, y0 + dy * t
