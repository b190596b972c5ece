"""Pictures of the prefill graph: its static buffers, its list of nodes, and which slots a replay got wrong.

- :func:`draw_static_buffers`: every buffer a :class:`~c2graph.prefill.runner.PrefillGraphRunner`
  allocated once, sized for its largest bucket, with each bucket's extent marked and the rows of
  the batch being replayed (live rows by request slot, padding rows, rows past the bucket);
- :func:`draw_graph_nodes`: captured graphs as their lists of nodes, one cell per node in launch
  order, next to the counts grouped by op (or kernel) name;
- :func:`draw_wrong_slots`: after a replay, the c2 slots the batch writes and the ring rows it
  parks, each drawn by how the graph's result compares with eager's
  (:func:`~c2graph.measure.slots.compare_slots`), under the request slot that writes it.

As in :mod:`c2graph.pictures.draw`, every function returns a :class:`matplotlib.figure.Figure`
made without pyplot, is deterministic, and keeps to :mod:`c2graph.pictures.style`: hue means a
request slot; a slot's state is drawn in greys and hatching. Artists the tests count carry a
``gid``: ``"buffer"``, ``"live"``, ``"padding"``, ``"stale"``, ``"bucket"``, ``"offset"``
(static buffers); ``"node"``, ``"count"`` (node lists); ``"slot"``, ``"ring"``, ``"why"`` (wrong
slots).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.pools import POISON, Pools
from ..prefill.runner import PrefillGraphRunner
from ..measure.slots import DIFFERS, EQUAL, NEVER_WRITTEN, SlotState, compare_slots
from .style import (
    CATEGORY_COLOURS,
    EDGE,
    FONT,
    MIN_FONT,
    MUTED,
    PADDING_COLOUR,
    TITLE_FONT,
    figure_width,
    legend_below,
    plural,
    request_colour,
    request_label,
    spaced,
    text_width,
)

__all__ = ["compare_slots", "draw_graph_nodes", "draw_static_buffers", "draw_wrong_slots", "node_label"]

STATE_COLOURS = {EQUAL: "#FFFFFF", DIFFERS: "#1A1A1A", NEVER_WRITTEN: "#A6A6A6"}
"""A slot's face by its state: white, near-black, grey (also hatched). No hue: hue is the request slot's."""
STATE_LABELS = {
    EQUAL: "equal to eager (bitwise)",
    DIFFERS: "differs from eager",
    NEVER_WRITTEN: "never written: still the poison",
}
STALE_COLOUR = "#F2F2F2"
OTHER_COLOUR = "#D0D0D0"
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "int64", torch.int32: "int32"}


# ---------------------------------------------------------------------------------------------
# (a) the static buffers


def _buffers(runner: PrefillGraphRunner) -> list[tuple[str, torch.Tensor, str]]:
    """``(name, tensor, what it holds)`` of every per-row static buffer, top to bottom."""
    s = runner.static
    if runner.path == "fused":
        projection = [("projected", s.projected, "| kv | score |")]
    else:
        projection = [("kv", s.kv, "projection: kv"), ("score", s.score, "projection: score")]
    return projection + [
        ("pos", s.pos, "absolute position"),
        ("req", s.req, "pool index"),
        ("raw_out_loc", s.raw_out_loc, "0: padding"),
        ("c2_slot", s.c2_slot, "where a group stores"),
        ("latent", s.latent, "pre-RoPE latents"),
    ]


def _shape(t: torch.Tensor) -> str:
    return f"[{', '.join(map(str, t.shape))}] {_DTYPES.get(t.dtype, str(t.dtype))}"


def draw_static_buffers(runner: PrefillGraphRunner, batch: ExtendBatch | None = None, *,
                        title: str | None = None) -> Figure:
    """The runner's static buffers: one bar per buffer, ``max(buckets)`` rows long.

    Dashed lines mark where each bucket's graph stops reading (each bucket uses the first
    ``bucket`` rows of every buffer). With ``batch`` (the padded batch of a replay, as
    :meth:`PrefillGraphRunner.run` returns it in ``step.batch``): its live rows coloured by request
    slot, its padding rows up to the bucket grey and hatched, and the rows past the bucket pale:
    they keep whatever an earlier batch left, and this bucket's graph never reads them. Below, the
    ``[2, request_slots]`` extend offsets, one column per request slot.
    """
    buckets, T = runner.buckets, runner.buckets[-1]
    if batch is not None and batch.num_rows not in buckets:
        raise ValueError(
            f"batch has {batch.num_rows} rows; expected the padded batch of a replay, with a bucket's "
            f"row count (one of {buckets})"
        )
    bucket = batch.num_rows if batch is not None else None
    bufs = _buffers(runner)
    fig = Figure(figsize=(figure_width(11.0), 0.45 * len(bufs) + 3.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[len(bufs) + 1.8, 2.8])
    label_units = T * 0.5  # room left of the bars for the buffer names, right of them for what they hold
    for i, (name, tensor, what) in enumerate(bufs):
        y = len(bufs) - 1 - i
        top.add_patch(Rectangle((0, y - 0.35), T, 0.7, facecolor="white", edgecolor=EDGE, lw=0.9,
                                gid="buffer", zorder=1))
        if batch is not None:
            _fill_rows(top, batch, y, T)
        top.text(-0.01 * T, y, f"{name}  {_shape(tensor)}", ha="right", va="center", fontsize=MIN_FONT,
                 family="monospace")
        top.text(1.01 * T, y, what, ha="left", va="center", fontsize=MIN_FONT, color=MUTED)
    for b in buckets:
        chosen = b == bucket
        top.plot([b, b], [-0.6, len(bufs) - 0.4], ls="--" if not chosen else "-", lw=2.0 if chosen else 1.0,
                 color=EDGE, gid="bucket", zorder=4)
        top.text(b, len(bufs) - 0.3, f"bucket {b}", ha="right", va="bottom", fontsize=MIN_FONT,
                 fontweight="bold" if chosen else "normal")
    if batch is not None:
        ppu = (fig.get_figwidth() * 72.0 * 0.95) / (T + 2 * label_units)
        for slot, (req, rows) in enumerate(zip(batch.requests, batch.row_ranges())):
            text = f"{request_label(slot)}\nreq {req.pool_index}"
            if rows and text_width(text, MIN_FONT) <= len(rows) * ppu:
                top.text((rows.start + rows.stop) / 2, -0.65, text, ha="center", va="top", fontsize=MIN_FONT,
                         color=request_colour(slot), fontweight="bold", linespacing=0.95)
    top.set_xlim(-label_units, T + label_units)
    top.set_ylim(-1.5, len(bufs) + 0.3)
    top.set_xticks(sorted({0, *buckets}))
    top.tick_params(axis="x", labelsize=MIN_FONT)
    top.set_yticks([])
    for side in ("top", "right", "left"):
        top.spines[side].set_visible(False)
    top.spines["bottom"].set_bounds(0, T)
    _draw_offsets(bottom, runner, batch)
    if title is None:
        title = f"static buffers of a {runner.path}-path prefill graph, sized for the largest bucket ({T} rows)"
        if batch is not None:
            title += (f":\n{plural(batch.batch_size, 'request')}, {plural(batch.live_rows, 'live row')} replayed "
                      f"in bucket {bucket}")
    top.set_title(title, fontsize=TITLE_FONT)
    handles = [Patch(facecolor=request_colour(0), edgecolor=EDGE, label="live rows (colour: request slot)"),
               Patch(facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///",
                     label="padding rows up to the bucket: write nothing"),
               Patch(facecolor=STALE_COLOUR, edgecolor=EDGE, label="past the bucket: stale, not read")]
    legend_below(fig, handles, ncol=2)
    return fig


def _fill_rows(ax, batch: ExtendBatch, y: float, T: int) -> None:
    """The batch's live rows, padding rows and the stale rows past it, on the bar at height ``y``."""
    for slot, rows in enumerate(batch.row_ranges()):
        if rows:
            ax.add_patch(Rectangle((rows.start, y - 0.35), len(rows), 0.7, facecolor=request_colour(slot),
                                   edgecolor=EDGE, lw=0.6, gid="live", zorder=2))
    if batch.num_rows > batch.live_rows:
        ax.add_patch(Rectangle((batch.live_rows, y - 0.35), batch.num_rows - batch.live_rows, 0.7,
                               facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///", lw=0.6, gid="padding",
                               zorder=2))
    if T > batch.num_rows:
        ax.add_patch(Rectangle((batch.num_rows, y - 0.35), T - batch.num_rows, 0.7, facecolor=STALE_COLOUR,
                               edgecolor=EDGE, lw=0.6, gid="stale", zorder=2))


def _draw_offsets(ax, runner: PrefillGraphRunner, batch: ExtendBatch | None) -> None:
    """The ``[2, request_slots]`` extend offsets: first row (top) and row count (bottom) of each slot."""
    S = runner.request_slots
    offsets = (batch.extend_offsets if batch is not None else runner.static.extend_offsets).cpu().tolist()
    used = batch.batch_size if batch is not None else 0
    w = 1.3  # a cell's width
    for r in range(S):
        face = request_colour(r) if r < used else "white"
        for k, y in ((0, 1.0), (1, 0.0)):
            ax.add_patch(Rectangle((r * w, y), 0.92 * w, 0.8, facecolor=face, edgecolor=EDGE, lw=0.8, gid="offset",
                                   alpha=0.85 if r < used else 1.0))
            text = str(offsets[k][r]) if batch is not None else ""
            ax.text(r * w + 0.46 * w, y + 0.4, text, ha="center", va="center", fontsize=FONT)
        ax.text(r * w + 0.46 * w, 1.9, f"request\nslot {r}", ha="center", va="bottom", fontsize=MIN_FONT,
                color=EDGE if r < used else "#777777", linespacing=0.95)
    ax.text(-0.2, 1.4, "first row", ha="right", va="center", fontsize=MIN_FONT)
    ax.text(-0.2, 0.4, "row count", ha="right", va="center", fontsize=MIN_FONT)
    note = "extend_offsets  " + _shape(runner.static.extend_offsets)
    if batch is not None and used < S:
        note += (f"\nrequest slots {used}..{S - 1} are past the batch:\ncount 0, first row = the "
                 f"{batch.live_rows} live rows")
    if runner.path == "torch":
        note += ("\nrefreshed too, but the torch path reads none of them:\nit finds request boundaries by "
                 "comparing\nreq and pos of neighbouring rows")
    ax.text(S * w + 0.4, 1.0, note, ha="left", va="center", fontsize=MIN_FONT, color=MUTED, linespacing=1.1)
    ax.set_xlim(-3.2, S * w + 11.0)
    ax.set_ylim(-0.2, 2.9)
    ax.set_aspect("equal")
    ax.axis("off")
# ---------------------------------------------------------------------------------------------
# (b) a captured graph as its list of nodes


def node_label(node: str) -> str:
    """A short, groupable name for one node of :meth:`Graph.nodes`.

    Emulation: ``"aten.mul.Tensor"`` -> ``"mul"``, ``"c2graph.compress_fused.default"`` ->
    ``"c2graph::compress_fused"``. CUDA: the kernel's name without its namespace, template and
    argument list (``"void at::native::vectorized_elementwise_kernel<4, ...>(...)"`` ->
    ``"vectorized_elementwise_kernel"``, anonymous namespaces too); copies and fills keep their
    first words.
    """
    parts = node.split(".")
    if len(parts) == 3 and all(p.isidentifier() for p in parts):
        ns, op, _ = parts
        return op if ns == "aten" else f"{ns}::{op}"
    name = node.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    for stop in ("<", "("):
        name = name.split(stop)[0]
    return name.split("::")[-1].strip() or node


def _op_colours(graphs: Mapping[str, Sequence[str]], top: int) -> dict[str, str]:
    """The ``top`` most frequent labels over all graphs get a palette colour each (ties by name)."""
    counts = Counter(node_label(n) for nodes in graphs.values() for n in nodes)
    firsts = []  # each graph's most frequent name is coloured, whatever its count over all graphs
    for nodes in graphs.values():
        own = Counter(node_label(n) for n in nodes)
        if own:
            first = sorted(own, key=lambda k: (-own[k], k))[0]
            if first not in firsts:
                firsts.append(first)
    rest = [k for k in sorted(counts, key=lambda k: (-counts[k], k)) if k not in firsts]
    ranked = (firsts + rest)[: min(top, len(CATEGORY_COLOURS))]
    return {label: CATEGORY_COLOURS[i] for i, label in enumerate(ranked)}


def draw_graph_nodes(graphs: Mapping[str, Sequence[str]], *, top: int = 6, listed: int = 12,
                     title: str | None = None) -> Figure:
    """Captured graphs side by side, each as its list of nodes (``{name: graph.nodes()}``).

    Each graph is a vertical strip, one cell per node in launch order, all strips on the same
    scale (so a one-node graph is one thin cell), and next to it its nodes counted by name
    (:func:`node_label`), most frequent first, ``listed`` names at most. The ``top`` most frequent
    names over all graphs are coloured, every other name grey.
    """
    if not graphs:
        raise ValueError("graphs is empty; expected {name: list of node names}")
    colours = _op_colours(graphs, top)
    longest = max(1, *(len(nodes) for nodes in graphs.values()))
    fig = Figure(figsize=(figure_width(4.6 * len(graphs), 4.6), 5.6), layout="constrained")
    axes = fig.subplots(1, len(graphs), squeeze=False)[0]
    unit = 1.0 / longest
    for ax, (name, nodes) in zip(axes, graphs.items()):
        for i, node in enumerate(nodes):
            colour = colours.get(node_label(node), OTHER_COLOUR)
            ax.add_patch(Rectangle((0.0, 1.0 - (i + 1) * unit), 0.14, unit, facecolor=colour,
                                   edgecolor="none" if longest > 60 else "white", lw=0.8, gid="node"))
        ax.add_patch(Rectangle((0.0, 1.0 - len(nodes) * unit), 0.14, len(nodes) * unit, fill=False, edgecolor=EDGE,
                               lw=0.9))
        counts = Counter(node_label(n) for n in nodes)
        ranked = sorted(counts, key=lambda k: (-counts[k], k))
        for j, label in enumerate(ranked[:listed]):
            y = 0.985 - j * 0.062
            ax.add_patch(Rectangle((0.2, y - 0.02), 0.05, 0.04, facecolor=colours.get(label, OTHER_COLOUR),
                                   edgecolor=EDGE, lw=0.5))
            shown = label if len(label) <= 34 else label[:33] + "…"  # CUDA kernel names run long
            ax.text(0.28, y, f"{counts[label]:>4} x {shown}", ha="left", va="center", fontsize=MIN_FONT,
                    family="monospace", gid="count")
        if len(ranked) > listed:
            rest = sum(counts[k] for k in ranked[listed:])
            ax.text(0.28, 0.985 - listed * 0.062, f"{rest:>4} x {len(ranked) - listed} other names", ha="left",
                    va="center", fontsize=MIN_FONT, family="monospace", color=MUTED)
        ax.set_title(f"{name}: {plural(len(nodes), 'node')}", fontsize=TITLE_FONT, loc="left")
        ax.text(0.0, -0.02, "one cell a node,\nin launch order", ha="left", va="top", fontsize=MIN_FONT, color=MUTED)
        ax.set_xlim(-0.02, 1.0)
        ax.set_ylim(-0.1, 1.01)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=TITLE_FONT)
    return fig


# ---------------------------------------------------------------------------------------------
# (c) which slots a replay got wrong


def draw_wrong_slots(graph_pools: Pools, eager_pools: Pools, batch: ExtendBatch, ring_size: int, *,
                     poison: float = POISON, frozen_offsets: torch.Tensor | None = None,
                     grid_pairs: int | None = None, rings_before: tuple[torch.Tensor, torch.Tensor] | None = None,
                     title: str | None = None) -> Figure:
    """Which places a replayed batch got wrong, and which row writes each (:func:`compare_slots`).

    Top: one cell per c2 slot the batch writes, in batch order, labelled with the slot and, under
    it, the row and pos that write it; above it, where that row's partner comes from. Bottom: the
    ring rows the batch parks. Under each run of cells, the request slot that writes them, in its
    colour. A cell's face says its state: white equal to eager, black differs, grey and hatched
    never written (still ``poison``). ``frozen_offsets``, ``grid_pairs`` and ``rings_before`` (see
    :func:`compare_slots`) add, above a group, what the graph did differently there.
    """
    report = compare_slots(graph_pools, eager_pools, batch, ring_size, poison=poison, frozen_offsets=frozen_offsets,
                           grid_pairs=grid_pairs, rings_before=rings_before)
    n = max(len(report.slots), len(report.ring), 1)
    fig = Figure(figsize=(figure_width(0.95 * n + 2.6, 7.5), 5.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[1.5, 1.0])
    ppu = (fig.get_figwidth() - 1.6) * 72.0 / n
    xs = [float(i) for i in range(len(report.slots))]
    partners = [f"partner:\n{_partner_words(s)}" for s in report.slots]
    show_partner = spaced(xs, partners, ppu, MIN_FONT)
    show_why = spaced(xs, [s.why for s in report.slots], ppu, MIN_FONT)
    shown = {id(items): _shown(items, ppu) for items in (report.slots, report.ring)}
    for i, s in enumerate(report.slots):
        _cell(top, i, s, "slot", *shown[id(report.slots)][i])
        if show_partner[i]:
            top.text(i, 0.62, partners[i], ha="center", va="bottom", fontsize=MIN_FONT, color="#444444",
                     linespacing=0.95)
        if s.why and show_why[i]:
            top.text(i, 1.35, s.why, ha="center", va="bottom", fontsize=MIN_FONT, fontweight="bold", color="black",
                     linespacing=0.95, gid="why")
    for i, s in enumerate(report.ring):
        _cell(bottom, i, s, "ring", *shown[id(report.ring)][i])
    missing = _request_brackets(top, report.slots, ppu) | _request_brackets(bottom, report.ring, ppu)
    for ax, label, ylim in ((top, "c2 slots\nthe batch\nwrites", (-1.6, 2.1)),
                            (bottom, "ring rows\nthe batch\nparks", (-1.6, 0.75))):
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(*ylim)
        ax.set_yticks([0.0], [label], fontsize=FONT)
        ax.set_xticks([])
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    if title is None:
        wrong_slots, wrong_ring = len(report.wrong("c2 slot")), len(report.wrong("ring row"))
        title = (f"graph vs eager: {wrong_slots} of {plural(len(report.slots), 'c2 slot')} and "
                 f"{wrong_ring} of {plural(len(report.ring), 'ring row')} wrong")
    top.set_title(title, fontsize=TITLE_FONT)
    handles = [Patch(facecolor=STATE_COLOURS[k], edgecolor=EDGE, hatch="xx" if k == NEVER_WRITTEN else None,
                     label=STATE_LABELS[k]) for k in STATE_COLOURS]
    handles += [Patch(facecolor=request_colour(slot), edgecolor=EDGE, label=request_label(slot))
                for slot in sorted(missing)]
    legend_below(fig, handles, ncol=3)
    return fig


def _partner_words(s: SlotState) -> str:
    """The planned partner of the row that writes ``s``, short enough for a cell."""
    return "prev row" if s.writer.partner_row is not None else s.writer.partner_text()


def _writer(s: SlotState) -> str:
    return f"row {s.row}\npos {s.pos}"


def _shown(items: Sequence[SlotState], ppu: float) -> list[tuple[bool, bool]]:
    """For each cell, whether its index and its writer fit beside their neighbours'."""
    xs = [float(i) for i in range(len(items))]
    index = spaced(xs, [f"{s.index}0" for s in items], ppu)  # one digit more: the index is bold
    writer = spaced(xs, [_writer(s) for s in items], ppu, MIN_FONT)
    return list(zip(index, writer))


def _cell(ax, x: float, s: SlotState, gid: str, show_index: bool, show_writer: bool) -> None:
    """One slot or ring row: a square drawn by its state, its index inside, its writer below."""
    face = STATE_COLOURS[s.state]
    ax.add_patch(Rectangle((x - 0.42, -0.4), 0.84, 0.8, facecolor=face, edgecolor=EDGE, lw=0.9,
                           hatch="xx" if s.state == NEVER_WRITTEN else None, gid=gid, zorder=2))
    if show_index:
        ax.text(x, 0.0, str(s.index), ha="center", va="center", fontsize=FONT, fontweight="bold",
                color="white" if s.state == DIFFERS else "black", zorder=3,
                bbox=dict(boxstyle="square,pad=0.1", facecolor="white", lw=0) if s.state == NEVER_WRITTEN else None)
    if show_writer:
        ax.text(x, -0.5, _writer(s), ha="center", va="top", fontsize=MIN_FONT, linespacing=0.95)


def _request_brackets(ax, items: Sequence[SlotState], ppu: float) -> set[int]:
    """A line in the request slot's colour under each request's run of cells, labelled with the
    request slot and ``req`` where the words fit; returns the request slots left unlabelled."""
    missing, i = set(), 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1].request_slot == items[i].request_slot:
            j += 1
        slot, colour = items[i].request_slot, request_colour(items[i].request_slot)
        ax.plot([i - 0.4, j + 0.4], [-1.22, -1.22], color=colour, lw=3.0, solid_capstyle="butt")
        for text in (f"{request_label(slot)} (req {items[i].req})", f"{request_label(slot)}\n(req {items[i].req})"):
            if text_width(text, MIN_FONT) <= (j - i + 0.9) * ppu:
                ax.text((i + j) / 2, -1.3, text, ha="center", va="top", fontsize=MIN_FONT, color=EDGE,
                        linespacing=0.95)
                break
        else:
            missing.add(slot)
        i = j + 1
    return missing
