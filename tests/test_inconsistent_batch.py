"""Inconsistent batches, aliased outputs and a batch changed in place: refused before the first
write, on both paths, with every cache and the ring compared bit for bit before and after; and,
where a path is told not to check (``validate=False``, what a capture runs), no write outside the
caches and the ring whatever the batch holds.

Also the row plan as the one truth of what a row does (padding rows, the dummy batch, zero-length
requests, against what both paths write), a static batch that carries what it loaded, and a batch
built without reading a tensor back."""

from __future__ import annotations

import c2graph as c2  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, ragged_requests
from test_bad_input import assert_refused, make_case

from c2graph.compressor.arguments import FLOAT32_TINY
from c2graph.compressor.fused import compress_fused_op

CFG = c2.Config.tiny()
DEV = c2.DEFAULT_DEVICE
PATHS = [pytest.param(False, id="torch"), pytest.param(True, id="fused")]
REQUESTS = [(0, 1, 5), (2, 0, 4)]


def run_path(fused: bool, layer, batch, pools, *, validate=True, latent_out=None, projected=None):
    """One path on ``batch``: the fused path for a fused-gate layer, else the torch path."""
    if projected is None:
        x = layer.random_hidden(batch.live_rows, seed=11)
        projected = c2.project_padded(layer, x, batch, fused=True)
    if fused:
        return c2.compress_fused(layer, projected, batch, pools, latent_out=latent_out, validate=validate)
    return c2.compress_torch(layer, *c2.split_projected(projected), batch, pools, latent_out=latent_out,
                             validate=validate)


def case(fused: bool, requests=REQUESTS, **kw):
    layer, alloc, pools = make_case(fused)
    return layer, alloc, pools, c2.ExtendBatch.build(requests, alloc, device=DEV, **kw)


# ---------------------------------------------------------------------------------------------
# Well-formed tensors that contradict each other.


@pytest.mark.parametrize("fused", PATHS)
def test_offsets_that_contradict_the_rows_are_refused(fused):
    """Disjoint, ordered, inside the rows, and wrong: the fused path would store at the wrong slots."""
    layer, alloc, pools, batch = case(fused)
    wrong = c2.build_extend_offsets([4, 5], 2, device=DEV)  # well formed: 4 + 5 rows, where 5 + 4 are
    assert_refused(lambda: run_path(fused, layer, dataclasses.replace(batch, extend_offsets=wrong), pools),
                   r"batch.extend_offsets\[:, 0\] = \(0, 4\), but batch.requests says request \(0, 1, 5\) at row 0, "
                   "5 rows; expected offsets that match the rows", pools, alloc)
    short = c2.build_extend_offsets([5, 3], 2, device=DEV)  # request 1 a row short: its last row in no slot
    assert_refused(lambda: run_path(fused, layer, dataclasses.replace(batch, extend_offsets=short), pools),
                   r"batch.extend_offsets\[:, 1\] = \(5, 3\), but batch.requests says request \(2, 0, 4\)",
                   pools, alloc)


@pytest.mark.parametrize("fused", PATHS)
def test_c2_slot_and_raw_out_loc_that_disagree_are_refused(fused):
    """The torch path stores at ``c2_slot``, the fused kernel at ``raw_out_loc // 2``: one answer."""
    layer, alloc, pools, batch = case(fused)
    row = batch.group_rows[1]
    c2_slot = batch.c2_slot.clone()
    c2_slot[row] += 1  # inside the pools: only the other tensor says it is wrong
    want = batch.raw_out_loc[row].item() // 2
    assert_refused(lambda: run_path(fused, layer, dataclasses.replace(batch, c2_slot=c2_slot), pools),
                   rf"batch.c2_slot\[{row}\] = {want + 1}, but raw_out_loc\[{row}\] = \d+ at pos \d+; expected {want}",
                   pools, alloc)
    even = next(r for r in range(batch.num_rows) if r not in batch.group_rows)
    c2_slot = batch.c2_slot.clone()
    c2_slot[even] = 3  # an even row storing: the torch path would write slot 3
    assert_refused(lambda: run_path(fused, layer, dataclasses.replace(batch, c2_slot=c2_slot), pools),
                   rf"batch.c2_slot\[{even}\] = 3, .* expected 0", pools, alloc)


@pytest.mark.parametrize("fused", PATHS)
def test_two_groups_on_one_c2_slot_are_refused(fused):
    layer, alloc, pools, batch = case(fused)
    a, b = batch.group_rows[:2]
    raw, c2_slot = batch.raw_out_loc.clone(), batch.c2_slot.clone()
    raw[b], c2_slot[b] = raw[a], c2_slot[a]
    assert_refused(lambda: run_path(fused, layer, dataclasses.replace(batch, raw_out_loc=raw, c2_slot=c2_slot),
                                    pools), rf"rows {a} and {b} both store at c2 slot {c2_slot[a].item()}", pools, alloc)


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("validate", [True, False])
def test_outputs_sharing_memory_with_a_cache_or_the_ring_are_refused(fused, validate):
    layer, alloc, pools, batch = case(fused)
    T, D = batch.num_rows, CFG.D
    assert_refused(lambda: run_path(fused, layer, batch, pools, validate=validate, latent_out=pools.kv_cache[:T]),
                   "latent_out shares memory with pools.kv_cache", pools, alloc)
    assert_refused(lambda: run_path(fused, layer, batch, pools, validate=validate, projected=pools.ring[:T]),
                   r"pools.ring shares memory with (projected|kv)", pools, alloc)
    other = c2.Pools(CFG, pools.pool_requests, pools.kv_slots, device=DEV).poison()
    other.index_k = other.kv_cache[:, : CFG.index_dim].contiguous()  # a dense copy: fine
    other.index_k = other.kv_cache.view(-1)[: other.kv_slots * CFG.index_dim].view(other.kv_slots, CFG.index_dim)
    assert_refused(lambda: run_path(fused, layer, batch, other, validate=validate),
                   "pools.kv_cache shares memory with pools.index_k", other)
    assert D == other.kv_cache.shape[1]


# ---------------------------------------------------------------------------------------------
# A batch changed in place after it was built: its extents, counted when it was made, are stale.

IN_PLACE = {  # what a student changes, in place, and the words of the refusal
    "pos[0] = -1": (lambda b, p: b.pos.__setitem__(0, -1), "batch.pos holds position -1; expected values >= 0"),
    "c2_slot[2] = -1": (lambda b, p: b.c2_slot.__setitem__(2, -1), "batch.c2_slot holds c2 slot -1; expected"),
    "req[:] = 99": (lambda b, p: b.req.__setitem__(slice(None), 99), r"batch.req holds pool index 99, past the pools"),
    "req[:] = 1": (lambda b, p: b.req.__setitem__(slice(None), 1), r"row 0 holds req 1, pos 1; request slot 0"),
    "c2_slot = kv_slots + 5": (lambda b, p: b.c2_slot.copy_(torch.where(b.c2_slot != 0, p.kv_slots + 5, 0)),
                               r"batch.c2_slot holds c2 slot \d+, past the pools; expected < pools.kv_slots"),
    "raw_out_loc[1] = 0": (lambda b, p: b.raw_out_loc.__setitem__(1, 0),
                           r"request slot 0 \(0, 1, 5\) has rows with raw_out_loc == 0 \(padding\) beside"),
    "offsets[1, 1] = 2": (lambda b, p: b.extend_offsets.__setitem__((1, 1), 2), r"batch.extend_offsets\[:, 1\] = \(5, 2\)"),
}


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("edit", list(IN_PLACE))
def test_a_batch_changed_in_place_is_checked_again(fused, edit):
    """``validate=True`` reads the batch as it is now, not the extents counted when it was made."""
    layer, alloc, pools, batch = case(fused)
    change, match = IN_PLACE[edit]
    change(batch, pools)
    assert_refused(lambda: run_path(fused, layer, batch, pools), match, pools, alloc)
    x = layer.random_hidden(batch.live_rows, seed=3)
    assert_refused(lambda: c2.compress(layer, x, batch, pools), match, pools, alloc)


def guarded(pools: c2.Pools, rows: int = 3) -> dict[str, torch.Tensor]:
    """Rebind the pools' tensors to the middle of larger poisoned ones: ``rows`` guard rows before and
    after each, returned by name (a write outside a tensor lands in them)."""
    guards = {}
    for name, t in pools.tensors().items():
        big = torch.full((t.shape[0] + 2 * rows, t.shape[1]), POISON, dtype=t.dtype, device=t.device)
        big[rows:-rows] = t
        setattr(pools, name, big[rows:-rows])
        guards[name] = big
    return guards


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("edit", [e for e in IN_PLACE if not e.startswith("offsets")])
def test_unchecked_no_write_lands_outside_the_caches_and_the_ring(fused, edit):
    """``validate=False`` (what a capture runs) reads no value, so it cannot refuse a batch changed in
    place: whatever it holds, both paths write only inside the caches and the ring, and a negative
    slot never reaches the last one through Python's negative indexing."""
    layer, alloc, pools, batch = case(fused)
    stored = set(batch.stored_slots)
    guards = guarded(pools)
    before = {name: big.clone() for name, big in guards.items()}
    IN_PLACE[edit][0](batch, pools)
    run_path(fused, layer, batch, pools, validate=False)
    for name, big in guards.items():
        inner = slice(3, big.shape[0] - 3)
        assert torch.equal(big[:3], before[name][:3]) and torch.equal(big[inner.stop:], before[name][inner.stop:]), name
    last = pools.kv_slots - 1
    assert last not in stored, "a precondition: the batch stores nothing at the last slot"
    assert (pools.kv_cache[last].float() == POISON).all() and (pools.index_k[last].float() == POISON).all()


# ---------------------------------------------------------------------------------------------
# The torch path checks its pools before its first write.


def _float32_cache(pools):
    pools.kv_cache = pools.kv_cache.float()


def _smaller_ring(pools):
    pools.ring = pools.ring[:5].clone()


def _index_k_a_slot_short(pools):
    pools.index_k = pools.index_k[:-1].clone()


POOL_CHANGES = {
    "kv_cache rebound to float32": (_float32_cache, "pools.kv_cache has dtype torch.float32; expected torch.bfloat16"),
    "a smaller ring": (_smaller_ring, r"pools.ring has shape \(5, 64\); expected \[13, 64\]"),
    "index_k a slot short": (_index_k_a_slot_short, r"pools.index_k has shape \(\d+, 16\); expected"),
}


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("change", list(POOL_CHANGES))
def test_pools_changed_after_they_were_made_are_refused_before_any_write(fused, change):
    layer, alloc, pools, batch = case(fused)
    edit, match = POOL_CHANGES[change]
    edit(pools)
    assert_refused(lambda: run_path(fused, layer, batch, pools), match, pools, alloc)
    assert_refused(lambda: run_path(fused, layer, batch, pools, validate=False), match, pools, alloc)


# ---------------------------------------------------------------------------------------------
# The raw op: eps, and offsets that start before row 0.


def _raw_args(layer, pools, batch, projected, latent):
    return (projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets, layer.norm_w,
            layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent)


@pytest.mark.parametrize("eps", [float("nan"), -1e-6, 0.0, 1e-300, float("inf")])
def test_the_raw_op_refuses_an_eps_that_gives_nan(eps):
    layer, alloc, pools, batch = case(True)
    projected = c2.project_padded(layer, layer.random_hidden(batch.live_rows, 1), batch)
    latent = torch.full((batch.num_rows, CFG.D), POISON, dtype=torch.bfloat16, device=DEV)
    args = _raw_args(layer, pools, batch, projected, latent)
    assert_refused(lambda: compress_fused_op(*args, eps, CFG.ring_size, batch.num_rows), rf"eps = {eps!r}; expected",
                   pools, alloc)
    assert (latent.float() == POISON).all()


def test_the_raw_op_never_reads_before_the_buffer():
    """Offsets starting before row 0 (the op reads no value: it cannot refuse them) leave the row
    before ``projected`` unread: the results do not depend on what it holds."""
    layer = c2.SourceLayer(CFG, seed=1, device=DEV)
    T = 6
    results = []
    for fill in (1.0, 1e4):
        big = torch.randn(T + 1, 2 * CFG.D, generator=torch.Generator().manual_seed(0)).to(DEV)
        big[0] = fill
        pools = c2.Pools(CFG, 4, 64, device=DEV).poison()
        latent = torch.full((T, CFG.D), POISON, dtype=torch.bfloat16, device=DEV)
        for start in (-3, -2, -1):
            offsets = torch.tensor([[start], [T + 1]], dtype=torch.int32, device=DEV)
            pos, req = torch.arange(1, T + 1, device=DEV), torch.zeros(T, dtype=torch.int64, device=DEV)
            raw = torch.arange(10, 10 + T, device=DEV)
            compress_fused_op(big[1:], pools.ring, pos, req, raw, offsets, layer.norm_w, layer.wk, layer.k_norm_w,
                            layer.inv_freq, pools.kv_cache, pools.index_k, latent, CFG.eps, 2, T)
        results.append([t.clone() for t in (*pools.tensors().values(), latent)])
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("fused", PATHS)
def test_the_smallest_eps_and_rope_base_allowed_give_no_nan(fused):
    """At the limits the Config states (eps = float32's smallest normal, RoPE's base 1), on a batch
    with an all-zero row, every stored value is a number."""
    cfg = c2.Config.tiny(eps=FLOAT32_TINY, rope_theta=1.0)
    layer = c2.SourceLayer(cfg, seed=2, use_fused_gate=fused, device=DEV)
    alloc = c2.ReqToTokenPool(cfg, 4, 64, seed=2)
    pools = c2.Pools(cfg, 4, alloc.kv_slots, device=DEV).poison()
    batch = c2.ExtendBatch.build([(0, 0, 6), (1, 3, 5)], alloc, device=DEV)
    projected = c2.project_padded(layer, layer.random_hidden(batch.live_rows, 2), batch, fused=True)
    projected[2:4] = 0  # a group of zeros: its RMSNorm divides by sqrt(eps) alone
    latent = run_path(fused, layer, batch, pools, projected=projected)
    slots = batch.stored_slots
    assert not latent[batch.group_rows].isnan().any()
    assert not pools.kv_cache[slots].isnan().any() and not pools.index_k[slots].isnan().any()


# ---------------------------------------------------------------------------------------------
# Entry points given something else than a batch, pools or a layer.


@pytest.mark.parametrize("fused", PATHS)
def test_arguments_of_another_type_are_refused_in_our_words(fused):
    layer, alloc, pools, batch = case(fused)
    x = layer.random_hidden(batch.live_rows, seed=1)
    projected = c2.project_padded(layer, x, batch, fused=True)
    calls = {
        "layer is a NoneType; expected a c2graph.SourceLayer": lambda: c2.compress(None, x, batch, pools),
        "batch is a list; expected a c2graph.ExtendBatch": lambda: c2.compress(layer, x, [batch], pools),
        "pools is a dict; expected a c2graph.Pools": lambda: c2.compress(layer, x, batch, pools.tensors()),
        "cfg is a NoneType; expected a c2graph.Config": lambda: c2.minimum_bytes(None, batch),
        "batch is a NoneType; expected a c2graph.ExtendBatch": lambda: c2.minimum_bytes(CFG, None),
        r"batch.extend_offsets has shape \(4,\); expected \[2, request_slots\]":
            lambda: run_path(fused, layer, dataclasses.replace(batch, extend_offsets=batch.extend_offsets.flatten()),
                             pools),
        r"out has shape \(9, 63\); expected \[>= 9, 2D = 64\]":
            lambda: c2.project_fused(layer, x, out=torch.zeros(9, 63, device=DEV)),
        r"out has shape \(8, 64\); expected \[>= 9, 2D = 64\]":
            lambda: c2.project_fused(layer, x, out=torch.zeros(8, 64, device=DEV)),
        "out has dtype torch.float64; expected torch.float32":
            lambda: c2.project_fused(layer, x, out=torch.zeros(9, 64, dtype=torch.float64, device=DEV)),
        r"projected has shape \(9, 63\); expected \[T, 2D\], an even number":
            lambda: c2.split_projected(projected[:, :63]),
        r"counts add up to 2147483648 rows; expected fewer than 2\*\*31": lambda: c2.build_extend_offsets([2**31], 1),
        r"ring_size = 1099511627776; expected an int >= 2 and < 1025": lambda: batch.plan(2**40),
    }
    for match, call in calls.items():
        assert_refused(call, match, pools, alloc)


def test_sizes_past_what_can_be_held_are_refused_in_our_words():
    alloc = c2.ReqToTokenPool(CFG, 4, 64)
    for call, match in (
        (lambda: c2.ExtendBatch.build([(0, 0, 4)], alloc, pad_to=2**40), r"pad_to = 1099511627776; expected an int "
                                                                           r">= the 4 live rows and < 2\*\*31"),
        (lambda: c2.Pools(CFG, 2**40, 64), "pool_requests = 1099511627776 needs more memory than this device can"),
        (lambda: c2.Config.tiny(ring_size=2**40), "Config.ring_size = 1099511627776; expected an int >= 2 and < 1025"),
        (lambda: c2.StaticBatch(2**40, 2), r"bucket = 1099511627776; expected an int >= 1 and < 2\*\*31"),
    ):
        assert_refused(call, match, alloc)


# ---------------------------------------------------------------------------------------------
# The row plan: the one truth of what a row does, against what both paths write.


def written_by(fused: bool, layer, batch, pools):
    """What one path writes on ``batch``: (c2 slots changed, ring rows changed, latent rows written)."""
    before = pools.clone()
    latent = run_path(fused, layer, batch, pools, latent_out=torch.full(
        (batch.num_rows, CFG.D), POISON, dtype=torch.bfloat16, device=DEV))
    slots = {s for s in range(pools.kv_slots)
             if not torch.equal(pools.kv_cache[s], before.kv_cache[s]) or not torch.equal(pools.index_k[s],
                                                                                          before.index_k[s])}
    ring = {r for r in range(pools.ring.shape[0]) if not torch.equal(pools.ring[r], before.ring[r])}
    rows = [r for r in range(batch.num_rows) if not (latent[r].float() == POISON).all()]
    return slots, ring, rows


BATCHES = {
    "the dummy batch": None,
    "zero-length requests": [(0, 1, 0), (1, 0, 3), (2, 5, 0), (3, 3, 2)],
    "a ragged padded batch": [(0, 1, 5), (2, 0, 4), (4, 7, 1)],
}


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("which", list(BATCHES))
def test_the_plan_is_what_both_paths_write(fused, which):
    layer, alloc, pools = make_case(fused)
    if BATCHES[which] is None:
        static = c2.StaticBatch(8, 2, device=DEV)
        batch = static.batch
        assert batch.group_rows == [] and batch.stored_slots == [] and batch.parked_ring_rows(2) == {}
        assert all(r.is_padding and r.request_slot == 0 for r in batch.plan(2).rows)
    else:
        batch = c2.ExtendBatch.build(BATCHES[which], alloc, request_slots=5, pad_to=12, device=DEV)
    plan = batch.plan(CFG.ring_size)
    slots, ring, rows = written_by(fused, layer, batch, pools)
    # the torch path sends the stores of rows that store nothing to c2 slot 0 (its dump slot)
    assert slots - {0} == set(plan.stored_slots) and len(plan.stored_slots) == len(set(plan.stored_slots))
    assert fused or 0 not in slots or any(not r.completes_group for r in plan.rows)
    assert rows == plan.group_rows
    assert ring == set(plan.parked)


# ---------------------------------------------------------------------------------------------
# The static batch carries what it loaded.


def test_the_static_batch_carries_the_loaded_batchs_requests_and_extents():
    """After loading a batch whose c2 slots reach past small pools, the static batch is refused
    against them, as the batch itself is (the dummy's extents would let every check pass)."""
    layer, alloc, _ = make_case(True)
    static = c2.StaticBatch(16, 2, device=DEV)
    batch = c2.ExtendBatch.build([(0, 1, 5), (5, 30, 9)], alloc, pad_to=16, device=DEV)
    assert batch.extents["c2_slot"][1] >= 8
    static.load(batch)
    assert static.batch.requests == batch.requests and static.batch.extents == batch.extents
    assert static.batch.group_rows == batch.group_rows and static.batch.stored_slots == batch.stored_slots
    small = c2.Pools(CFG, 6, 8, device=DEV).poison()
    projected = torch.zeros(16, 2 * CFG.D, device=DEV)
    for validate in (True, False):
        assert_refused(lambda: c2.compress_fused(layer, projected, static.batch, small, validate=validate),
                       r"batch.c2_slot holds c2 slot \d+, past the pools; expected < pools.kv_slots \(8\)", small)
    static.load_dummy()
    assert static.batch.requests == (c2.Request(0, 0, 16),) and static.batch.extents["c2_slot"] == (0, 0)


def test_a_view_of_other_rows_covers_every_row_the_tensors_hold():
    _, alloc, _ = make_case(True)
    static = c2.StaticBatch(16, 2, device=DEV, buckets=[8])
    big = c2.ExtendBatch.build([(5, 30, 16)], alloc, request_slots=2, device=DEV)
    static.load(big)
    static.load(c2.ExtendBatch.build([(0, 0, 8)], alloc, request_slots=2, device=DEV))
    assert static.view(8).requests == (c2.Request(0, 0, 8),)
    # the last 8 rows still hold the big batch's: the view of all 16 rows covers them
    assert static.view(16).extents["c2_slot"][1] >= big.extents["c2_slot"][1]


# ---------------------------------------------------------------------------------------------
# A batch built without reading a tensor back.


def test_a_built_batch_counted_its_extents_without_reading_a_tensor(monkeypatch):
    """``build`` counts the extents from the requests and the pages (the allocator's host-side
    table), and reads none of the tensors it makes: on a GPU, no sync."""
    from sync_count import counting_host_reads

    _, alloc, _ = make_case(True)
    with counting_host_reads(monkeypatch) as reads:
        batch = c2.ExtendBatch.build([(0, 1, 5), (2, 0, 4), (3, 4, 0)], alloc, request_slots=4, pad_to=12,
                                     device=DEV)
    assert reads == []
    from c2graph.compressor.batch import ROW_TENSORS, count_extents

    assert batch.extents == count_extents([getattr(batch, n) for n in ROW_TENSORS])


@settings(max_examples=60, deadline=None)
@given(requests=ragged_requests(pool_requests=6, max_requests=4, max_prefix=40, max_len=9),
       lengths=st.lists(st.integers(0, 3), min_size=4, max_size=4), padding=st.integers(0, 3))
def test_the_extents_counted_from_the_requests_are_the_tensors(requests, lengths, padding):
    """Odd and even starts, one-row requests, zero-length ones, padding or none: what ``build``
    counted without reading a tensor is what the tensors hold."""
    from c2graph.compressor.batch import ROW_TENSORS, count_extents

    requests = [(p, prefix, n) for (p, prefix, _), n in zip(requests, lengths)]
    alloc = c2.ReqToTokenPool(CFG, 6, 64, seed=5)
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=sum(r[2] for r in requests) + padding, device=DEV)
    assert batch.extents == count_extents([getattr(batch, n) for n in ROW_TENSORS])


@pytest.mark.parametrize("fused", PATHS)
def test_a_batch_is_read_once_and_again_after_any_change(fused, monkeypatch):
    """``check`` reads a batch's rows once; it reads them again after an in-place write to any of its
    tensors, or against pools of other sizes, and refuses what is wrong then, before the first write."""
    layer, alloc, pools, batch = case(fused)
    reads = []
    real = c2.ExtendBatch._check_rows
    monkeypatch.setattr(c2.ExtendBatch, "_check_rows", lambda self, p: (reads.append(p), real(self, p)))
    for _ in range(3):
        run_path(fused, layer, batch, pools)
    assert len(reads) == 1
    _, _, other = make_case(fused, max_seq_len=128)  # pools of other sizes: the rows are checked against them
    run_path(fused, layer, batch, other)
    assert len(reads) == 2
    batch.pos[1] += 2  # row 1 of request (0, 1, 5): a position the request does not hold
    assert_refused(lambda: run_path(fused, layer, batch, pools), r"row 1 holds req 0, pos 4; request slot 0", pools, alloc)
    assert len(reads) == 3
