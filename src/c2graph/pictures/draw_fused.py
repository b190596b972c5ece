"""Pictures for notebook 02 (the fused kernel): the extend offsets, the programs, the launch counts.

Every function takes plain objects (a batch, counts) and returns a :class:`matplotlib.figure.Figure`
made without pyplot, so nothing is shown twice and nothing stays in pyplot's state: Jupyter shows
a returned figure, ``fig.savefig(path)`` writes it. None of them runs a kernel; they read the
batch's tensors on the host.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.fused import BLOCK_M
from ..compressor.programs import program_plan

_PAD = "#d9d9d9"
_RING_READ = "#c0392b"
_PARK = "#1f5fa8"


def _slot_colours(n: int) -> list:
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _row_slots(batch: ExtendBatch) -> list[int | None]:
    """The request slot of each row (``None`` for padding), from the extend offsets."""
    starts, counts = batch.extend_offsets.tolist()
    owner: list[int | None] = [None] * batch.num_rows
    for r, (s, c) in enumerate(zip(starts, counts)):
        for row in range(s, s + c):
            owner[row] = r
    return owner


def _draw_rows(ax, batch: ExtendBatch, y: float) -> None:
    """One cell per row at height ``y`` (number inside: ``pos``; below: the row), coloured by
    request slot, grey and hatched for padding."""
    colours = _slot_colours(batch.request_slots)
    pos = batch.pos.tolist()
    for row, slot in enumerate(_row_slots(batch)):
        face = _PAD if slot is None else (*colours[slot][:3], 0.45)
        ax.add_patch(Rectangle((row, y), 1, 1, facecolor=face, edgecolor="white", lw=1.2,
                               hatch="//" if slot is None else None))
        if slot is not None:
            ax.text(row + 0.5, y + 0.5, str(pos[row]), ha="center", va="center", fontsize=7)
        ax.text(row + 0.5, y - 0.35, str(row), ha="center", va="center", fontsize=5.5, color="dimgrey")
    ax.text(-0.3, y + 0.5, "pos", ha="right", va="center", fontsize=8)
    ax.text(-0.3, y - 0.35, "row", ha="right", va="center", fontsize=7, color="dimgrey")


def draw_extend_offsets(batch: ExtendBatch, title: str | None = None) -> Figure:
    """The ``[2, request_slots]`` extend offsets above the rows they describe.

    Each slot's column (first row, row count) points at its span of rows; slots past the batch
    point at the end of the live rows with count 0; padding rows belong to no slot.
    """
    starts, counts = batch.extend_offsets.tolist()
    S, T = batch.request_slots, batch.num_rows
    colours = _slot_colours(S)
    fig = Figure(figsize=(max(8.0, 0.32 * T + 2), 3.4))
    ax = fig.subplots()
    cell_w = max(2.0, T / max(S, 1) * 0.6)
    x0 = (T - cell_w * S) / 2
    for r in range(S):
        x = x0 + r * cell_w
        face = (*colours[r][:3], 0.45) if counts[r] else "white"
        for k, value in enumerate((starts[r], counts[r])):
            ax.add_patch(Rectangle((x, 3.2 - k * 0.8), cell_w, 0.8, facecolor=face, edgecolor="black",
                                   lw=0.8))
            ax.text(x + cell_w / 2, 3.6 - k * 0.8, str(value), ha="center", va="center", fontsize=9)
        ax.text(x + cell_w / 2, 4.25, f"slot {r}", ha="center", va="center", fontsize=8)
        # the arrow points at the slot's first row; its span of rows is underlined below
        target = starts[r] + 0.5 if counts[r] else starts[r]
        ax.add_patch(FancyArrowPatch((x + cell_w / 2, 2.4), (target, 1.05), arrowstyle="-|>",
                                     mutation_scale=9, color=colours[r] if counts[r] else "grey", lw=1.0,
                                     linestyle="-" if counts[r] else ":"))
        if counts[r]:
            ax.plot([starts[r] + 0.05, starts[r] + counts[r] - 0.05], [-0.7, -0.7], color=colours[r], lw=3)
    ax.text(x0 - 0.3, 3.6, "[0, r]  first row", ha="right", va="center", fontsize=8)
    ax.text(x0 - 0.3, 2.8, "[1, r]  row count", ha="right", va="center", fontsize=8)
    _draw_rows(ax, batch, 0.0)
    if batch.live_rows < T:
        ax.text((batch.live_rows + T) / 2, -1.0, "padding: in no slot", ha="center", fontsize=8,
                color="dimgrey")
    ax.set_xlim(min(-2.0, x0 - 7), max(T, x0 + cell_w * S) + 0.5)
    ax.set_ylim(-1.3, 4.6)
    ax.set_axis_off()
    default = f"extend offsets [2, {S}] int32 and the {T} rows they describe (numbers in cells: pos)"
    ax.set_title(title or default, fontsize=10)
    fig.tight_layout()
    return fig


def draw_programs(
    batch: ExtendBatch, ring_size: int, block_m: int = BLOCK_M, title: str | None = None
) -> Figure:
    """Which program handles which rows, and where each group row's partner comes from.

    Rows are cells (number: ``pos``), coloured by request slot; group rows (odd ``pos``) have a
    black edge. A grey arc joins a group row to its partner in the previous row; a red arrow
    brings the partner from the ring (the first row of a request that starts at an odd
    position). Blue dashed arrows park each request's last rows in the ring, written by the
    program that owns the request's first row. Shaded bands are the programs.
    """
    plan = program_plan(batch, ring_size, block_m)
    T = batch.num_rows
    req, pos = batch.req.tolist(), batch.pos.tolist()
    fig = Figure(figsize=(max(8.0, 0.34 * T + 1.5), 4.2))
    ax = fig.subplots()
    for b, prog in enumerate(plan):
        lo, hi = prog["rows"].start, prog["rows"].stop
        ax.add_patch(Rectangle((lo, -1.4), hi - lo, 6.0, facecolor="#f2f2f2" if b % 2 == 0 else "white",
                               edgecolor="none", zorder=0))
        ax.text((lo + hi) / 2, -1.0, f"program {b}: rows {lo}..{hi - 1}", ha="center", fontsize=8)
    _draw_rows(ax, batch, 0.0)
    groups = {row for prog in plan for row in prog["groups"]}
    for row in groups:
        ax.add_patch(Rectangle((row, 0), 1, 1, facecolor="none", edgecolor="black", lw=1.3))

    # The ring rows of the batch's requests, drawn above the request's first row.
    # Each request's boxes start above its first row, or just after the previous request's boxes.
    ring_x, free = {}, 0.0
    for rows, r in zip(batch.row_ranges(), batch.requests):
        if not rows:
            continue
        left = max(float(rows.start), free)
        free = left + 2 * ring_size + 0.6
        ax.text(left + ring_size - 0.2, 4.05, f"req {r.pool_index}", ha="center", fontsize=7, color=_PARK)
        for k in range(ring_size):
            x = left + 2 * k
            ring_x[r.pool_index * ring_size + k] = x + 0.8
            ax.add_patch(Rectangle((x, 3.0), 1.6, 0.8, facecolor="white", edgecolor=_PARK, lw=1.0))
            ax.text(x + 0.8, 3.4, f"{r.pool_index * ring_size + k}", ha="center", va="center", fontsize=7,
                    color=_PARK)
    ax.text(-0.3, 3.4, "ring rows", ha="right", va="center", fontsize=8, color=_PARK)

    for prog in plan:
        for row in prog["groups"]:
            if row in prog["from_ring"]:
                src = ring_x[req[row] * ring_size + (pos[row] - 1) % ring_size]
                ax.add_patch(FancyArrowPatch((src, 3.0), (row + 0.5, 1.02), arrowstyle="-|>",
                                             mutation_scale=10, color=_RING_READ, lw=1.4))
            else:
                ax.add_patch(FancyArrowPatch((row - 0.45, 1.02), (row + 0.45, 1.02), arrowstyle="-|>",
                                             connectionstyle="arc3,rad=-0.9", mutation_scale=7,
                                             color="dimgrey", lw=0.9))
        for ring_row, row in prog["parks"].items():
            ax.add_patch(FancyArrowPatch((row + 0.5, 1.9), (ring_x[ring_row], 2.98), arrowstyle="-|>",
                                         mutation_scale=8, color=_PARK, lw=0.9, linestyle="--"))
            ax.plot([row + 0.5, row + 0.5], [1.0, 1.9], color=_PARK, lw=0.9, linestyle="--")

    ax.plot([], [], color="dimgrey", label="partner: previous row")
    ax.plot([], [], color=_RING_READ, label="partner: ring row (read in phase 1)")
    ax.plot([], [], color=_PARK, linestyle="--", label="parked (phase 3, by the first row's program)")
    ax.legend(loc="upper right", fontsize=7, ncol=3, frameon=False, bbox_to_anchor=(1.0, 1.12))
    ax.set_xlim(-4.5, T + 0.5)
    ax.set_ylim(-1.5, 4.6)
    ax.set_axis_off()
    default = (f"{len(plan)} programs of BLOCK_M = {block_m} rows. Cells: pos; black edge: a group row "
               "(odd pos); hatched: padding")
    ax.set_title(title or default, fontsize=10, loc="left")
    fig.tight_layout()
    return fig


def draw_launch_counts(launches: dict[str, int], mib: dict[str, float], title: str | None = None) -> Figure:
    """Two bar panels side by side: kernel launches and MiB moved, one bar per path."""
    names = list(launches)
    colours = ["#c0392b", "#1f8a4c", "#7f7f7f"][: len(names)]
    fig = Figure(figsize=(9, 2.4))
    a, b = fig.subplots(1, 2)
    for ax, values, unit in ((a, launches, "launches"), (b, mib, "MiB moved")):
        vals = [values[n] for n in names]
        ax.barh(names, vals, color=colours)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:,.0f}" if v >= 10 else f" {v:g}", va="center", fontsize=9)
        ax.set_xlim(0, max(vals) * 1.25)
        ax.set_xlabel(unit)
        ax.invert_yaxis()
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    b.set_yticklabels([])
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_timings(
    rows: list[int], eager_us: dict[str, list[float]], gpu_us: dict[str, list[float]] | None = None,
    title: str | None = None,
) -> Figure:
    """Time per call against the number of rows (log-log), one colour per path.

    ``eager_us``: the wall time of an eager call (solid lines); ``gpu_us``: the time its kernels
    ran on the GPU (dashed lines, same colour). Where the solid line lies far above the dashed
    one, the CPU launching the work sets the time, not the GPU doing it.
    """
    fig = Figure(figsize=(8.4, 3.4))
    ax = fig.subplots()
    colours = _slot_colours(len(eager_us))
    for colour, (name, us) in zip(colours, eager_us.items()):
        ax.plot(rows, us, marker="o", color=colour, label=f"{name}: eager call")
        if gpu_us and name in gpu_us:
            ax.plot(rows, gpu_us[name], marker="s", linestyle="--", color=colour, label=f"{name}: GPU time")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows in the batch (T)")
    ax.set_ylabel("µs per call (median)")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or "one source layer, dsv41 preset", fontsize=10)
    fig.tight_layout()
    return fig
