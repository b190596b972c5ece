"""The torch path: against a float64 reference, chunk invariance, poison, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case, ragged_requests, untouched_slots_keep_poison, written_slots_hold_no_poison

import c2graph as c2
from c2graph.measure.compare import compare, compare_pools

# ---------------------------------------------------------------------------------------------
# A float64 reference, written differently from the library: a plain loop over groups.


def reference_request(layer: c2.SourceLayer, x: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{group position: (latent after RoPE [D], index key [I])}`` in float64 for one whole sequence."""
    cfg = layer.cfg
    d = lambda t: t.double().cpu()  # noqa: E731
    kv, score = d(x) @ d(layer.wkv).T, d(x) @ d(layer.wgate).T

    def norm(v, w):
        return v / torch.sqrt((v * v).mean() + cfg.eps) * d(w)

    def turn(v, p):
        v = v.clone()
        b = v.shape[0] - cfg.rope_dim
        for i in range(cfg.rope_dim // 2):
            a = p * cfg.rope_theta ** (-2 * i / cfg.rope_dim)
            e, o = v[b + 2 * i].item(), v[b + 2 * i + 1].item()
            v[b + 2 * i] = e * math.cos(a) - o * math.sin(a)
            v[b + 2 * i + 1] = e * math.sin(a) + o * math.cos(a)
        return v

    out = {}
    for g in range(x.shape[0] // 2):
        a, b = 2 * g, 2 * g + 1
        w_a = 1.0 / (1.0 + torch.exp(score[b] - score[a]))
        pooled = kv[a] * w_a + kv[b] * (1.0 - w_a)
        latent = norm(pooled, layer.norm_w)
        key = norm(latent @ d(layer.wk).T, layer.k_norm_w)
        out[a] = (turn(latent, a), turn(key, a))
    return out


def run_chunks(compress, layer, alloc, pools, chunks, hidden):
    """Run a list of batches; each batch is a list of ``(pool_index, start, length)`` chunks.

    ``hidden[pool_index]`` holds the request's whole hidden states ``[L, hidden]`` bf16.
    """
    for batch_chunks in chunks:
        batch = c2.ExtendBatch.build(batch_chunks, alloc, device=pools.device)
        x = torch.cat([hidden[p][s : s + n] for p, s, n in batch_chunks])
        compress(layer, x, batch, pools)


def torch_compress(layer, x, batch, pools):
    return c2.compress(layer, x, batch, pools, path="torch")


# ---------------------------------------------------------------------------------------------


def test_matches_float64_reference():
    """Several requests, prefilled in two chunks each, against the loop-over-groups reference.

    Tolerance: the path rounds to bf16 several times (pooled, latent, key, after RoPE), so each
    value is within a few bf16 units (2**-8 relative) of the float64 result; we allow
    ``|got - want| <= 2**-6 * (|want| + 1)`` (about 6e-3 was seen).
    """
    layer, alloc, pools = make_case(seed=3)
    lengths = {0: 23, 3: 16, 5: 9}
    hidden = {p: layer.random_hidden(n, seed=10 + p) for p, n in lengths.items()}
    cut = {0: 7, 3: 10, 5: 4}
    run_chunks(torch_compress, layer, alloc, pools, [[(p, 0, cut[p]) for p in lengths],
                                                      [(p, cut[p], n - cut[p]) for p, n in lengths.items()]], hidden)
    worst = 0.0
    for p, n in lengths.items():
        raw = alloc.locations(p, 0, n)
        for gpos, (lat, key) in reference_request(layer, hidden[p]).items():
            slot = int(raw[gpos + 1]) // 2
            for got, want in ((pools.kv_cache[slot], lat), (pools.index_k[slot], key)):
                err = ((got.double().cpu() - want).abs() / (want.abs() + 1)).max().item()
                worst = max(worst, err)
    assert worst <= 2**-6, worst


@settings(max_examples=40, deadline=None)
@given(reqs=ragged_requests(max_len=12), data=st.data())
def test_chunked_and_row_by_row_equal_whole(reqs, data):
    """Any split of each request into chunks, and one row at a time, give the caches and ring of one whole batch."""
    seed = data.draw(st.integers(0, 2**16))
    layer, alloc, pools_whole = make_case(seed=seed)
    pools_chunked, pools_rows = pools_whole.clone(), pools_whole.clone()
    hidden = {p: layer.random_hidden(pre + n, seed=seed + p) for p, pre, n in reqs}
    # the prefix of every request is prefilled first, identically for all three runs
    prefix = [[(p, 0, pre) for p, pre, _ in reqs if pre]]
    whole = [[(p, pre, n) for p, pre, n in reqs]]
    cuts = {p: sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=3)) if n > 1 else []) for p, _, n in reqs}
    pieces = {}
    for p, pre, n in reqs:
        edges = [0, *cuts[p], n]
        pieces[p] = [(p, pre + a, b - a) for a, b in zip(edges, edges[1:])]
    chunked = [[pieces[p][k] for p, _, _ in reqs if k < len(pieces[p])] for k in range(max(map(len, pieces.values())))]
    rows = [[(p, pre + i, 1) for p, pre, n in reqs if i < n] for i in range(max(n for _, _, n in reqs))]
    for pools, schedule in ((pools_whole, whole), (pools_chunked, chunked), (pools_rows, rows)):
        run_chunks(torch_compress, layer, alloc, pools, prefix + schedule if prefix[0] else schedule, hidden)
    for other in (pools_chunked, pools_rows):
        for result in compare_pools(other, pools_whole):
            assert result, result


@settings(max_examples=30, deadline=None)
@given(reqs=ragged_requests(), pad=st.integers(0, 7), data=st.data())
def test_writes_exactly_the_group_slots_and_parked_rows(reqs, pad, data):
    """Poisoned pools: every slot the batch should write is written, every other one keeps the poison."""
    seed = data.draw(st.integers(0, 2**16))
    layer, alloc, pools = make_case(seed=seed)
    batch = c2.ExtendBatch.build(reqs, alloc, request_slots=len(reqs) + 1, pad_to=sum(n for *_, n in reqs) + pad, device=pools.device)
    x = layer.random_hidden(batch.num_rows, seed=seed)  # padding rows get junk, not zeros
    latent = torch.full((batch.num_rows, layer.cfg.D), POISON, dtype=torch.bfloat16, device=pools.device)
    c2.compress_torch(layer, *c2.project(layer, x), batch, pools, latent_out=latent)

    written = set(batch.stored_slots)
    assert not written_slots_hold_no_poison(pools, written)
    assert not untouched_slots_keep_poison(pools, written, skip_slot0=True)
    parked = batch.parked_ring_rows(layer.cfg.ring_size)
    ring = pools.ring[:-1]
    for row in range(ring.shape[0]):
        kept = bool((ring[row] == POISON).all())
        assert kept == (row not in parked), (row, parked)
    assert torch.equal(pools.ring[-1], c2.new_ring(1, 1, layer.cfg.D, pools.device)[-1]), "sentinel not restored"
    groups = set(batch.group_rows)
    for row in range(batch.num_rows):
        assert bool((latent[row] == POISON).all()) == (row not in groups), row


def test_padding_rows_write_nothing():
    """A batch padded to a bucket writes bitwise what the unpadded batch writes (slot 0 aside)."""
    layer, alloc, pools = make_case(seed=5)
    reqs = [(1, 3, 6), (4, 0, 5)]
    x = layer.random_hidden(11, seed=1)
    plain = pools.clone()
    c2.compress(layer, x, c2.ExtendBatch.build(reqs, alloc), plain, path="torch")
    padded = c2.ExtendBatch.build(reqs, alloc, request_slots=4, pad_to=32)
    # padding rows hold junk, not zeros: they must write nothing all the same
    kv, score = c2.project(layer, torch.cat([x, layer.random_hidden(21, seed=2)]))
    c2.compress_torch(layer, kv, score, padded, pools)
    for result in compare_pools(pools, plain):
        assert result, result


def test_idle_rank_with_only_padding_rows_writes_nothing():
    layer, alloc, pools = make_case(seed=6)
    before = pools.clone()
    batch = c2.ExtendBatch.build([], alloc, request_slots=3, pad_to=16)
    assert batch.extend_offsets.tolist() == [[0, 0, 0], [0, 0, 0]]
    c2.compress_torch(layer, *c2.project(layer, layer.random_hidden(16, seed=3)), batch, pools)
    for result in compare_pools(pools, before):
        assert result, result


def test_a_request_starting_even_never_reads_its_stale_ring_rows():
    """A recycled pool slot's ring rows hold garbage (NaN here); a request starting at pos 0 ignores them."""
    layer, alloc, pools = make_case(seed=7)
    pools.ring[2 * 2 : 2 * 2 + 2] = float("nan")  # pool request 2's rows
    batch = c2.ExtendBatch.build([(2, 0, 7)], alloc)
    latent = c2.compress(layer, layer.random_hidden(7, seed=4), batch, pools, path="torch")
    assert not latent[batch.group_rows].isnan().any()
    assert not pools.kv_cache[batch.stored_slots].isnan().any()


def test_an_odd_first_row_pairs_with_its_ring_row():
    """Split a request at an odd position: the second chunk's first row must read the parked partner."""
    layer, alloc, pools = make_case(seed=8)
    x = layer.random_hidden(8, seed=5)
    whole = pools.clone()
    c2.compress(layer, x, c2.ExtendBatch.build([(0, 0, 8)], alloc), whole, path="torch")
    c2.compress(layer, x[:3], c2.ExtendBatch.build([(0, 0, 3)], alloc), pools, path="torch")
    second = c2.ExtendBatch.build([(0, 3, 5)], alloc)
    assert second.ring_partner_rows == [0]
    c2.compress(layer, x[3:], second, pools, path="torch")
    for result in compare_pools(pools, whole):
        assert result, result


def test_projected_inputs_give_the_same_result():
    """``compress`` from ``x``, and ``compress_torch`` on separate or on one ``| kv | score |`` buffer, are one computation."""
    layer, alloc, pools = make_case(seed=9)
    batch = c2.ExtendBatch.build([(0, 1, 6), (3, 4, 5)], alloc)
    x = layer.random_hidden(batch.num_rows, seed=6)
    results = []
    calls = (
        lambda p: c2.compress(layer, x, batch, p, path="torch"),
        lambda p: c2.compress_torch(layer, *c2.project(layer, x), batch, p),
        lambda p: c2.compress_torch(layer, *c2.split_projected(c2.project_fused(layer, x)), batch, p),
    )
    for call in calls:
        p = pools.clone()
        results.append((p, call(p)))
    for p, lat in results[1:]:
        assert compare(lat, results[0][1], "latent")
        for result in compare_pools(p, results[0][0]):
            assert result, result


# ---------------------------------------------------------------------------------------------
# Bad input: a clear ValueError naming the argument, and nothing written.


def _unchanged(pools, before):
    return all(torch.equal(a, b) for a, b in zip(pools.tensors().values(), before.tensors().values()))


@pytest.mark.parametrize(
    "requests, kwargs, match",
    [
        ([(0, 0, -1)], {}, "extend_len = -1"),
        ([(0, -2, 3)], {}, "prefix_len = -2"),
        ([(9, 0, 3)], {}, "pool_index = 9"),
        ([(0, 90, 10)], {}, "past the allocator"),
        ([(0, 0, 3), (1, 0, 3), (2, 0, 3)], {"request_slots": 2}, "request_slots = 2"),
        ([(0, 0, 3), (0, 3, 3)], {}, "appears twice"),
        ([(0, 0, 30)], {"pad_to": 16}, "pad_to = 16"),
        ([(0, 0.5, 3)], {}, "expected an int"),
    ],
)
def test_bad_batches_raise_before_anything_is_allocated(requests, kwargs, match):
    layer, alloc, pools = make_case()
    table = alloc.page_table.clone()
    with pytest.raises(ValueError, match=match):
        c2.ExtendBatch.build(requests, alloc, **kwargs)
    assert torch.equal(alloc.page_table, table)


def test_bad_tensors_raise_and_leave_the_pools_unchanged():
    layer, alloc, pools = make_case(seed=11)
    batch = c2.ExtendBatch.build([(0, 1, 5), (2, 0, 4)], alloc)
    x = layer.random_hidden(batch.num_rows, seed=7)
    before = pools.clone()
    ones = lambda *shape, dtype=torch.float32: torch.ones(*shape, dtype=dtype, device=pools.device)  # noqa: E731
    bad_calls = {
        "dtype torch.float32": lambda: c2.compress(layer, x.float(), batch, pools, path="torch"),
        r"x has shape \(9, 32\)": lambda: c2.compress(layer, x[:, :32], batch, pools, path="torch"),
        "x has 8 rows": lambda: c2.compress(layer, x[:8], batch, pools, path="torch"),
        "x is on meta": lambda: c2.compress(layer, x.to("meta"), batch, pools, path="torch"),
        r"kv has shape \(9, 16\)": lambda: c2.compress_torch(layer, *c2.split_projected(ones(9, 32)), batch, pools),
        "score has dtype": lambda: c2.compress_torch(
            layer, ones(9, 32), ones(9, 32, dtype=torch.float64), batch, pools),
        "latent_out has dtype": lambda: c2.compress(layer, x, batch, pools, latent_out=ones(9, 32), path="torch"),
        "pools.pool_requests": lambda: c2.compress(
            layer, x, batch, c2.Pools(layer.cfg, 1, alloc.kv_slots, pools.device)
        , path="torch"),
        "pools.kv_slots": lambda: c2.compress(layer, x, batch, c2.Pools(layer.cfg, 6, 8, pools.device), path="torch"),
        "another Config": lambda: c2.compress(
            layer, x, batch, c2.Pools(c2.Config.tiny(eps=1e-5), 6, alloc.kv_slots, pools.device)
        , path="torch"),
    }
    for match, call in bad_calls.items():
        with pytest.raises(ValueError, match=match):
            call()
        assert _unchanged(pools, before), match


def test_extend_offsets_follow_spec():
    """Slots past the batch: count 0 and start = live rows; padding rows lie in no request."""
    _, alloc, _ = make_case()
    batch = c2.ExtendBatch.build([(0, 3, 4), (1, 0, 0), (2, 5, 2)], alloc, request_slots=5, pad_to=16)
    assert batch.extend_offsets.dtype == torch.int32
    assert batch.extend_offsets.tolist() == [[0, 4, 4, 6, 6], [4, 0, 2, 0, 0]]
    assert batch.raw_out_loc[6:].eq(0).all() and batch.pos[6:].eq(0).all()
    c2.check_extend_offsets(batch.extend_offsets, batch.num_rows)


def test_devices_match_by_type_and_index():
    """``cuda`` matches ``cuda:0``; ``cuda:1`` does not match ``cuda:0`` (no GPU needed to check)."""
    from c2graph.compressor.arguments import same_device

    d = torch.device
    assert same_device(d("cuda"), d("cuda:0")) and same_device(d("cpu"), d("cpu"))
    assert not same_device(d("cuda:1"), d("cuda:0")) and not same_device(d("cpu"), d("cuda:0"))
