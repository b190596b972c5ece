"""compare_slots: each place a batch writes, its state against eager's, and why it went wrong,
from the typed row plan; and the line compare_pools prints when it skips c2 slot 0."""

from __future__ import annotations

import pytest
import torch
from slot_cases import CFG, doctored_replay
from support import POISON, make_case

import c2graph as c2
from c2graph.compressor.rows import Partner
from c2graph.measure.compare import compare_pools
from c2graph.measure.slots import C2_SLOT, DIFFERS, EQUAL, NEVER_WRITTEN, RING_ROW, compare_slots, partner_under


def test_compare_slots():
    batch, graph, eager, differs, never = doctored_replay()
    report = compare_slots(graph, eager, batch, CFG.ring_size, poison=POISON)
    assert [s.row for s in report.slots] == batch.plan(CFG.ring_size).group_rows == [1, 3, 4, 6]
    assert [s.state for s in report.slots] == [EQUAL, EQUAL, DIFFERS, NEVER_WRITTEN]
    assert [s.partner for s in report.slots] == [Partner.PREVIOUS_ROW, Partner.PREVIOUS_ROW, Partner.RING,
                                                 Partner.PREVIOUS_ROW]
    assert report.slots[2].writer.partner_ring_row == 2
    assert {s.kind for s in report.slots} == {C2_SLOT} and {s.kind for s in report.ring} == {RING_ROW}
    assert [(s.index, s.row, s.state) for s in report.ring] == [
        (0, 2, EQUAL), (1, 3, EQUAL), (2, 5, EQUAL), (3, 6, NEVER_WRITTEN)]
    assert [(s.request_slot, s.req, s.pos) for s in report.ring] == [(0, 0, 2), (0, 0, 3), (1, 1, 4), (1, 1, 5)]
    assert [s.index for s in report.wrong(C2_SLOT)] == [differs, never]
    assert str(report) == (f"c2 slots: 2 of 4 wrong (1 differs [{differs}]; 1 never written [{never}]) | "
                           "ring rows: 1 of 4 wrong (1 never written [3])")
    assert all(s.why == "" for s in report.slots)  # nothing said about what the graph read
    assert not compare_slots(eager, eager.clone(), batch, CFG.ring_size).wrong()
    with pytest.raises(ValueError, match="graph_pools is a Tensor; expected a Pools"):
        compare_slots(graph.kv_cache, eager, batch, CFG.ring_size)


def test_why_from_what_the_graph_read():
    batch, graph, eager, _, _ = doctored_replay()
    one_request = torch.tensor([[0, 7], [7, 0]], dtype=torch.int32)  # frozen: all rows one request
    report = compare_slots(graph, eager, batch, CFG.ring_size, poison=POISON, frozen_offsets=one_request)
    assert [s.why for s in report.slots] == ["", "", "graph used:\nrow 3", ""]  # row 4 pairs across requests
    rings = (eager.ring.clone(), eager.ring.clone())
    rings[0][2] = POISON  # the graph's ring row 2 was never parked before the batch
    report = compare_slots(graph, eager, batch, CFG.ring_size, poison=POISON, rings_before=rings, grid_pairs=3)
    assert [s.why for s in report.slots] == ["", "", "ring row 2\nheld the poison", "pair 3: past\nthe grid's 3"]
    rings[0][2] = 0.5
    report = compare_slots(graph, eager, batch, CFG.ring_size, poison=POISON, rings_before=rings)
    assert report.slots[2].why == "ring row 2\nheld other bytes"


def test_partner_under_frozen_offsets():
    batch, *_ = doctored_replay()
    plan = batch.plan(CFG.ring_size)
    own, pos = batch.extend_offsets.tolist(), batch.pos.tolist()
    for r in plan.rows:  # under the batch's own offsets: the planned partner of every group row
        if r.completes_group:
            planned = (r.partner, r.partner_row if r.partner is Partner.PREVIOUS_ROW else r.partner_ring_row)
            assert partner_under(own, r, CFG.ring_size, pos) == planned
    row4, row6 = plan.rows[4], plan.rows[6]  # pos 3 (request 1's first row), pos 5
    assert partner_under([[0, 7], [7, 0]], row4, CFG.ring_size, pos) == (Partner.PREVIOUS_ROW, 3)
    assert partner_under([[0, 4], [4, 0]], row4, CFG.ring_size, pos) == (Partner.PADDING, None)
    assert partner_under([[0, 4], [4, 3]], plan.rows[1], CFG.ring_size, pos) == (Partner.PREVIOUS_ROW, 0)
    # rows 5, 6 as one request from pos 4: the pair (5, 6) computes row 6, paired with row 5 as planned
    assert partner_under([[0, 5], [5, 2]], row6, CFG.ring_size, pos) == (Partner.PREVIOUS_ROW, 5)
    # rows 3.. as one request: the pair (3, 4) is at pos 3 and 3, so its lane computes row 3 (a first
    # row: its partner from the ring) and row 4 gets no lane
    assert partner_under([[0, 3], [3, 4]], plan.rows[3], CFG.ring_size, pos) == (Partner.RING, 0)
    assert partner_under([[0, 3], [3, 4]], row4, CFG.ring_size, pos) == (Partner.NONE_EVEN, None)


def test_compare_pools_says_when_it_skips_c2_slot_0():
    """The torch path dumps its unwanted stores in c2 slot 0: skipped, the comparison passes and says so."""
    layer, alloc, pools = make_case(use_fused_gate=False, seed=3)
    before = pools.clone()
    batch = c2.ExtendBatch.build([(0, 0, 5)], alloc, pad_to=8, device=pools.device)
    empty = c2.ExtendBatch.build([], alloc, pad_to=4, device=pools.device)  # an idle rank: padding only
    c2.compress(layer, layer.random_hidden(0, seed=1), empty, pools)
    results = compare_pools(pools, before)
    assert all(results)
    n = pools.kv_cache.shape[0] - 1
    assert [str(r) for r in results[:2]] == [
        f"kv_cache: pass ({n} slots bitwise; c2 slot 0 skipped: the torch path's dump slot)",
        f"index_k: pass ({n} slots bitwise; c2 slot 0 skipped: the torch path's dump slot)",
    ]
    assert str(results[2]) == f"ring: pass ({pools.ring.shape[0]} rows bitwise)"
    strict = compare_pools(pools, before, skip_slot0=False)
    assert not strict[0] and strict[0].bad == [0] and "skipped" not in str(strict[0])
    c2.compress(layer, layer.random_hidden(5, seed=2), batch, pools)
    failed = compare_pools(pools, before)[0]
    assert not failed and str(failed).startswith(f"kv_cache: FAIL, 2 of {n} slots differ")  # the groups at pos 1 and 3
    assert "; c2 slot 0 skipped: the torch path's dump slot): [" in str(failed)
