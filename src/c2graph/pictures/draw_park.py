"""Notebook 02's worked example of the park: one request, followed through the kernel in order.

:func:`draw_one_request` draws, for one request slot of a batch, which program and which lane
read its first row's partner from the ring, and which ring rows the same program then parks the
request's last rows in, numbered in the order they happen. Everything drawn is computed from the
batch (:func:`one_request_steps`), in the programs of puzzle 4 (blocks of groups) or of the
assembly (blocks of rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..compressor.batch import ExtendBatch
from .style import (EDGE, FONT, MIN_FONT, PADDING_COLOUR, TITLE_FONT, figure_width, request_colour, text_colour)

READ_COLOUR, PARK_COLOUR = "#0072B2", "#C00000"


@dataclass(frozen=True)
class Steps:
    """One request's way through the kernel: who reads its ring partner, then parks its last rows."""

    slot: int
    rows: range
    program: int
    lane: int
    unit: str  # "group" (puzzle 4, the library) or "row" (the assembly)
    number: int  # the request's first group (its pair number), or its first row
    partner: tuple[int, int] | None  # (ring row, its pos) read by the first row, or None: pos even
    parked: list[tuple[int, int, int]]  # (batch row, its pos, ring row), in the order of j

    def sentences(self) -> list[str]:
        first = self.rows.start
        said = [f"1. request slot {self.slot}'s first {self.unit} is {self.unit} {self.number}: program "
                f"{self.program}'s, lane {self.lane}"]
        if self.partner:
            said.append(f"2. program {self.program}, lane {self.lane}: row {first} (pos {self.partner[1] + 1}) reads "
                        f"its partner (pos {self.partner[1]}) from ring row {self.partner[0]}")
        else:
            said.append(f"2. row {first} starts at an even pos: no partner in the ring to read")
        said.append(f"3. program {self.program}: tl.debug_barrier(), every load of the program done")
        again = [k for _, _, k in self.parked if self.partner and k == self.partner[0]]
        said.append(f"4. program {self.program} parks " + ", ".join(
            f"row {r} (pos {pos}) in ring row {k}" for r, pos, k in self.parked)
            + (f" (ring row {again[0]}: the row read in step 2, overwritten only now)" if again else ""))
        return said


def one_request_steps(batch: ExtendBatch, ring_size: int, slot: int, per_program: int, unit: str) -> Steps:
    """The steps of request slot ``slot``: ``unit`` ``"group"`` numbers its groups (pairs of rows,
    a request's rows 0 and 1 first) and gives program ``b`` groups ``b * per_program`` onwards;
    ``"row"`` gives program ``b`` rows ``b * per_program`` onwards."""
    ranges = batch.row_ranges()
    rows = ranges[slot]
    if not rows:
        raise ValueError(f"slot={slot}: request slot {slot} holds no row; pick one of "
                         f"{[s for s, r in enumerate(ranges) if r]}")
    if unit not in ("group", "row"):
        raise ValueError(f"unit={unit!r}: expected 'group' or 'row'")
    number = sum((len(r) + 1) // 2 for r in ranges[:slot]) if unit == "group" else rows.start
    plan = batch.plan(ring_size)
    first = plan.rows[rows.start]
    partner = (first.partner_ring_row, int(batch.pos[rows.start]) - 1) if first.partner_ring_row is not None else None
    parked = sorted((r, int(batch.pos[r]), k) for k, r in plan.parked.items() if r in rows)
    return Steps(slot, rows, number // per_program, number % per_program, unit, number, partner, parked)


def draw_one_request(batch: ExtendBatch, ring_size: int, pool_requests: int, slot: int, per_program: int,
                     unit: str) -> Figure:
    """The batch's rows and the ring; request slot ``slot``'s ring read (blue, step 2) and park (red,
    step 4), with the program and lane that do them, in the order they happen (the text under it)."""
    steps = one_request_steps(batch, ring_size, slot, per_program, unit)
    T = batch.num_rows
    slots = [r.request_slot for r in batch.plan(ring_size).rows]
    width = max(T, pool_requests * ring_size)
    fig = Figure(figsize=(figure_width(0.26 * width + 2.6, 8.0), 3.9), layout="constrained")
    ax = fig.subplots()
    for r in range(T):  # the batch's rows, numbered by pos; this request's in bold edges
        colour = request_colour(slots[r]) if slots[r] is not None else PADDING_COLOUR
        mine = r in steps.rows
        ax.add_patch(Rectangle((r + 0.06, 0.06), 0.88, 0.88, facecolor=colour, edgecolor="black" if mine else "white",
                               lw=1.8 if mine else 0.5))
        if slots[r] is not None:
            ax.text(r + 0.5, 0.5, str(int(batch.pos[r])), ha="center", va="center", fontsize=MIN_FONT,
                    color=text_colour(colour))
    ax.text(-0.4, 0.5, "batch rows (pos)", ha="right", va="center", fontsize=FONT)
    lo = steps.program * per_program if unit == "row" else steps.rows.start
    if unit == "row":  # the program's rows, under the batch
        hi = min(lo + per_program, T)
        ax.add_patch(Rectangle((lo, -0.55), hi - lo, 0.4, facecolor="#EEEEEE", edgecolor=EDGE, lw=0.8))
        ax.text((lo + hi) / 2, -0.35, f"program {steps.program}: rows {lo} to {hi - 1}", ha="center", va="center",
                fontsize=MIN_FONT)
    else:
        ax.text(steps.rows.start, -0.35, f"rows {steps.rows.start}, {steps.rows.start + 1}: group {steps.number} "
                f"= program {steps.program}, lane {steps.lane}", ha="left", va="center", fontsize=MIN_FONT)
    ring_y = 2.6
    for k in range(pool_requests * ring_size):
        touched = {steps.partner[0]} if steps.partner else set()
        parked = {p[2] for p in steps.parked}
        edge = PARK_COLOUR if k in parked else READ_COLOUR if k in touched else EDGE
        ax.add_patch(Rectangle((k + 0.06, ring_y + 0.06), 0.88, 0.88, facecolor="white", edgecolor=edge,
                               lw=2.2 if k in parked | touched else 0.8))
        ax.text(k + 0.5, ring_y + 0.5, str(k), ha="center", va="center", fontsize=MIN_FONT)
    ax.text(-0.4, ring_y + 0.5, "ring rows", ha="right", va="center", fontsize=FONT)
    if steps.partner:
        k = steps.partner[0]
        ax.add_patch(FancyArrowPatch((k + 0.5, ring_y), (steps.rows.start + 0.5, 0.98), arrowstyle="-|>",
                                     mutation_scale=11, color=READ_COLOUR, lw=1.8))
        ax.text((k + steps.rows.start) / 2 + 0.2, 1.75, "2", color=READ_COLOUR, fontsize=TITLE_FONT, weight="bold")
    for r, _, k in steps.parked:
        ax.add_patch(FancyArrowPatch((r + 0.5, 0.98), (k + 0.5, ring_y), arrowstyle="-|>", mutation_scale=11,
                                     color=PARK_COLOUR, lw=1.5, linestyle="--"))
    if steps.parked:
        r, _, k = steps.parked[-1]
        ax.text((r + k) / 2 + 0.6, 1.75, "4", color=PARK_COLOUR, fontsize=TITLE_FONT, weight="bold")
    for i, line in enumerate(steps.sentences()):
        ax.text(-0.4 - 0.2 * 17, -1.05 - 0.42 * i, line, ha="left", va="center", fontsize=FONT)
    ax.set_xlim(-0.5 - 0.2 * 17, width + 0.3)
    ax.set_ylim(-1.05 - 0.42 * 4, ring_y + 1.1)
    ax.set_axis_off()
    per = f"{per_program} groups" if unit == "group" else f"{per_program} rows"
    ax.set_title(f"Request slot {slot} (rows {steps.rows.start} to {steps.rows.stop - 1}), programs of {per}: "
                 "one program reads its ring partner, then parks it", fontsize=TITLE_FONT, loc="left")
    return fig
