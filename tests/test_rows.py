"""The row plan against what the torch path reads and writes (its masks, poisoned pools, a changed
ring row), on a fixed case and on random ragged batches; its table; its shortcuts on ExtendBatch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case, ragged_requests

import c2graph as c2
from c2graph.compressor.rows import Partner, plan_rows
from c2graph.compressor.torch_path import park_mask, previous_row_is_partner, ring_read_rows

CFG = c2.Config.tiny()


@pytest.fixture
def fixed():
    """Request 1 starts at odd pos 5: its first row reads ring row 1 * 2 + 4 % 2 = 2."""
    alloc = c2.ReqToTokenPool(CFG, 2, 16, seed=0)
    return c2.ExtendBatch.build([(0, 0, 3), (1, 5, 3)], alloc, pad_to=8, device="cpu").plan(CFG.ring_size)


def test_fixed_case(fixed):
    plan = fixed
    E, P, R, X = Partner.NONE_EVEN, Partner.PREVIOUS_ROW, Partner.RING, Partner.PADDING
    assert [r.partner for r in plan.rows] == [E, P, E, R, E, P, X, X]
    assert [r.partner_ring_row for r in plan.rows] == [None, None, None, 2, None, None, None, None]
    assert [r.partner_row for r in plan.rows] == [None, 0, None, None, None, 4, None, None]
    assert [r.pos for r in plan.rows] == [0, 1, 2, 5, 6, 7, None, None]
    assert [r.request_slot for r in plan.rows] == plan.request_slot_of_row == [0, 0, 0, 1, 1, 1, None, None]
    assert plan.request_rows == [range(0, 3), range(3, 6)]
    assert plan.group_rows == [1, 3, 5]
    assert plan.ring_reads == {3: 2}
    # last two rows of each request: pos 1, 2 of req 0 -> ring rows 1, 0; pos 6, 7 of req 1 -> 2, 3
    assert plan.parked == {1: 1, 0: 2, 2: 4, 3: 5}
    raw = plan.batch.raw_out_loc.tolist()
    assert plan.stored_slots == [raw[1] // 2, raw[3] // 2, raw[5] // 2]
    assert all(r.c2_slot is None and r.parked_in is None and r.is_padding for r in plan.rows[6:])
    assert [r.partner_text() for r in plan.rows[:4]] == ["none: even row", "previous row", "none: even row",
                                                         "ring row 2"]


def test_table_has_one_line_per_row(fixed):
    lines = fixed.table().splitlines()
    assert len(lines) == 1 + fixed.batch.num_rows + 1
    assert lines[0].split() == ["row", "request", "slot", "req", "pos", "group?", "partner", "c2", "slot", "parked",
                                "in"]
    assert lines[4].split()[:6] == ["3", "1", "1", "5", "yes", "ring"]  # row 3 reads ring row 2
    assert lines[-1] == "ring writes (after every read): row 2 -> ring row 0, row 1 -> ring row 1, " \
                        "row 4 -> ring row 2, row 5 -> ring row 3"
    assert str(fixed) == fixed.table()


def test_the_batch_shortcuts_ask_the_plan(fixed):
    batch = fixed.batch
    assert batch.group_rows == fixed.group_rows
    assert batch.stored_slots == fixed.stored_slots
    assert batch.ring_partner_rows == sorted(fixed.ring_reads)
    assert batch.parked_ring_rows(3) == batch.plan(3).parked == {0: 0, 1: 1, 2: 2, 5: 3, 3: 4, 4: 5}


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch is a list"):
        plan_rows([(0, 0, 4)], 2)
    batch = c2.ExtendBatch.build([(0, 0, 4)], c2.ReqToTokenPool(CFG, 1, 8, seed=0), device="cpu")
    for bad in (1, 2.0, True):
        with pytest.raises(ValueError, match=f"ring_size = {bad!r}; expected an int >= 2"):
            batch.plan(bad)


def test_every_row_padding():
    """An idle rank: zero live rows, every row is padding."""
    batch = c2.ExtendBatch.build([], c2.ReqToTokenPool(CFG, 1, 8, seed=0), pad_to=4, device="cpu")
    plan = batch.plan(CFG.ring_size)
    assert [r.partner for r in plan.rows] == [Partner.PADDING] * 4
    assert plan.group_rows == [] and plan.parked == {} and plan.stored_slots == [] and plan.ring_reads == {}


@settings(max_examples=40, deadline=None)
@given(ragged_requests(), st.integers(0, 5), st.integers(2, 4))
def test_matches_the_torch_path_masks(requests, padding, ring_size):
    """Same parked rows, ring reads and previous-row partners as the masks the torch path computes
    on the device, for rings of 2 to 4 rows per request."""
    _, alloc, _ = make_case()
    live = sum(n for _, _, n in requests)
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=live + padding, device="cpu")
    plan = plan_rows(batch, ring_size)
    parked_rows = [r.row for r in plan.rows if r.parked_in is not None]
    assert parked_rows == torch.nonzero(park_mask(batch, ring_size)).flatten().tolist()
    sentinel = 10_000
    reads = ring_read_rows(batch, ring_size, sentinel).tolist()
    assert {row: k for row, k in enumerate(reads) if k != sentinel} == plan.ring_reads
    prev = previous_row_is_partner(batch).tolist()
    odd_prev = [r.row for r in plan.rows if r.partner is Partner.PREVIOUS_ROW]
    assert odd_prev == [row for row, p in enumerate(prev) if p and batch.pos[row] % 2 == 1]
    assert [r.row for r in plan.rows if r.partner is Partner.PADDING] == list(range(live, live + padding))
    assert [r.row for r in plan.rows if r.c2_slot is not None] == (batch.c2_slot != 0).nonzero().flatten().tolist()


def _changed_rows(t: torch.Tensor) -> set[int]:
    return set(torch.nonzero((t.float().cpu() != POISON).any(dim=1)).flatten().tolist())


@settings(max_examples=25, deadline=None)
@given(ragged_requests(), st.integers(0, 4), st.integers(0, 2**16))
def test_matches_what_compress_torch_writes(requests, padding, seed):
    """Poison the pools, run compress_torch: the changed c2 slots (slot 0 aside) are the stored
    slots, the changed ring rows the parked ones, and the latents written are the group rows."""
    layer, alloc, pools = make_case(seed=seed % 7)
    live = sum(n for _, _, n in requests)
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=live + padding, device=pools.device)
    plan = batch.plan(CFG.ring_size)
    latent = c2.compress_torch(layer, *c2.project(layer, layer.random_hidden(batch.num_rows, seed)), batch, pools)
    assert _changed_rows(pools.kv_cache) - {0} == set(plan.stored_slots)
    assert _changed_rows(pools.index_k) - {0} == set(plan.stored_slots)
    sentinel = pools.ring.shape[0] - 1
    assert _changed_rows(pools.ring) - {sentinel} == set(plan.parked)
    written = set(torch.nonzero(~latent.isnan().any(dim=1)).flatten().tolist())
    assert written == set(plan.group_rows)


@settings(max_examples=15, deadline=None)
@given(ragged_requests(max_prefix=11), st.integers(0, 2**16))
def test_ring_rows_read_are_the_ones_named(requests, seed):
    """Change one ring row: exactly the row the plan says reads it changes its latent.
    Change every other ring row: no latent changes."""
    layer, alloc, pools = make_case(seed=seed % 5)
    batch = c2.ExtendBatch.build(requests, alloc, device=pools.device)
    plan = batch.plan(CFG.ring_size)
    x = layer.random_hidden(batch.num_rows, seed)
    g = torch.Generator().manual_seed(seed)
    pools.ring[:-1] = torch.randn(pools.ring.shape[0] - 1, pools.ring.shape[1], generator=g)
    base = c2.compress(layer, x, batch, pools.clone(), path="torch")

    def latents_after_changing(ring_rows):
        changed = pools.clone()
        changed.ring[list(ring_rows)] += 1.0
        out = c2.compress(layer, x, batch, changed, path="torch")
        return set(torch.nonzero((out.view(torch.int16) != base.view(torch.int16)).any(dim=1)).flatten().tolist())

    for row, k in plan.ring_reads.items():
        assert latents_after_changing([k]) == {row}
    unread = set(range(pools.ring.shape[0] - 1)) - set(plan.ring_reads.values())
    assert latents_after_changing(unread) == set()


def test_program_plan_takes_the_kernels_blocks_for_the_layers_width():
    """A dsv41 layer in a bucket past 4096 rows runs blocks of 16 pairs; the tiny preset's are 8."""
    from c2graph.compressor.fused import grid_blocks, kernel_blocks

    wide = c2.Config.dsv41()
    batch = c2.ExtendBatch.build([(0, 1, 4200), (1, 0, 9)], c2.ReqToTokenPool(wide, 2, 4608), pad_to=4224,
                                 device="cpu")
    assert kernel_blocks(wide.D, 4224).groups_per_block == 16 != kernel_blocks(CFG.D, 4224).groups_per_block
    plan = c2.program_plan(batch, wide.ring_size, D=wide.D)
    assert len(plan) == grid_blocks(4224, 2, 16) and len(plan[0]["lanes"]) == 16
    assert [r for p in plan for r in p["groups"]] == batch.group_rows
    assert c2.program_plan(batch, wide.ring_size, groups_per_block=16) == plan
    with pytest.raises(ValueError, match="program_plan needs D"):
        c2.program_plan(batch, wide.ring_size)


def test_a_padding_row_is_a_row_with_raw_out_loc_0_wherever_it_lies():
    """One meaning of "padding row" (docs/design.md, the glossary): ``raw_out_loc == 0``. The rows past
    the live rows are padding rows in no request; the dummy batch's are padding rows inside its one
    request; a real batch has no padding row inside a request."""
    from c2graph.prefill.static_batch import StaticBatch

    alloc = c2.ReqToTokenPool(CFG, 3, 16, seed=1)
    batch = c2.ExtendBatch.build([(0, 1, 4), (2, 0, 3)], alloc, pad_to=10, device="cpu")
    plan = batch.plan(CFG.ring_size)
    raw = batch.raw_out_loc.tolist()
    assert [r.is_padding for r in plan.rows] == [v == 0 for v in raw] == [False] * 7 + [True] * 3
    assert batch.live_rows == 7 and all(r.request_slot is None for r in plan.rows[batch.live_rows:])
    dummy = StaticBatch(8, 2, device="cpu").batch
    rows = dummy.plan(CFG.ring_size).rows
    assert all(r.is_padding and r.request_slot == 0 for r in rows) and dummy.live_rows == 8
    assert dummy.group_rows == [] and dummy.stored_slots == [] and dummy.parked_ring_rows(CFG.ring_size) == {}
