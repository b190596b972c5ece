"""Pictures for notebook 02 (the fused kernel): the extend offsets, the programs, the GPU's words, costs.

Every function takes plain objects (a batch, numbers) and returns a :class:`matplotlib.figure.Figure`
made without pyplot, so nothing is shown twice and nothing stays in pyplot's state: Jupyter shows
a returned figure, ``fig.savefig(path)`` writes it. None of them runs a kernel: the batch pictures
read the batch's row plan on the host, the cost pictures draw the numbers they are given and say
which are measured and which are computed. All keep to :mod:`c2graph.pictures.style` (request
slot colours, at most 12 inches wide, no text under 9 points).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.fused import SMALL_BUCKET_GROUPS_PER_BLOCK
from ..compressor.programs import program_plan
from ..compressor.rows import Partner, plan_rows
from .style import (
    CATEGORY_COLOURS,
    EDGE,
    FONT,
    MIN_FONT,
    MUTED,
    TITLE_FONT,
    figure_width,
    legend_below,
    request_colour,
    request_label,
    spaced,
    text_colour,
    text_width,
)

_BAND = "#EFEFEF"
_BAND_ODD = "#DDE5EE"


def _points_per_unit(fig: Figure, lo: float, hi: float) -> float:
    return fig.get_figwidth() * 72.0 * 0.95 / (hi - lo)


def _draw_rows(ax, batch: ExtendBatch, y: float, ppu: float) -> None:
    """One cell per row at height ``y`` (number inside: ``pos``; below: the row), coloured by
    request slot, grey and hatched for padding. Numbers that would overlap are left out."""
    slot_of = [None] * batch.num_rows
    for slot, rows in enumerate(batch.row_ranges()):
        for row in rows:
            slot_of[row] = slot
    pos = batch.pos.tolist()
    T = batch.num_rows
    centres = [row + 0.5 for row in range(T)]
    shown_pos = spaced(centres, ["" if s is None else str(p) for s, p in zip(slot_of, pos)], ppu)
    shown_row = spaced(centres, [str(row) for row in range(T)], ppu, MIN_FONT)
    for row, slot in enumerate(slot_of):
        ax.add_patch(Rectangle((row, y), 1, 1, facecolor=request_colour(slot), edgecolor="white", lw=1.2,
                               hatch="//" if slot is None else None, gid="row"))
        if shown_pos[row]:
            ax.text(row + 0.5, y + 0.5, str(pos[row]), ha="center", va="center", fontsize=FONT,
                    color=text_colour(request_colour(slot)))
        if shown_row[row]:
            ax.text(row + 0.5, y - 0.4, str(row), ha="center", va="center", fontsize=MIN_FONT, color=MUTED)
    ax.text(-0.3, y + 0.5, "pos", ha="right", va="center", fontsize=FONT)
    ax.text(-0.3, y - 0.4, "row", ha="right", va="center", fontsize=MIN_FONT, color=MUTED)


def draw_extend_offsets(batch: ExtendBatch, title: str | None = None) -> Figure:
    """The ``[2, request_slots]`` extend offsets above the rows they describe.

    Each request slot's column (first row, row count) points at its span of rows; request slots
    past the batch point at the end of the live rows with count 0; padding rows belong to no
    request slot.
    """
    starts, counts = batch.extend_offsets.tolist()
    S, T = batch.request_slots, batch.num_rows
    fig = Figure(figsize=(figure_width(0.3 * T + 2.5, 8.0), 3.9), layout="constrained")
    ax = fig.subplots()
    cell_w = max(2.2, T / max(S, 1) * 0.6)
    x0 = (T - cell_w * S) / 2
    lo, hi = min(-2.5, x0 - 6.5), max(T, x0 + cell_w * S) + 0.5
    ppu = _points_per_unit(fig, lo, hi)
    for r in range(S):
        x = x0 + r * cell_w
        face = request_colour(r) if counts[r] else "white"
        for k, value in enumerate((starts[r], counts[r])):
            ax.add_patch(Rectangle((x, 3.2 - k * 0.8), cell_w, 0.8, facecolor=face, edgecolor="black", lw=0.8))
            ax.text(x + cell_w / 2, 3.6 - k * 0.8, str(value), ha="center", va="center", fontsize=FONT,
                    color=text_colour(face))
        for name in (request_label(r), f"request\nslot {r}"):
            if text_width(name, MIN_FONT) <= cell_w * ppu - 2:
                ax.text(x + cell_w / 2, 4.1, name, ha="center", va="bottom", fontsize=MIN_FONT, linespacing=0.95)
                break
        # the arrow points at the slot's first row; its span of rows is underlined below
        target = starts[r] + 0.5 if counts[r] else starts[r]
        ax.add_patch(FancyArrowPatch((x + cell_w / 2, 2.4), (target, 1.05), arrowstyle="-|>", mutation_scale=9,
                                     color=EDGE if counts[r] else "grey", lw=1.0,
                                     linestyle="-" if counts[r] else ":"))
        if counts[r]:
            ax.plot([starts[r] + 0.05, starts[r] + counts[r] - 0.05], [-0.85, -0.85], color=request_colour(r), lw=3)
    ax.text(x0 - 0.3, 3.6, "[0, r]  first row", ha="right", va="center", fontsize=MIN_FONT)
    ax.text(x0 - 0.3, 2.8, "[1, r]  row count", ha="right", va="center", fontsize=MIN_FONT)
    _draw_rows(ax, batch, 0.0, ppu)
    for text in ("padding: in no request slot", "padding:\nin no request slot"):
        if batch.live_rows < T and text_width(text, MIN_FONT) <= (T - batch.live_rows) * ppu:
            ax.text((batch.live_rows + T) / 2, -0.75, text, ha="center", va="top", fontsize=MIN_FONT, color=MUTED,
                    linespacing=0.95)
            break
    ax.set_xlim(lo, hi)
    ax.set_ylim(-1.45, 4.9)
    ax.set_axis_off()
    default = f"extend offsets [2, {S}] int32 and the {T} rows they describe (numbers in cells: pos)"
    ax.set_title(title or default, fontsize=TITLE_FONT)
    return fig


def draw_programs(
    batch: ExtendBatch, ring_size: int, groups_per_block: int = SMALL_BUCKET_GROUPS_PER_BLOCK, title: str | None = None
) -> Figure:
    """Which program handles which rows, and where each group row's partner comes from.

    Rows are cells (number: ``pos``), coloured by request slot; group rows (odd ``pos``) have a
    black edge. A grey arc joins a group row to its partner in the previous row; a solid arrow
    brings the partner from the ring (the first row of a request that starts at an odd
    position). Dashed arrows park each request's last rows in the ring, written by the program
    that owns the request's first group. Shaded bands are the programs, ``groups_per_block``
    groups each: the rows its lanes read, its first group's partner to its last group row.
    """
    plan = plan_rows(batch, ring_size)
    T = batch.num_rows
    fig = Figure(figsize=(figure_width(0.3 * T + 2.0, 8.0), 4.8), layout="constrained")
    ax = fig.subplots()
    lo_x, hi_x = -4.5, T + 0.5
    ppu = _points_per_unit(fig, lo_x, hi_x)
    programs = program_plan(batch, ring_size, groups_per_block)
    for b, program in enumerate(programs):
        if not program["rows"]:
            continue
        lo, hi = program["rows"].start, program["rows"].stop
        ax.add_patch(Rectangle((lo, -1.55), hi - lo, 6.3, facecolor=_BAND if b % 2 == 0 else _BAND_ODD,
                               edgecolor="none", zorder=0))
        n = len(program["groups"])
        for text in (f"program {b}: {n} groups", f"program {b}", str(b)):
            if text_width(text, MIN_FONT) <= (hi - lo) * ppu - 2:
                ax.text((lo + hi) / 2, -1.35, text, ha="center", fontsize=MIN_FONT)
                break
    _draw_rows(ax, batch, 0.0, ppu)
    for row in plan.group_rows:
        ax.add_patch(Rectangle((row, 0), 1, 1, facecolor="none", edgecolor="black", lw=1.3))

    # The ring rows of the batch's requests, drawn above the request's first row.
    # Each request's boxes start above its first row, or just after the previous request's boxes.
    ring_x, free = {}, 0.0
    for rows, r in zip(plan.request_rows, batch.requests):
        if not rows:
            continue
        left = max(float(rows.start), free)
        free = left + 2 * ring_size + 0.6
        ax.text(left + ring_size - 0.2, 4.05, f"req {r.pool_index}", ha="center", fontsize=MIN_FONT)
        for k in range(ring_size):
            x = left + 2 * k
            ring_x[r.pool_index * ring_size + k] = x + 0.8
            ax.add_patch(Rectangle((x, 3.0), 1.6, 0.8, facecolor="white", edgecolor=EDGE, lw=1.0))
            ax.text(x + 0.8, 3.4, f"{r.pool_index * ring_size + k}", ha="center", va="center", fontsize=MIN_FONT)
    ax.text(-0.3, 3.4, "ring rows", ha="right", va="center", fontsize=FONT)

    for r in plan.rows:
        if r.partner is Partner.RING:
            ax.add_patch(FancyArrowPatch((ring_x[r.partner_ring_row], 3.0), (r.row + 0.5, 1.02), arrowstyle="-|>",
                                         mutation_scale=10, color=EDGE, lw=1.5))
        elif r.partner is Partner.PREVIOUS_ROW:
            ax.add_patch(FancyArrowPatch((r.row - 0.45, 1.02), (r.row + 0.45, 1.02), arrowstyle="-|>",
                                         connectionstyle="arc3,rad=-0.9", mutation_scale=7, color="dimgrey", lw=0.9))
    for ring_row, row in plan.parked.items():
        ax.add_patch(FancyArrowPatch((row + 0.5, 1.9), (ring_x[ring_row], 2.98), arrowstyle="-|>",
                                     mutation_scale=8, color=EDGE, lw=0.9, linestyle="--"))
        ax.plot([row + 0.5, row + 0.5], [1.0, 1.9], color=EDGE, lw=0.9, linestyle="--")

    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(-1.6, 4.7)
    ax.set_axis_off()
    busy = sum(bool(p["groups"]) for p in programs)
    default = (f"{len(programs)} programs of {groups_per_block} groups per block ({busy} with groups). Cells: pos; "
               "black edge: a group row (odd pos); hatched: padding")
    ax.set_title(title or default, fontsize=TITLE_FONT, loc="left")
    handles = [Line2D([], [], color="dimgrey", label="partner: previous row"),
               Line2D([], [], color=EDGE, lw=1.5, label="partner: ring row (read first)"),
               Line2D([], [], color=EDGE, ls="--", label="parked (last, by the first pair's program)")]
    legend_below(fig, handles, ncol=3)
    return fig


def _path_colours(names: Sequence[str]) -> dict[str, str]:
    return {name: CATEGORY_COLOURS[i % len(CATEGORY_COLOURS)] for i, name in enumerate(names)}


MINIMUM_LABEL = "minimum bytes (computed)"


def draw_launch_counts(launches: Mapping[str, int], moved_mib: Mapping[str, float],
                       minimum_mib: float | None = None, *, source: str | None = None,
                       title: str | None = None) -> Figure:
    """What each path costs: kernel launches (left) and MiB moved through memory (right), one bar a path.

    ``launches`` and ``moved_mib`` are counted as the path ran (launches: its ops or kernels;
    bytes: summed over its ops' inputs and outputs, from their shapes), drawn as solid bars and
    labelled "counted" and "summed over its ops": neither is a hardware measurement.
    ``minimum_mib`` is computed, not measured (what any implementation must move,
    :func:`~c2graph.measure.traffic.minimum_bytes`): a hatched bar labelled
    "minimum bytes (computed)". ``source`` says where the counted numbers come from (device,
    versions, date); it is written under the panels.
    """
    names = list(launches)
    colours = _path_colours(list(dict.fromkeys([*names, *moved_mib])))
    fig = Figure(figsize=(10.0, 3.2), layout="constrained")
    a, b = fig.subplots(1, 2)
    bars = [(name, launches[name], colours[name], None) for name in names]
    _bars(a, bars, "kernel launches (counted)")
    bars = [(f"{name}: summed over its ops", v, colours[name], None) for name, v in moved_mib.items()]
    if minimum_mib is not None:
        bars.append((MINIMUM_LABEL, minimum_mib, "white", "//"))
    _bars(b, bars, "MiB moved")
    if title or source:
        fig.suptitle("\n".join(filter(None, (title, source and f"counted on: {source}"))), fontsize=TITLE_FONT)
    return fig


def _bars(ax, bars: list[tuple[str, float, str, str | None]], unit: str) -> None:
    """Horizontal bars ``(label, value, colour, hatch)``, top to bottom, each with its value."""
    labels, values = [b[0] for b in bars], [b[1] for b in bars]
    for i, (_, v, colour, hatch) in enumerate(bars):
        ax.barh(i, v, color=colour, edgecolor=EDGE, hatch=hatch, lw=0.8)
        ax.text(v, i, f" {v:,.0f}" if v >= 10 else f" {v:g}", va="center", fontsize=FONT)
    ax.set_yticks(range(len(bars)), labels, fontsize=FONT)
    ax.set_xlim(0, max(values, default=1) * 1.3)
    ax.set_xlabel(unit, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=MIN_FONT)
    ax.invert_yaxis()
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def draw_gpu_words(groups_per_block: int = SMALL_BUCKET_GROUPS_PER_BLOCK, lanes: int = 16, sms: int = 4) -> Figure:
    """Where a launch of the fused kernel runs: the words of the hardware, in one picture.

    Left: the GPU, ``sms`` of its SMs (streaming multiprocessors) drawn, each running programs
    side by side, with its tensor cores; under them HBM, the GPU's main memory, which every load
    and store reaches through the caches. Right: one program's tile of ``lanes`` lanes (rows of
    the tile), of which ``groups_per_block`` hold a group each (the rest idle, hatched), shared
    out among the threads of its warps (32 threads each). Nothing is measured: a drawing of words.
    """
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.add_patch(Rectangle((0.0, 0.0), 6.6, 0.9, facecolor=CATEGORY_COLOURS[1], edgecolor=EDGE))
    ax.text(3.3, 0.45, "HBM: the GPU's main memory (the caches, the ring, the | kv | score | buffer)",
            ha="center", va="center", fontsize=FONT)
    width = 6.6 / sms
    for k in range(sms):
        x = k * width + 0.08
        ax.add_patch(Rectangle((x, 1.5), width - 0.16, 3.2, facecolor="white", edgecolor=EDGE))
        ax.text(x + (width - 0.16) / 2, 4.45, f"SM {k}", ha="center", fontsize=FONT)
        for j in range(2):
            face = request_colour(k % 6) if j == 0 else "#F2F2F2"
            ax.add_patch(Rectangle((x + 0.1, 3.3 - 0.95 * j), width - 0.36, 0.8, facecolor=face, edgecolor=EDGE))
            ax.text(x + (width - 0.16) / 2, 3.7 - 0.95 * j, f"program {k + sms * j}", ha="center", va="center",
                    fontsize=MIN_FONT, color=text_colour(face))
        ax.add_patch(Rectangle((x + 0.1, 1.6), width - 0.36, 0.6, facecolor=CATEGORY_COLOURS[3], edgecolor=EDGE))
        ax.text(x + (width - 0.16) / 2, 1.9, "tensor cores", ha="center", va="center", fontsize=MIN_FONT)
        ax.add_patch(FancyArrowPatch((x + (width - 0.16) / 2, 1.5), (x + (width - 0.16) / 2, 0.92),
                                     arrowstyle="<|-|>", mutation_scale=9, color=MUTED, lw=1.0))
    ax.text(3.3, 5.0, f"the GPU: {sms} of its SMs drawn (132 on an H100 or an H200)", ha="center", fontsize=FONT)

    # One program's tile, lane by lane.
    left, top, h = 7.6, 4.6, 4.0 / lanes
    for t in range(lanes):
        busy = t < groups_per_block
        ax.add_patch(Rectangle((left, top - (t + 1) * h), 2.2, h, facecolor=request_colour(0) if busy else "white",
                               edgecolor=EDGE, lw=0.6, hatch=None if busy else "//"))
        if t % 4 == 0 or t == lanes - 1:
            ax.text(left - 0.08, top - (t + 0.5) * h, f"lane {t}", ha="right", va="center", fontsize=MIN_FONT)
    ax.text(left + 1.1, top + 0.12, "program 0's tile: [LANES, CHUNK]", ha="center", fontsize=FONT)
    ax.text(left + 2.3, top - groups_per_block * h / 2,
            f"{groups_per_block} groups per block:\none group a lane", va="center", fontsize=MIN_FONT)
    ax.text(left + 2.3, top - (groups_per_block + lanes) * h / 2,
            f"lanes {groups_per_block} to {lanes - 1} idle:\ntl.dot takes 16 or more", va="center", fontsize=MIN_FONT)
    ax.text(left + 1.1, top - lanes * h - 0.3, "its values shared out among the threads\nof its warps (32 threads a warp)",
            ha="center", va="top", fontsize=MIN_FONT)
    ax.add_patch(FancyArrowPatch((width / 2, 4.12), (left - 0.75, 4.3), arrowstyle="-|>", mutation_scale=9,
                                 color=MUTED, lw=0.9, linestyle="--", connectionstyle="arc3,rad=-0.12"))
    ax.set_xlim(-0.1, 11.2)
    ax.set_ylim(-0.1, 5.3)
    ax.set_axis_off()
    ax.set_title("A launch starts a grid of programs; each SM runs several at once, each program works on tiles "
                 "of lanes", fontsize=TITLE_FONT, loc="left")
    return fig
