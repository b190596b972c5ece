"""What each program of the fused kernel does for a batch, recomputed on the host (pictures, checks).

Every row's facts (does it complete a group, where is its partner, is it parked, its request
slot) come from the one row plan, :func:`~c2graph.compressor.rows.plan_rows`; this module only
shares the work out the way :mod:`~c2graph.compressor.fused_kernel` does: each request's rows cut
into pairs (rows 0 and 1, 2 and 3, ...), the batch's groups numbered pair by pair in row order,
blocks of ``groups_per_block`` of them, one program each, lane ``t`` of block ``b`` on group
``b * groups_per_block + t``, computing the pair's group row (its row at an odd position); each
request parked by the block that holds its first pair.
"""

from __future__ import annotations

from .arguments import as_int
from .batch import ExtendBatch
from .fused import block_lanes, grid_blocks, kernel_blocks
from .rows import Partner, plan_rows


def program_plan(batch: ExtendBatch, ring_size: int, groups_per_block: int | None = None, *, D: int | None = None) -> list[dict]:
    """The kernel's decisions for ``batch``, program by program (one program a block of ``groups_per_block`` groups).

    ``D``: the layer's latent width (``cfg.D``); the blocks are then the ones the kernel picks for
    it and the batch's rows (:func:`~c2graph.compressor.fused.kernel_blocks`). ``groups_per_block``
    instead names the groups per block outright (a picture of another choice). One of the two is needed.

    One dict per program, for every block of the grid (:func:`~c2graph.compressor.fused.grid_blocks`):

    - ``lanes``: the group row each lane computes (``None``: an idle lane: past ``groups_per_block``,
      past the batch's last group, or on a pair with no odd position)
    - ``groups``: the rows that store a latent, in row order (the busy lanes)
    - ``rows``: the rows its lanes read, its first group's partner to its last group row (a
      ``range``; empty for a program with no group)
    - ``from_ring``: the group rows whose partner is a ring row
    - ``parks``: ``{ring row: batch row}`` it writes, for ``parked_slots``: the request slots
      whose first pair is one of its lanes'

    Reads the batch's tensors (a host sync): for pictures and checks, never inside a capture.
    """
    if groups_per_block is None and D is None:
        raise ValueError("program_plan needs D (the layer's latent width, cfg.D: the kernel picks its blocks "
                         "from it) or groups_per_block; expected one of them")
    if groups_per_block is None:
        groups_per_block = kernel_blocks(as_int("D", D, least=1), batch.num_rows).groups_per_block
    groups_per_block = as_int("groups_per_block", groups_per_block, least=1)
    plan = plan_rows(batch, ring_size)
    lanes = block_lanes(groups_per_block)
    pair_rows = [next((row for row in pair if plan.rows[row].completes_group), None) for pair in plan.pairs]
    first_pair = {}  # request slot -> the number of its first pair
    for p, pair in enumerate(plan.pairs):
        first_pair.setdefault(plan.rows[pair.start].request_slot, p)
    programs = []
    for b in range(grid_blocks(batch.num_rows, batch.request_slots, groups_per_block)):
        mine = [b * groups_per_block + t for t in range(lanes)]
        lane_rows = [pair_rows[p] if t < groups_per_block and p < len(pair_rows) else None for t, p in enumerate(mine)]
        rows = [r for r in lane_rows if r is not None]
        slots = [s for s, p in first_pair.items() if b * groups_per_block <= p < (b + 1) * groups_per_block]
        programs.append({
            "lanes": lane_rows,
            "groups": rows,
            "rows": range(rows[0] - (plan.rows[rows[0]].partner is Partner.PREVIOUS_ROW), rows[-1] + 1)
            if rows else range(0),
            "from_ring": [r for r in rows if plan.rows[r].partner is Partner.RING],
            "parks": {ring: row for ring, row in plan.parked.items() if plan.rows[row].request_slot in slots},
            "parked_slots": slots,
        })
    return programs
