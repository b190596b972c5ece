"""The fused kernel never writes outside its tensors, whatever the batch's tensors hold.

A batch changed by hand (``dataclasses.replace``) can hold c2 slots past the caches, pool requests
past the ring, or extend offsets past the buffer, while its host-side fields (``kv_slots_needed``)
still describe the batch it was built as. The launch itself (the custom op, which reads no
values) must then still keep every store inside the caches, the ring and the latents: here each
tampered launch is compared, tensor by tensor, with the torch path on the batch as built.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support import POISON, make_case

import c2graph as c2
from c2graph.compressor.fused import compress_fused_op

TOL = 2**-6
DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu)] if c2.HAS_CUDA else ["cpu"]
# Request 0 starts at an odd position (its first row reads the ring), request 2 at an even one.
REQUESTS = [(0, 3, 7), (1, 0, 6), (2, 4, 5)]


def launch(layer, projected, batch, pools, latent):
    """The op itself, as a graph replays it: no host-side check of any value."""
    cfg = layer.cfg
    compress_fused_op(projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
                    layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent,
                    cfg.eps, cfg.ring_size, batch.num_rows)


def setting(device, seed):
    """A layer, a batch whose first request reads real ring rows, poisoned caches, a random buffer,
    and the torch path's results on the batch as built: ``(layer, batch, pools, projected, want)``."""
    layer, alloc, pools = make_case(seed=seed, device=device)
    earlier = c2.ExtendBatch.build([(0, 0, 3)], alloc, device=device)
    c2.compress_torch(layer, *c2.split_projected(c2.project_fused(layer, layer.random_hidden(3, seed))), earlier, pools)
    pools.kv_cache.fill_(POISON)
    pools.index_k.fill_(POISON)
    batch = c2.ExtendBatch.build(REQUESTS, alloc, request_slots=4, pad_to=21, device=device)
    projected = c2.project_fused(layer, layer.random_hidden(batch.num_rows, seed + 1))
    want_pools = pools.clone()
    want = c2.compress_torch(layer, *c2.split_projected(projected), batch, want_pools,
                             latent_out=torch.full((batch.num_rows, layer.cfg.D), POISON, dtype=torch.bfloat16,
                                                   device=device))
    return layer, batch, pools, projected, (want, want_pools)


def run_tampered(layer, batch, pools, projected):
    got_pools = pools.clone()
    latent = torch.full((batch.num_rows, layer.cfg.D), POISON, dtype=torch.bfloat16, device=batch.device)
    launch(layer, projected, batch, got_pools, latent)
    return latent, got_pools


def close(a, b):
    return bool(((a.float() - b.float()).abs() <= TOL + TOL * b.float().abs()).all())


def poison(t):
    return bool((t.float() == POISON).all())


@pytest.mark.parametrize("device", DEVICES)
def test_slots_past_the_caches_store_nothing(device):
    """Group rows whose ``raw_out_loc`` points past the caches (or below them) store nothing; the
    other groups store what the torch path stores, and the ring is parked as usual."""
    layer, batch, pools, projected, (want, want_pools) = setting(device, seed=1)
    groups = batch.group_rows
    bad_rows = [groups[1], groups[4], groups[-1]]
    raw = batch.raw_out_loc.clone()
    raw[bad_rows[0]] = 2 * pools.kv_slots + 1  # the first slot past the caches
    raw[bad_rows[1]] = 2 * pools.kv_slots + 10**6
    raw[bad_rows[2]] = -7
    c2_slot = torch.where((batch.pos % 2 == 1) & (raw != 0), raw // 2, 0)
    bad = dataclasses.replace(batch, raw_out_loc=raw, c2_slot=c2_slot)  # kv_slots_needed left as it was
    latent, got = run_tampered(layer, bad, pools, projected)

    good = [r for r in groups if r not in bad_rows]
    good_slots = batch.c2_slot[good]
    assert close(latent[good], want[good])
    assert poison(latent[bad_rows])
    for name in ("kv_cache", "index_k"):
        assert close(getattr(got, name)[good_slots], getattr(want_pools, name)[good_slots]), name
        others = torch.ones(pools.kv_slots, dtype=torch.bool, device=device)
        others[good_slots] = False
        assert poison(getattr(got, name)[others]), f"{name}: a slot no good group owns was written"
    assert torch.equal(got.ring, want_pools.ring)


@pytest.mark.parametrize("device", DEVICES)
def test_requests_past_the_ring_read_and_park_nothing_there(device):
    """A request whose ``req`` lies past the ring: its first row (odd start, partner in the ring)
    stores nothing, its other groups store as usual, and none of its rows is parked."""
    layer, batch, pools, projected, (want, want_pools) = setting(device, seed=2)
    rows0 = range(0, REQUESTS[0][2])  # request 0: rows 0..6, the first reads the ring
    req = batch.req.clone()
    req[list(rows0)] = pools.ring.shape[0]  # past every ring row
    bad = dataclasses.replace(batch, req=req)
    latent, got = run_tampered(layer, bad, pools, projected)

    groups = batch.group_rows
    assert groups[0] == 0 and 0 in batch.ring_partner_rows
    assert poison(latent[0]) and poison(got.kv_cache[batch.c2_slot[0]])
    assert close(latent[groups[1:]], want[groups[1:]])
    slots = batch.c2_slot[groups[1:]]
    assert close(got.kv_cache[slots], want_pools.kv_cache[slots])
    parked = batch.parked_ring_rows(layer.cfg.ring_size)
    mine = [ring for ring, row in parked.items() if row in rows0]
    assert mine and torch.equal(got.ring[mine], pools.ring[mine])  # request 0's ring rows untouched
    others = [r for r in range(pools.ring.shape[0]) if r not in mine]
    assert torch.equal(got.ring[others], want_pools.ring[others])


@pytest.mark.parametrize("device", DEVICES)
def test_offsets_past_the_buffer_read_and_write_inside_it(device):
    """Extend offsets (unchecked, as in a replay) whose last request runs past the buffer: the rows
    inside it are computed as usual, and that request's last rows, past the buffer, are not parked."""
    layer, batch, pools, projected, (want, want_pools) = setting(device, seed=3)
    offsets = batch.extend_offsets.clone()
    offsets[1, 2] = batch.num_rows  # request 2 (rows 13..17) claims rows 13..33 of a 21-row buffer
    bad = dataclasses.replace(batch, extend_offsets=offsets)
    latent, got = run_tampered(layer, bad, pools, projected)

    groups = batch.group_rows
    assert close(latent[groups], want[groups])
    slots = batch.c2_slot[groups]
    for name in ("kv_cache", "index_k"):
        assert close(getattr(got, name)[slots], getattr(want_pools, name)[slots]), name
        others = torch.ones(pools.kv_slots, dtype=torch.bool, device=device)
        others[slots] = False
        assert poison(getattr(got, name)[others]), name
    parked = batch.parked_ring_rows(layer.cfg.ring_size)
    last = [ring for ring, row in parked.items() if row >= 13]
    assert last and torch.equal(got.ring[last], pools.ring[last])
    others = [r for r in range(pools.ring.shape[0]) if r not in last]
    assert torch.equal(got.ring[others], want_pools.ring[others])
