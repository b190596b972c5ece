"""The explorer's plain function: against ExtendBatch's own write plan and against what
compress_torch actually reads and writes (poisoned pools), on fixed and random ragged batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case, ragged_requests

import c2graph as c2
from c2graph.pictures.explorer import EVEN_ROW, PADDING, PREVIOUS_ROW, explain, explain_batch, explorer_widget
from c2graph.compressor.torch_path import park_mask, previous_row_is_partner, ring_read_rows

CFG = c2.Config.tiny()


def test_fixed_case_in_words():
    """Request 1 starts at odd pos 5: its first row reads ring row 1 * 2 + 4 % 2 = 2."""
    ex = explain_batch([(0, 0, 3), (1, 5, 3)], CFG, pad_to=8)
    assert [r.partner for r in ex.rows] == [
        EVEN_ROW, PREVIOUS_ROW, EVEN_ROW, "ring row 2", EVEN_ROW, PREVIOUS_ROW, PADDING, PADDING
    ]
    assert [r.pos for r in ex.rows] == [0, 1, 2, 5, 6, 7, None, None]
    assert [r.request_slot for r in ex.rows] == [0, 0, 0, 1, 1, 1, None, None]
    assert ex.group_rows == [1, 3, 5]
    assert ex.ring_reads == {3: 2}
    # last two rows of each request: pos 1, 2 of req 0 -> ring rows 1, 0; pos 6, 7 of req 1 -> 2, 3
    assert ex.parked == {1: 1, 0: 2, 2: 4, 3: 5}
    raw = ex.batch.raw_out_loc.tolist()
    assert ex.stored_slots == [raw[1] // 2, raw[3] // 2, raw[5] // 2]
    assert all(r.c2_slot is None and r.parked_in is None for r in ex.rows if r.is_padding)


def test_same_arguments_same_slots():
    """Without an allocator a fresh seeded one is used, so the explanation is reproducible."""
    a = explain_batch([(2, 3, 5), (0, 0, 4)], CFG)
    b = explain_batch([(2, 3, 5), (0, 0, 4)], CFG)
    assert a.rows == b.rows
    assert a.pool_requests == 3


def test_table_has_one_line_per_row():
    ex = explain_batch([(0, 1, 4)], CFG, pad_to=6)
    lines = ex.table().splitlines()
    assert len(lines) == 1 + ex.batch.num_rows + 1
    assert lines[0].split() == ["row", "slot", "req", "pos", "group?", "partner", "c2", "slot", "parked", "in"]
    assert "ring row 0" in lines[1]  # row 0 is pos 1: its partner pos 0 is in ring row 0
    assert lines[-1].startswith("ring writes (after every read): ")
    assert str(ex) == ex.table()


@settings(max_examples=40, deadline=None)
@given(ragged_requests(), st.integers(0, 5), st.integers(2, 4))
def test_matches_the_batch_write_plan(requests, padding, ring_size):
    """Same group rows, ring readers, c2 slots and parked rows as ExtendBatch and the torch path's masks."""
    _, alloc, _ = make_case()
    live = sum(n for _, _, n in requests)
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=live + padding, device="cpu")
    ex = explain(batch, ring_size)
    assert ex.group_rows == batch.group_rows()
    assert sorted(ex.ring_reads) == batch.ring_partner_rows()
    assert ex.stored_slots == batch.stored_slots()
    assert ex.parked == batch.parked_ring_rows(ring_size)
    parked_rows = [r.row for r in ex.rows if r.parked_in is not None]
    assert parked_rows == torch.nonzero(park_mask(batch, ring_size)).flatten().tolist()
    sentinel = 10_000
    reads = ring_read_rows(batch, ring_size, sentinel).tolist()
    assert {row: k for row, k in enumerate(reads) if k != sentinel} == ex.ring_reads
    prev = previous_row_is_partner(batch).tolist()
    odd_prev = [r.row for r in ex.rows if r.partner == PREVIOUS_ROW]
    assert odd_prev == [row for row, p in enumerate(prev) if p and batch.pos[row] % 2 == 1]
    assert [r.row for r in ex.rows if r.partner == PADDING] == list(range(live, live + padding))


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
    ex = explain(batch, CFG.ring_size, pools.pool_requests)
    latent = c2.compress_torch(layer, *c2.project(layer, layer.random_hidden(batch.num_rows, seed)), batch, pools)
    assert _changed_rows(pools.kv_cache) - {0} == set(ex.stored_slots)
    assert _changed_rows(pools.index_k) - {0} == set(ex.stored_slots)
    sentinel = pools.ring.shape[0] - 1
    assert _changed_rows(pools.ring) - {sentinel} == set(ex.parked)
    written = set(torch.nonzero(~latent.isnan().any(dim=1)).flatten().tolist())
    assert written == set(ex.group_rows)


@settings(max_examples=15, deadline=None)
@given(ragged_requests(max_prefix=11), st.integers(0, 2**16))
def test_ring_rows_read_are_the_ones_named(requests, seed):
    """Change one ring row: exactly the row the explanation says reads it changes its latent.
    Change every other ring row: no latent changes."""
    layer, alloc, pools = make_case(seed=seed % 5)
    batch = c2.ExtendBatch.build(requests, alloc, device=pools.device)
    ex = explain(batch, CFG.ring_size, pools.pool_requests)
    x = layer.random_hidden(batch.num_rows, seed)
    g = torch.Generator().manual_seed(seed)
    pools.ring[:-1] = torch.randn(pools.ring.shape[0] - 1, pools.ring.shape[1], generator=g)
    base = c2.compress(layer, x, batch, pools.clone(), path="torch")

    def latents_after_changing(ring_rows):
        changed = pools.clone()
        changed.ring[list(ring_rows)] += 1.0
        out = c2.compress(layer, x, batch, changed, path="torch")
        return set(torch.nonzero((out.view(torch.int16) != base.view(torch.int16)).any(dim=1)).flatten().tolist())

    for row, k in ex.ring_reads.items():
        assert latents_after_changing([k]) == {row}
    unread = set(range(pools.ring.shape[0] - 1)) - set(ex.ring_reads.values())
    assert latents_after_changing(unread) == set()


def test_every_row_padding():
    """An idle rank: zero live rows, every row is padding."""
    ex = explain_batch([], CFG, pad_to=4)
    assert [r.partner for r in ex.rows] == [PADDING] * 4
    assert ex.group_rows == [] and ex.parked == {} and ex.stored_slots == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(requests=[(0, 0, 4)], cfg=CFG, ring_size=1), "ring_size = 1"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, ring_size=2.0), "ring_size = 2.0"),
        (dict(requests="abc", cfg=CFG), "requests is a str"),
        (dict(requests=[(0, 4)], cfg=CFG), r"requests\[0\] = \(0, 4\)"),
        (dict(requests=[(0, 0, 2), (1, -1, 3)], cfg=CFG), r"requests\[1\].prefix_len = -1"),
        (dict(requests=[(0, 0, True)], cfg=CFG), r"requests\[0\].extend_len = True"),
        (dict(requests=[(0, 0, 4)], cfg="tiny"), "cfg is a str"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, allocator=object()), "allocator is a object"),
        (dict(requests=[(0, 0, 4), (0, 4, 2)], cfg=CFG), "pool_index = 0 appears twice"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, pad_to=3), "pad_to = 3"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        explain_batch(**kwargs)


def test_explain_rejects_a_non_batch_and_a_small_pool():
    with pytest.raises(ValueError, match="batch is a list"):
        explain([(0, 0, 4)], 2)
    batch = explain_batch([(2, 0, 4)], CFG).batch
    with pytest.raises(ValueError, match="pool_requests = 2; expected an int >= 3"):
        explain(batch, 2, pool_requests=2)


def test_widget_builds_without_a_browser(capsys):
    ui = explorer_widget()
    assert len(ui.children) == 5  # three rows of sliders, the bucket, the output
    sliders = [s for box in ui.children[:3] for s in box.children]
    assert [s.description for s in sliders][:2] == ["req 0 prefix", "req 0 extend"]
