"""What each program of the fused kernel does for a batch, recomputed on the host (pictures, checks).

Every row's facts (does it complete a group, where is its partner, is it parked, its request
slot) come from the one row plan, :func:`~c2graph.compressor.rows.plan_rows`; this module only
shares the rows out the way :mod:`~c2graph.compressor.fused_kernel` does: blocks of ``block_m``
rows, one program each, lane ``t`` of a block on the pair of rows ``(2t, 2t + 1)``, a second pass
for the pairs that hold two group rows, and the parks of each request by the block holding its
first row.
"""

from __future__ import annotations

from .batch import ExtendBatch
from .fused import BLOCK_M, block_lanes
from .rows import Partner, plan_rows


def program_plan(batch: ExtendBatch, ring_size: int, block_m: int = BLOCK_M) -> list[dict]:
    """The kernel's decisions for ``batch``, program by program (one program a block of ``block_m`` rows).

    One dict per program:

    - ``rows``: its block of rows (a ``range``)
    - ``passes``: one list per pass, the group row each lane computes (``None``: the lane has
      none); a second pass only where a pair of rows holds two group rows
    - ``groups``: the rows that store a latent, in row order
    - ``from_ring``: the group rows whose partner is a ring row
    - ``parks``: ``{ring row: batch row}`` it writes, for ``parked_slots``: the request slots
      whose first row is in its block

    ``block_m`` defaults to the ``tiny`` preset's; a ``dsv41`` layer's is
    ``kernel_blocks(cfg.D).block_m``. Reads the batch's tensors (a host sync): for pictures and
    checks, never inside a capture.
    """
    plan = plan_rows(batch, ring_size)
    lanes = block_lanes(block_m)
    first_row = {}  # request slot -> its first row
    for r in plan.rows:
        if r.request_slot is not None:
            first_row.setdefault(r.request_slot, r.row)
    programs = []
    for lo in range(0, batch.num_rows, block_m):
        block = range(lo, min(lo + block_m, batch.num_rows))

        def is_group(row, t):
            return t < block_m // 2 and row in block and plan.rows[row].completes_group

        pairs = [(is_group(lo + 2 * t, t), is_group(lo + 2 * t + 1, t)) for t in range(lanes)]
        first_pass = [lo + 2 * t + 1 if odd else lo + 2 * t if even else None for t, (even, odd) in enumerate(pairs)]
        second_pass = [lo + 2 * t if even and odd else None for t, (even, odd) in enumerate(pairs)]
        passes = [first_pass] + ([second_pass] if any(r is not None for r in second_pass) else [])
        groups = sorted(r for p in passes for r in p if r is not None)
        slots = sorted(s for s, row in first_row.items() if row in block)
        programs.append({
            "rows": block,
            "passes": passes,
            "groups": groups,
            "from_ring": [r for r in groups if plan.rows[r].partner is Partner.RING],
            "parks": {ring: row for ring, row in plan.parked.items() if plan.rows[row].request_slot in slots},
            "parked_slots": slots,
        })
    return programs
