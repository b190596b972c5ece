"""What each program of the fused kernel does for a batch, recomputed on the host (pictures, checks)."""

from __future__ import annotations

from .batch import ExtendBatch
from .fused import BLOCK_M


def program_plan(batch: ExtendBatch, ring_size: int, block_m: int = BLOCK_M) -> list[dict]:
    """The kernel's decisions for ``batch``, program by program, recomputed on the host.

    One dict per program: ``rows`` (its range), ``groups`` (rows that store a latent), ``from_ring``
    (group rows whose partner is a ring row), ``parks`` (``{ring row: batch row}`` it writes).
    Reads the batch's tensors (a host sync): for pictures and checks, never inside a capture.
    """
    starts, counts = batch.extend_offsets.tolist()
    pos, req, raw = (t.tolist() for t in (batch.pos, batch.req, batch.raw_out_loc))
    T = batch.num_rows
    plan = []
    for lo in range(0, T, block_m):
        rows = range(lo, min(lo + block_m, T))
        entry = {"rows": rows, "groups": [], "from_ring": [], "parks": {}}
        for row in rows:
            slot = sum(s <= row for s in starts) - 1
            if slot < 0 or row >= starts[slot] + counts[slot] or pos[row] % 2 == 0 or raw[row] == 0:
                continue
            entry["groups"].append(row)
            if row == starts[slot]:
                entry["from_ring"].append(row)
        for s, c in zip(starts, counts):
            if lo <= s < lo + block_m:
                for row in range(s + c - min(c, ring_size), s + c):
                    if raw[row] != 0:
                        entry["parks"][req[row] * ring_size + pos[row] % ring_size] = row
        plan.append(entry)
    return plan
