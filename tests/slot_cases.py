"""A doctored replay for the wrong-slot tests (tests/test_slots.py, tests/test_draw_graph.py)."""

from __future__ import annotations

from support import POISON

import c2graph as c2

CFG = c2.Config.tiny()


def doctored_replay():
    """A batch, 'eager' pools with every written place filled, and 'graph' pools that differ from
    them at one c2 slot, never wrote another c2 slot and one ring row.

    Requests: (0, 0, 4) then (1, 3, 3): group rows 1, 3 (req 0), 4 (req 1's first row, at the odd
    pos 3: partner in ring row 2) and 6; parked ring rows 0, 1 (req 0) and 2, 3 (req 1).
    Returns ``(batch, graph pools, eager pools, the c2 slot that differs, the one never written)``.
    """
    alloc = c2.ReqToTokenPool(CFG, 4, 64, seed=0)
    batch = c2.ExtendBatch.build([(0, 0, 4), (1, 3, 3)], alloc, device="cpu")
    plan = batch.plan(CFG.ring_size)
    eager = c2.Pools(CFG, 4, alloc.kv_slots, device="cpu").poison(POISON)
    slots = plan.stored_slots
    for i, s in enumerate(slots):
        eager.kv_cache[s] = float(i + 1)
        eager.index_k[s] = float(-i - 1)
    for k in plan.parked:
        eager.ring[k] = float(k + 10)
    graph = eager.clone()
    differs, never = slots[2], slots[3]  # rows 4 and 6
    graph.kv_cache[differs] += 1.0
    graph.kv_cache[never] = POISON
    graph.index_k[never] = POISON
    graph.ring[3] = POISON
    return batch, graph, eager, differs, never
