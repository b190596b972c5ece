"""What each program of the fused kernel does for a batch, recomputed on the host (pictures, checks).

Every row's facts (does it complete a group, where is its partner, is it parked, its request
slot) come from the one row plan, :func:`~c2graph.compressor.rows.plan_rows`; this module only
shares the rows out the way :mod:`~c2graph.compressor.fused_kernel` does: blocks of ``block_m``
rows, one program each; a pass over the block's even rows and one over its odd rows, lane ``t``
on row ``2t + parity``, a pass skipped where no row of its parity completes a group; the parks of
each request by the block holding its first row.
"""

from __future__ import annotations

from .batch import ExtendBatch
from .fused import BLOCK_M, block_lanes
from .rows import Partner, plan_rows


def program_plan(batch: ExtendBatch, ring_size: int, block_m: int = BLOCK_M) -> list[dict]:
    """The kernel's decisions for ``batch``, program by program (one program a block of ``block_m`` rows).

    One dict per program:

    - ``rows``: its block of rows (a ``range``)
    - ``passes``: ``{parity: lanes}`` for the passes the program runs (0: its even rows, 1: its
      odd rows), ``lanes`` the row each lane computes (``None``: its row completes no group)
    - ``groups``: the rows that store a latent, in row order
    - ``from_ring``: the group rows whose partner is a ring row
    - ``parks``: ``{ring row: batch row}`` it writes, for ``parked_slots``: the request slots
      whose first row is in its block

    ``block_m`` defaults to the ``tiny`` preset's; a ``dsv41`` layer's is
    ``kernel_blocks(cfg.D, batch.num_rows).block_m``. Reads the batch's tensors (a host sync): for pictures and
    checks, never inside a capture.
    """
    plan = plan_rows(batch, ring_size)
    lanes = block_lanes(block_m)
    stride = block_m // lanes  # 1: one pass takes every row; 2: a pass over even rows, one over odd
    first_row = {}  # request slot -> its first row
    for r in plan.rows:
        if r.request_slot is not None:
            first_row.setdefault(r.request_slot, r.row)
    programs = []
    for lo in range(0, batch.num_rows, block_m):
        block = range(lo, min(lo + block_m, batch.num_rows))

        def lanes_of(parity):
            rows = [lo + stride * t + parity for t in range(lanes)]
            return [r if r in block and plan.rows[r].completes_group else None for r in rows]

        passes = {parity: lanes_of(parity) for parity in range(stride)}
        passes = {parity: rows for parity, rows in passes.items() if any(r is not None for r in rows)}
        groups = sorted(r for rows in passes.values() for r in rows if r is not None)
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
