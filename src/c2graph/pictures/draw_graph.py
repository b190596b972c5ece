"""Pictures of the prefill graph: its static buffers, its list of nodes, and which slots a replay got wrong.

- :func:`draw_static_buffers`: every buffer a :class:`~c2graph.prefill_graph.PrefillGraphRunner`
  allocated once, sized for its largest bucket, with each bucket's extent marked and the rows of
  the batch being replayed (live rows by request, padding rows, rows past the bucket);
- :func:`draw_graph_nodes`: captured graphs as their lists of nodes, one cell per node in launch
  order, next to the counts grouped by op (or kernel) name;
- :func:`draw_wrong_slots`: after a replay, the c2 slots the batch writes and the ring rows it
  parks, each coloured by how the graph's result compares with eager's (:func:`compare_slots`).

As in :mod:`c2graph.draw`, every function returns a :class:`matplotlib.figure.Figure` made
without pyplot, is deterministic, and uses the Okabe-Ito palette. Artists the tests count carry a
``gid``: ``"buffer"``, ``"live"``, ``"padding"``, ``"stale"``, ``"bucket"``, ``"offset"``
(static buffers); ``"node"``, ``"count"`` (node lists); ``"slot"``, ``"ring"``, ``"why"`` (wrong
slots).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..compressor.batch import ExtendBatch
from ..measure.compare import bits_of
from .draw import EDGE, PADDING_COLOUR, REQUEST_COLOURS, request_colour
from ..compressor.pools import Pools
from ..graphs.prefill_graph import PrefillGraphRunner

EQUAL = "equal"
DIFFERS = "differs"
NEVER_WRITTEN = "never written"
STATE_COLOURS = {EQUAL: "#009E73", DIFFERS: "#D55E00", NEVER_WRITTEN: "#CC79A7"}
"""Okabe-Ito bluish green, vermillion, reddish purple (the last one also hatched)."""
STATE_LABELS = {
    EQUAL: "equal to eager (bitwise)",
    DIFFERS: "differs from eager",
    NEVER_WRITTEN: "never written: still the poison",
}
STALE_COLOUR = "#F2F2F2"
OTHER_COLOUR = "#BBBBBB"
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "int64", torch.int32: "int32"}


def _n(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# ---------------------------------------------------------------------------------------------
# (a) the static buffers


def _buffers(runner: PrefillGraphRunner) -> list[tuple[str, torch.Tensor, str]]:
    """``(name, tensor, what it holds)`` of every per-row static buffer, top to bottom."""
    s = runner.static
    if runner.path == "fused":
        projection = [("projected", s.projected, "| kv | score | of the source projection")]
    else:
        projection = [("kv", s.kv, "source projection, kv half"), ("score", s.score, "source projection, score half")]
    return projection + [
        ("pos", s.pos, "absolute position"),
        ("req", s.req, "pool index of the request"),
        ("raw_out_loc", s.raw_out_loc, "slot in the full KV pool (0: padding)"),
        ("c2_slot", s.c2_slot, "where the group is stored"),
        ("latent", s.latent, "pre-RoPE latents the graph writes"),
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
    fig = Figure(figsize=(11.0, 0.42 * len(bufs) + 3.1), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[len(bufs) + 1.6, 2.6])
    for i, (name, tensor, what) in enumerate(bufs):
        y = len(bufs) - 1 - i
        top.add_patch(Rectangle((0, y - 0.35), T, 0.7, facecolor="white", edgecolor=EDGE, lw=0.9,
                                gid="buffer", zorder=1))
        if batch is not None:
            _fill_rows(top, batch, y, T)
        top.text(-0.8, y, f"{name}  {_shape(tensor)}", ha="right", va="center", fontsize=8.5,
                 family="monospace")
        top.text(T + 0.8, y, what, ha="left", va="center", fontsize=7.5, color="#555555")
    for b in buckets:
        chosen = b == bucket
        top.plot([b, b], [-0.6, len(bufs) - 0.4], ls="--" if not chosen else "-", lw=2.0 if chosen else 1.0,
                 color=EDGE, gid="bucket", zorder=4)
        top.text(b, len(bufs) - 0.3, f"bucket {b}", ha="right", va="bottom", fontsize=8,
                 fontweight="bold" if chosen else "normal")
    if batch is not None:
        for slot, (req, rows) in enumerate(zip(batch.requests, batch.row_ranges())):
            if rows:
                top.text((rows.start + rows.stop) / 2, -0.65, f"slot {slot}\nreq {req.pool_index}", ha="center",
                         va="top", fontsize=7, color=request_colour(slot), fontweight="bold", linespacing=0.95)
    top.set_xlim(-0.5, T + 0.5)
    top.set_ylim(-1.3, len(bufs) + 0.3)
    top.set_xticks(sorted({0, *buckets}))
    top.tick_params(axis="x", labelsize=8)
    top.set_yticks([])
    for side in ("top", "right", "left"):
        top.spines[side].set_visible(False)
    _draw_offsets(bottom, runner, batch)
    if title is None:
        title = f"static buffers of a {runner.path}-path prefill graph, sized for the largest bucket ({T} rows)"
        if batch is not None:
            title += (f": {_n(batch.batch_size, 'request')}, {_n(batch.live_rows, 'live row')} replayed in "
                      f"bucket {bucket}")
    top.set_title(title, fontsize=10)
    handles = [Patch(facecolor=request_colour(0), edgecolor=EDGE, label="live rows (colour: request slot)"),
               Patch(facecolor=PADDING_COLOUR, edgecolor=EDGE, hatch="///",
                     label="padding rows up to the bucket: write nothing"),
               Patch(facecolor=STALE_COLOUR, edgecolor=EDGE, label="past the bucket: stale, not read")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
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
    for r in range(S):
        face = request_colour(r) if r < used else "white"
        for k, y in ((0, 1.0), (1, 0.0)):
            ax.add_patch(Rectangle((r, y), 0.92, 0.8, facecolor=face, edgecolor=EDGE, lw=0.8, gid="offset",
                                   alpha=0.85 if r < used else 1.0))
            text = str(offsets[k][r]) if batch is not None else ""
            ax.text(r + 0.46, y + 0.4, text, ha="center", va="center", fontsize=9)
        ax.text(r + 0.46, 1.95, f"slot {r}", ha="center", va="bottom", fontsize=7.5,
                color=EDGE if r < used else "#777777")
    ax.text(-0.15, 1.4, "first row", ha="right", va="center", fontsize=8.5)
    ax.text(-0.15, 0.4, "row count", ha="right", va="center", fontsize=8.5)
    note = "extend_offsets  " + _shape(runner.static.extend_offsets)
    if batch is not None and used < S:
        note += f": slots {used}..{S - 1} are past the batch (count 0, first row = the {batch.live_rows} live rows)"
    if runner.path == "torch":
        note += ("\n(refreshed too, but the torch path reads none of them: it finds request boundaries"
                 "\nby comparing req and pos of neighbouring rows)")
    ax.text(S + 0.3, 1.0, note, ha="left", va="center", fontsize=8, color="#555555", linespacing=1.1)
    ax.set_xlim(-3.2, S + 12.0)
    ax.set_ylim(-0.2, 2.5)
    ax.set_aspect("equal")
    ax.axis("off")


# ---------------------------------------------------------------------------------------------
# (b) a captured graph as its list of nodes


def node_label(node: str) -> str:
    """A short, groupable name for one node of :meth:`Graph.nodes`.

    Emulation: ``"aten.mul.Tensor"`` -> ``"mul"``, ``"c2graph.fused_compress.default"`` ->
    ``"c2graph::fused_compress"``. CUDA: the kernel's name without its namespace, template and
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
    ranked = (firsts + rest)[: min(top, len(REQUEST_COLOURS))]
    return {label: REQUEST_COLOURS[i] for i, label in enumerate(ranked)}


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
    fig = Figure(figsize=(4.6 * len(graphs), 5.6), layout="constrained")
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
            ax.text(0.28, y, f"{counts[label]:>4} x {shown}", ha="left", va="center", fontsize=8.5,
                    family="monospace", gid="count")
        if len(ranked) > listed:
            rest = sum(counts[k] for k in ranked[listed:])
            ax.text(0.28, 0.985 - listed * 0.062, f"{rest:>4} x {len(ranked) - listed} other names", ha="left",
                    va="center", fontsize=8.5, family="monospace", color="#555555")
        ax.set_title(f"{name}: {_n(len(nodes), 'node')}", fontsize=10, loc="left")
        ax.text(0.07, -0.02, "one cell a node,\nin launch order", ha="center", va="top", fontsize=7, color="#555555")
        ax.set_xlim(-0.02, 1.0)
        ax.set_ylim(-0.1, 1.01)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


# ---------------------------------------------------------------------------------------------
# (c) which slots a replay got wrong


@dataclass(frozen=True)
class SlotState:
    """One place a batch writes, and how the graph's result compares with eager's.

    ``kind`` is ``"c2 slot"`` (both caches at ``index``) or ``"ring row"`` (the ring at ``index``);
    ``row`` is the batch row that writes it, ``request_slot``/``req``/``pos`` that row's;
    ``partner`` (c2 slots only) where that row's partner comes from: ``"previous row"`` or
    ``"ring row N"``. ``state`` is :data:`EQUAL`, :data:`DIFFERS` or :data:`NEVER_WRITTEN`.
    """

    kind: str
    index: int
    row: int
    request_slot: int
    req: int
    pos: int
    partner: str | None
    state: str


@dataclass(frozen=True)
class SlotReport:
    """Every c2 slot a batch writes (``slots``, in batch order) and ring row it parks (``ring``)."""

    slots: tuple[SlotState, ...]
    ring: tuple[SlotState, ...]

    def wrong(self, kind: str | None = None) -> list[SlotState]:
        """The places that are not :data:`EQUAL` (of one ``kind``, or both)."""
        return [s for s in self.slots + self.ring if s.state != EQUAL and kind in (None, s.kind)]

    def __str__(self) -> str:
        parts = []
        for kind, items in (("c2 slots", self.slots), ("ring rows", self.ring)):
            bad = [s for s in items if s.state != EQUAL]
            if not bad:
                parts.append(f"{kind}: all {len(items)} equal to eager")
                continue
            by_state = {st: [s.index for s in bad if s.state == st] for st in (DIFFERS, NEVER_WRITTEN)}
            described = "; ".join(f"{len(ix)} {st} {ix}" for st, ix in by_state.items() if ix)
            parts.append(f"{kind}: {len(bad)} of {len(items)} wrong ({described})")
        return " | ".join(parts)


def _state(got: list[torch.Tensor], want: list[torch.Tensor], poison: float) -> str:
    if all(torch.equal(bits_of(g.detach().cpu()), bits_of(w.detach().cpu())) for g, w in zip(got, want)):
        return EQUAL
    if all(bool((g.detach().float().cpu() == poison).all()) for g in got):
        return NEVER_WRITTEN
    return DIFFERS


def _check_pools(graph_pools, eager_pools) -> None:
    for name, p in (("graph_pools", graph_pools), ("eager_pools", eager_pools)):
        if not isinstance(p, Pools):
            raise ValueError(f"{name} is a {type(p).__name__}; expected a Pools")
    for name, g in graph_pools.tensors().items():
        w = eager_pools.tensors()[name]
        if g.shape != w.shape:
            raise ValueError(f"{name}: graph_pools has shape {tuple(g.shape)}, eager_pools {tuple(w.shape)}; "
                             "expected the same pools")


def compare_slots(graph_pools: Pools, eager_pools: Pools, batch: ExtendBatch, ring_size: int, *,
                  poison: float = 123.0) -> SlotReport:
    """After the same batch ran in a graph and eagerly: each c2 slot it writes and ring row it parks,
    with the row that writes it and whether the graph's bytes equal eager's, differ, or are still
    ``poison`` (the value both pools were filled with before the first batch: never written).

    A c2 slot is equal when both caches (``kv_cache`` and ``index_k``) are bitwise equal there.
    """
    _check_pools(graph_pools, eager_pools)
    raw = batch.raw_out_loc.cpu().tolist()
    slots, ring = [], []
    for slot, (r, rows) in enumerate(zip(batch.requests, batch.row_ranges())):
        for i, row in enumerate(rows):
            pos = r.prefix_len + i
            if pos % 2 == 1:
                c2 = raw[row] // 2
                partner = "previous row" if i > 0 else f"ring row {r.pool_index * ring_size + (pos - 1) % ring_size}"
                state = _state([graph_pools.kv_cache[c2], graph_pools.index_k[c2]],
                               [eager_pools.kv_cache[c2], eager_pools.index_k[c2]], poison)
                slots.append(SlotState("c2 slot", c2, row, slot, r.pool_index, pos, partner, state))
            if i >= len(rows) - ring_size:
                k = r.pool_index * ring_size + pos % ring_size
                state = _state([graph_pools.ring[k]], [eager_pools.ring[k]], poison)
                ring.append(SlotState("ring row", k, row, slot, r.pool_index, pos, None, state))
    return SlotReport(tuple(slots), tuple(ring))


def _partner_under(offsets: list[list[int]], row: int, req: int, pos: int, ring_size: int) -> str:
    """Where the row's partner comes from when the kernel reads ``offsets`` (as a frozen graph does)."""
    for start, count in zip(*offsets):
        if start <= row < start + count:
            return f"row {row - 1}" if row > start else f"ring row {req * ring_size + (pos - 1) % ring_size}"
    return "none: no request"


def draw_wrong_slots(graph_pools: Pools, eager_pools: Pools, batch: ExtendBatch, ring_size: int, *,
                     poison: float = 123.0, frozen_offsets: torch.Tensor | None = None,
                     grid_rows: int | None = None, rings_before: tuple[torch.Tensor, torch.Tensor] | None = None,
                     title: str | None = None) -> Figure:
    """Which places a replayed batch got wrong, and which row writes each (:func:`compare_slots`).

    Top: one cell per c2 slot the batch writes, in batch order, labelled with the slot and, under
    it, the request slot, row and pos that write it; above it, where that row's partner comes from.
    Bottom: the ring rows the batch parks. Colour: equal to eager, differs, or never written (still
    ``poison``). ``frozen_offsets`` (the ``[2, request_slots]`` offsets the graph really read) adds,
    on each group whose partner they change, the partner the graph used. ``grid_rows`` (the rows a
    frozen grid covers) marks the groups past it. ``rings_before`` (the graph's and eager's ring
    before the batch, e.g. ``pools.ring.clone()``) marks the groups whose partner ring row already
    differed then (or still held the poison).
    """
    report = compare_slots(graph_pools, eager_pools, batch, ring_size, poison=poison)
    frozen = frozen_offsets.cpu().tolist() if frozen_offsets is not None else None
    n = max(len(report.slots), len(report.ring), 1)
    fig = Figure(figsize=(min(15.0, max(7.5, 0.95 * n + 2.6)), 4.9), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[1.25, 1.0])
    for i, s in enumerate(report.slots):
        _cell(top, i, s, "slot", str(s.index))
        partner = s.partner.replace("previous row", "prev row")
        top.text(i, 0.62, f"partner:\n{partner}", ha="center", va="bottom", fontsize=7, color="#444444",
                 linespacing=0.95)
        note = _why(s, ring_size, poison, frozen, grid_rows, rings_before)
        if note:
            colour = STATE_COLOURS[NEVER_WRITTEN] if note.startswith("past") else STATE_COLOURS[DIFFERS]
            top.text(i, 1.22, note, ha="center", va="bottom", fontsize=7, fontweight="bold", color=colour,
                     linespacing=0.95, gid="why")
    for i, s in enumerate(report.ring):
        _cell(bottom, i, s, "ring", str(s.index))
    _request_brackets(top, report.slots)
    _request_brackets(bottom, report.ring)
    for ax, label, ylim in ((top, "c2 slots\nthe batch\nwrites", (-1.45, 1.85)),
                            (bottom, "ring rows\nthe batch\nparks", (-1.45, 0.75))):
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(*ylim)
        ax.set_yticks([0.0], [label], fontsize=8.5)
        ax.set_xticks([])
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    if title is None:
        wrong_slots, wrong_ring = len(report.wrong("c2 slot")), len(report.wrong("ring row"))
        title = (f"graph vs eager: {wrong_slots} of {_n(len(report.slots), 'c2 slot')} and "
                 f"{wrong_ring} of {_n(len(report.ring), 'ring row')} wrong")
    top.set_title(title, fontsize=10)
    handles = [Patch(facecolor=STATE_COLOURS[k], edgecolor=EDGE, hatch="xx" if k == NEVER_WRITTEN else None,
                     alpha=0.45 if k == EQUAL else 1.0, label=STATE_LABELS[k]) for k in STATE_COLOURS]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def _why(s: SlotState, ring_size: int, poison: float, frozen, grid_rows, rings_before) -> str:
    """What the graph did differently for the group of ``s`` (empty when nothing is known)."""
    if grid_rows is not None and s.row >= grid_rows:
        return f"past the grid\nof {grid_rows} rows"
    if frozen is not None:
        used = _partner_under(frozen, s.row, s.req, s.pos, ring_size)
        if used != s.partner and not (s.partner == "previous row" and used == f"row {s.row - 1}"):
            return f"graph used:\n{used}"
    if rings_before is not None and s.partner.startswith("ring row"):
        k = int(s.partner.split()[-1])
        got, want = rings_before[0][k], rings_before[1][k]
        if not torch.equal(bits_of(got.detach().cpu()), bits_of(want.detach().cpu())):
            held = "the poison" if bool((got.detach().float().cpu() == poison).all()) else "other bytes"
            return f"ring row {k}\nheld {held}"
    return ""


def _cell(ax, x: float, s: SlotState, gid: str, text: str) -> None:
    """One slot or ring row: a square coloured by its state, its index inside, its writer below."""
    face = STATE_COLOURS[s.state]
    ax.add_patch(Rectangle((x - 0.42, -0.4), 0.84, 0.8, facecolor=face, alpha=0.45 if s.state == EQUAL else 1.0,
                           edgecolor=EDGE, lw=0.9, hatch="xx" if s.state == NEVER_WRITTEN else None, gid=gid,
                           zorder=2))
    ax.text(x, 0.0, text, ha="center", va="center", fontsize=9.5, fontweight="bold",
            color="black" if s.state == EQUAL else "white", zorder=3,
            bbox=dict(boxstyle="square,pad=0.1", facecolor=face, lw=0) if s.state == NEVER_WRITTEN else None)
    ax.text(x, -0.5, f"row {s.row}\npos {s.pos}", ha="center", va="top", fontsize=7, linespacing=0.95)


def _request_brackets(ax, items: Sequence[SlotState]) -> None:
    """A line under each request's run of cells, labelled with its request slot and ``req``."""
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1].request_slot == items[i].request_slot:
            j += 1
        ax.plot([i - 0.4, j + 0.4], [-1.12, -1.12], color=EDGE, lw=1.2)
        ax.text((i + j) / 2, -1.18, f"slot {items[i].request_slot} (req {items[i].req})", ha="center", va="top",
                fontsize=7.5)
        i = j + 1
