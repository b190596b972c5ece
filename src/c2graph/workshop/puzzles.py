"""Notebook 02's Triton puzzles: the batches their checks run, the answers in torch, and the pictures.

Each puzzle is one piece of the fused kernel (:mod:`c2graph.compressor.fused_kernel`), small
enough to write in a few lines:

1. the rows a request owns, read from the extend offsets (the kernel's ``request_slot_table`` and
   ``in_request``);
2. a masked gather of each group row's partner, the previous row or a ring row (``partners``);
3. a row sum in one fixed order, neighbours first (``row_sum``);
4. the park loop, whose bounds a program reads at run time (``park_in_ring``).

Here are the batches of the checks (:class:`Puzzle`, built from real :class:`ExtendBatch` es of
the ``tiny`` preset), what each puzzle must produce, computed in torch on the host, and
:func:`draw_touches`, the picture of which elements one program reads and writes. The checks
themselves are in :mod:`c2graph.workshop.kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.pools import POISON
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.rows import BatchPlan, Partner
from ..pictures.style import (EDGE, FONT, MIN_FONT, MUTED, PADDING_COLOUR, TITLE_FONT, figure_width, legend_below,
                              request_colour, text_colour)

RING = 2
"""Ring rows per pool request in every puzzle (the ``tiny`` preset's)."""
POOL_REQUESTS = 6
D = 16
"""Columns of the rows the gather and the park copy."""


@dataclass(frozen=True)
class Puzzle:
    """One batch a puzzle's check runs: its rows, its offsets, and which row is what."""

    what: str
    batch: ExtendBatch

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    @property
    def request_slots(self) -> int:
        return self.batch.request_slots

    def offsets(self) -> torch.Tensor:
        """``[2, request_slots]`` int32 on the host: each slot's first row, then its row count."""
        return self.batch.extend_offsets.cpu()

    def plan(self) -> BatchPlan:
        """What every row does (:func:`~c2graph.compressor.rows.plan_rows`): the answers come from it."""
        return self.batch.plan(RING)

    def slots(self) -> torch.Tensor:
        """``[T]`` int32: each row's request slot; -1 for a padding row (puzzle 1's answer)."""
        return torch.tensor([-1 if r.request_slot is None else r.request_slot for r in self.plan().rows], dtype=torch.int32)

    def first(self) -> torch.Tensor:
        """``[T]`` bool: the row is the first row of its request."""
        firsts = {rows.start for rows in self.batch.row_ranges() if rows}
        return torch.tensor([r in firsts for r in range(self.num_rows)], dtype=torch.bool)

    def group(self) -> torch.Tensor:
        """``[T]`` bool: the row completes a group (a live row at an odd ``pos``)."""
        return torch.tensor([r.completes_group for r in self.plan().rows], dtype=torch.bool)

    def partner_source(self) -> list[tuple[str, int] | None]:
        """Per row, where its partner comes from (puzzle 2's answer): ``("row", r)`` of the buffer,
        ``("ring", k)`` for a group row first in its request; ``None`` for a row with no group."""
        return [("ring", r.partner_ring_row) if r.partner is Partner.RING else
                ("row", r.partner_row) if r.partner is Partner.PREVIOUS_ROW else None for r in self.plan().rows]

    def first_pairs(self) -> torch.Tensor:
        """``[request_slots]`` int32: the batch-wide number of each slot's first pair of rows."""
        pairs = (self.offsets()[1] + 1) // 2
        return (torch.cumsum(pairs, 0) - pairs).to(torch.int32)

    def parked(self) -> dict[int, int]:
        """``{ring row: buffer row}``: each request's last ``min(count, RING)`` rows (puzzle 4's answer)."""
        return self.plan().parked

    def parked_by(self, program: int, groups_per_block: int) -> set[int]:
        """The request slots program ``program`` parks: those whose first pair lies in its block."""
        fp = self.first_pairs().tolist()
        return {s for s in range(self.request_slots) if program * groups_per_block <= fp[s] < (program + 1) * groups_per_block}


def puzzles(seed: int) -> list[Puzzle]:
    """The checks' batches: hand-made edge cases first (notebook 02's own batch; a one-row batch; one
    live row, fewer than the ring, then padding; a one-row request first; a zero-length request, and a request at an odd position
    next to padding; every request slot full, the last request ending at the bucket's end), then a
    random one drawn from ``seed``: the same batches, and so the same verdict, on every run."""
    cfg = Config.tiny()
    alloc = ReqToTokenPool(cfg, pool_requests=POOL_REQUESTS, max_seq_len=96, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 5, (1,), generator=g))
    pools = torch.randperm(POOL_REQUESTS, generator=g)[:n].tolist()
    rand = [(p, int(torch.randint(0, 20, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g))) for p in pools]
    live = sum(r[2] for r in rand)

    def batch(requests, slots, pad_to):
        return ExtendBatch.build(requests, alloc, request_slots=slots, pad_to=pad_to, device="cpu")

    return [
        Puzzle("notebook 02's batch (4 requests, 6 request slots, 5 padding rows)",
               batch([(0, 5, 7), (3, 0, 15), (1, 3, 1), (4, 9, 12)], 6, 40)),
        Puzzle("a one-row batch: one row in all, fewer than the ring, at an odd position (1 request slot)",
               batch([(2, 5, 1)], 1, 1)),
        Puzzle("one live row in all, fewer than the ring, at an odd position (3 padding rows)",
               batch([(2, 5, 1)], 2, 4)),
        Puzzle("a one-row request first, at an odd position (3 requests, 7 request slots)",
               batch([(2, 7, 1), (5, 0, 6), (0, 4, 9)], 7, 19)),
        Puzzle("a zero-length request, then one at an odd position ending next to padding (4 request slots)",
               batch([(0, 2, 5), (3, 4, 0), (5, 9, 3)], 4, 12)),
        Puzzle("every request slot full, the last request ending at the bucket's end (no padding)",
               batch([(1, 3, 4), (4, 0, 5), (2, 6, 7)], 3, 16)),
        Puzzle(f"a random batch (seed {seed}: {n} requests, {n + 1} request slots)",
               batch(rand, n + 1, live + int(torch.randint(0, 4, (1,), generator=g)))),
    ]


# --- what a wrong answer holds, in words -----------------------------------------------------------

INT_POISON = int(POISON)
BEFORE, AFTER, PAST_RING = 1000.0, 2000.0, 3000.0
"""Guard rows: before ``x``, after it, past the ring. A copy of one names a read out of bounds."""


def named_x(rows: int, after: bool = True) -> torch.Tensor:
    """``[1 + rows (+ 1), D]`` fp32: a guard row, then x row ``r`` holding ``r + 1 + c / 64`` (a value
    that names its row), then a guard row past the end. Pass ``x[1:]`` to the kernel."""
    cols = torch.arange(D) / 64
    parts = [(BEFORE + cols)[None], torch.arange(1, rows + 1.0)[:, None] + cols] + ([(AFTER + cols)[None]] if after else [])
    return torch.cat(parts)


def named_ring() -> torch.Tensor:
    """``[POOL_REQUESTS * RING + 1, D]`` fp32: ring row ``k`` holds ``-(k + 1) - c / 64``; a guard row past it."""
    cols = torch.arange(D) / 64
    return torch.cat([-torch.arange(1, POOL_REQUESTS * RING + 1.0)[:, None] - cols, (PAST_RING + cols)[None]])


def source_of(row: torch.Tensor) -> str:
    """Which row of :func:`named_x` or :func:`named_ring` ``row`` (``[D]``) is a copy of."""
    first, cols = float(row[0]), torch.arange(row.shape[0]) / 64
    for base, what in ((BEFORE, "the row before x (row -1)"), (AFTER, "a row past the end of x"),
                       (PAST_RING, "the row past the end of the ring")):
        if torch.equal(row, base + cols):
            return what
    if first >= 1 and first == int(first) and torch.equal(row, first + cols):
        return f"x row {int(first) - 1}"
    if -POOL_REQUESTS * RING <= first <= -1 and first == int(first) and torch.equal(row, first - cols):
        return f"ring row {int(-first) - 1}"
    return "values that are no row of x or of the ring"


# --- puzzle 3: the fixed order and the orders it is not -----------------------------------------


def halving_sum(x: torch.Tensor) -> torch.Tensor:
    """``[R, N]`` fp32 -> ``[R]``: neighbours in pairs, then neighbouring pairs, ... (the kernel's order)."""
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


def halves_sum(x: torch.Tensor) -> torch.Tensor:
    """Column ``c`` plus column ``c + N/2``, again and again: a fixed order, but not the kernel's."""
    while x.shape[1] > 1:
        x = x[:, : x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    return x[:, 0]


def sequential_sum(x: torch.Tensor) -> torch.Tensor:
    """``((x0 + x1) + x2) + ...``: one column after another."""
    total = x[:, 0].clone()
    for c in range(1, x.shape[1]):
        total = total + x[:, c]
    return total


def sum_rows(seed: int, rows: int, n: int) -> torch.Tensor:
    """``[rows, n]`` fp32 of many magnitudes and both signs: the order of the adds shows in the last bits."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-12, 13, (rows, n), generator=g).float())
    sign = torch.where(torch.rand(rows, n, generator=g) < 0.5, -1.0, 1.0)
    return sign * mag * (1 + torch.rand(rows, n, generator=g))


# --- the picture of one program --------------------------------------------------------------------

READ, WRITTEN = "read", "written"


@dataclass
class Strip:
    """One tensor drawn as a strip of cells: the text and colour of each, and what one program does to each."""

    name: str
    texts: list[str]
    colours: list[str]
    touched: dict[int, str]  # cell -> READ or WRITTEN
    masked: frozenset[int] = frozenset()  # cells a masked load leaves out (drawn hatched)


def draw_touches(strips: list[Strip], title: str, note: str = "") -> Figure:
    """The cells of each strip; a thick black edge where the program reads, a red one where it writes."""
    width = max(len(s.texts) for s in strips)
    fig = Figure(figsize=(figure_width(0.28 * width + 2.2, 7.0), 0.62 * len(strips) + 1.3), layout="constrained")
    ax = fig.subplots()
    for k, strip in enumerate(strips):
        y = -1.4 * k
        ax.text(-0.4, y + 0.5, strip.name, ha="right", va="center", fontsize=FONT)
        for i, (text, colour) in enumerate(zip(strip.texts, strip.colours)):
            how = strip.touched.get(i)
            quiet = (MUTED if i in strip.masked else "white", 1.0)
            edge, lw = {READ: ("black", 2.2), WRITTEN: ("#C00000", 2.6)}.get(how, quiet)
            ax.add_patch(Rectangle((i + 0.06, y + 0.06), 0.88, 0.88, facecolor=colour, edgecolor=edge, lw=lw,
                                   hatch="//" if i in strip.masked else None))
            if text:
                ax.text(i + 0.5, y + 0.5, text, ha="center", va="center", fontsize=MIN_FONT, color=text_colour(colour))
    ax.set_xlim(-0.5 - max(len(s.name) for s in strips) * 0.2, width + 0.2)
    ax.set_ylim(-1.4 * len(strips) + 0.9, 1.2)
    ax.set_axis_off()
    ax.set_title(title, fontsize=TITLE_FONT, loc="left")
    handles = [Patch(facecolor="white", edgecolor="black", lw=2.2, label="the program reads it"),
               Patch(facecolor="white", edgecolor="#C00000", lw=2.6, label="the program writes it")]
    if any(s.masked for s in strips):
        handles.append(Patch(facecolor="white", edgecolor=EDGE, hatch="//", label="masked: not loaded"))
    if note:
        handles.append(Patch(facecolor="none", edgecolor="none", label=note))
    legend_below(fig, handles)
    return fig


def _row_strip(p: Puzzle, name: str, touched: dict[int, str]) -> Strip:
    slots = p.slots().tolist()
    pos = p.batch.pos.tolist()
    return Strip(name, [str(v) if s >= 0 else "" for v, s in zip(pos, slots)],
                 [request_colour(s) if s >= 0 else PADDING_COLOUR for s in slots], touched)


def _ring_colours(p: Puzzle) -> list[str]:
    """Each ring row in the colour of the batch's request slot whose pool request owns it (grey: none)."""
    slot_of = {q.pool_index: s for s, q in enumerate(p.batch.requests)}
    return [request_colour(slot_of.get(k // RING)) for k in range(POOL_REQUESTS * RING)]


def draw_rows_puzzle(p: Puzzle, program: int, rows: int, s_pad: int) -> Figure:
    """Puzzle 1: program ``program`` loads every slot's first row and count and writes its ``rows`` rows' slots."""
    starts, counts = p.offsets().tolist()
    S = p.request_slots
    pad = frozenset(range(S, s_pad))
    colours = [request_colour(s) if s < S and counts[s] else "white" for s in range(s_pad)]
    mine = range(program * rows, min((program + 1) * rows, p.num_rows))
    strips = [Strip("offsets_ptr + s: first rows", [str(v) for v in starts] + [""] * (s_pad - S), colours,
                    dict.fromkeys(range(S), READ), pad),
              Strip("offsets_ptr + request_slots + s: counts", [str(v) for v in counts] + [""] * (s_pad - S), colours,
                    dict.fromkeys(range(S), READ), pad),
              _row_strip(p, "slot[row] (cells: pos)", dict.fromkeys(mine, WRITTEN))]
    return draw_touches(strips, f"Puzzle 1: program {program}, ROWS = {rows} rows a program, S_PAD = {s_pad} lanes of slots",
                        note=f"lanes {S} to {s_pad - 1}: past request_slots = {S}")


def draw_partners_puzzle(p: Puzzle, program: int, rows: int) -> Figure:
    """Puzzle 2: program ``program`` reads its group rows' partners (previous rows, ring rows) and writes them."""
    mine = range(program * rows, min((program + 1) * rows, p.num_rows))
    sources = p.partner_source()
    read, ring = {}, {}
    for r in mine:
        if sources[r] is not None:
            where, k = sources[r]
            (read if where == "row" else ring)[k] = READ
    out = {r: WRITTEN for r in mine if sources[r] is not None}
    strips = [Strip(f"ring rows (req * {RING} + k)", [str(k) for k in range(POOL_REQUESTS * RING)], _ring_colours(p), ring),
              _row_strip(p, "x rows (cells: pos)", read),
              _row_strip(p, "out rows (cells: pos)", out)]
    return draw_touches(strips, f"Puzzle 2: program {program}, ROWS = {rows} rows a program, gathers the partners "
                                "of its group rows")


def draw_park_puzzle(p: Puzzle, program: int, groups_per_block: int) -> Figure:
    """Puzzle 4: program ``program`` parks the requests whose first pair is one of its ``groups_per_block`` groups."""
    fp = p.first_pairs().tolist()
    pairs = int(((p.offsets()[1] + 1) // 2).sum())
    slot_of_pair = [next(s for s in range(p.request_slots) if fp[s] <= k and (s + 1 == p.request_slots or k < fp[s + 1]))
                    for k in range(pairs)]
    mine = p.parked_by(program, groups_per_block)
    parked = p.parked()
    first_pairs = {fp[s]: READ for s in mine if fp[s] < pairs}
    rows = {r: READ for k, r in parked.items() if p.slots()[r].item() in mine}
    ring = {k: WRITTEN for k, r in parked.items() if p.slots()[r].item() in mine}
    strips = [Strip(f"pairs (blocks of {groups_per_block})", [str(k // groups_per_block) for k in range(pairs)],
                    [request_colour(s) for s in slot_of_pair], first_pairs),
              _row_strip(p, "x rows (cells: pos)", rows),
              Strip(f"ring rows (req * {RING} + pos % {RING})", [str(k) for k in range(POOL_REQUESTS * RING)],
                    _ring_colours(p), ring)]
    return draw_touches(strips, f"Puzzle 4: program {program} parks request slots {sorted(mine)} "
                                f"(their first pair is in its block; cells of pairs: the block)")


def draw_row_sum_puzzle(n: int = 8) -> Figure:
    """Puzzle 3: the order of the adds of one row of ``n`` columns, neighbours first, level by level."""
    fig = Figure(figsize=(7.0, 2.8), layout="constrained")
    ax = fig.subplots()
    level, names = 0, [f"x{c}" for c in range(n)]
    while names:
        width = n / len(names)
        for i, name in enumerate(names):
            x = i * width + width / 2
            ax.text(x, -level, name, ha="center", va="center", fontsize=MIN_FONT if len(name) > 8 else FONT,
                    bbox=dict(boxstyle="round", facecolor=request_colour(1) if level else "white", edgecolor=EDGE))
            if level:
                for child in (2 * i, 2 * i + 1):
                    ax.plot([x, child * width / 2 + width / 4], [-level + 0.25, -level + 0.75], color=MUTED, lw=1)
        if len(names) == 1:
            break
        names = [f"s{level + 1}.{i}" for i in range(len(names) // 2)]
        level += 1
    ax.set_xlim(0, n)
    ax.set_ylim(-level - 0.5, 0.5)
    ax.set_axis_off()
    ax.set_title(f"Puzzle 3: one row of {n} columns, summed in {level} rounds of adds of neighbours",
                 fontsize=TITLE_FONT, loc="left")
    return fig
