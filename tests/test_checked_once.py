"""The fused path checks one set of arguments once, and sees every change the checks would see.

``compress_fused`` and the op keep a record of the argument sets that passed their checks
(:class:`c2graph.compressor.arguments.Passed`), keyed by everything the checks read. A call whose
arguments changed in anything a check reads (a tensor rebound, resized, strided, flagged for
grad; a field of the pools or the layer) is checked again and refused where a first call would
be; a call with the same facts launches without them. Without a mode, compiler or profiler
watching, ``compress_fused`` launches the kernel itself, and writes the same bits as the op.
"""

from __future__ import annotations

import pytest
import torch
from support import make_case

import c2graph as c2
from c2graph.compressor import fused
from c2graph.compressor.arguments import Passed, fingerprint
from c2graph.measure.opcount import count_ops

DEVICE = "cuda" if c2.HAS_CUDA else "cpu"


def setup(seed: int = 0):
    layer, alloc, pools = make_case(seed=seed, device=DEVICE)
    batch = c2.ExtendBatch.build([(0, 0, 5), (2, 3, 4)], alloc, request_slots=3, pad_to=12, device=DEVICE)
    projected = c2.project_fused(layer, layer.random_hidden(batch.num_rows, seed=seed + 1))
    latent = torch.full((batch.num_rows, layer.cfg.D), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    return layer, pools, batch, projected, latent


@pytest.fixture(autouse=True)
def empty_records():
    fused._PATHS.clear()
    fused._PLANS.clear()
    yield


def test_a_second_call_with_the_same_arguments_skips_the_checks(monkeypatch):
    layer, pools, batch, projected, latent = setup()
    fused.compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    calls = []
    monkeypatch.setattr(fused, "check_layer_batch_pools", lambda *a: calls.append("checked"))
    fused.compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    assert calls == []


@pytest.mark.parametrize("change", ["rebound cache", "resized latent", "strided projected", "projected needs grad",
                                   "pools' sizes", "layer without the fused gate", "latent over a weight"])
def test_a_change_the_checks_read_is_checked_again_and_refused(change):
    layer, pools, batch, projected, latent = setup()
    fused.compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    ring_before = pools.ring.clone()
    if change == "rebound cache":
        pools.kv_cache = pools.kv_cache.float()
        expected = "kv_cache has dtype"
    elif change == "resized latent":
        latent.resize_(latent.shape[0] - 1, latent.shape[1])
        expected = "latent_out has shape"
    elif change == "strided projected":
        projected = projected.t().contiguous().t()
        expected = "projected is not contiguous"
    elif change == "projected needs grad":
        projected.requires_grad_(True)
        expected = "projected requires grad"
    elif change == "pools' sizes":
        pools.kv_slots -= 1
        expected = "kv_cache has shape"
    elif change == "layer without the fused gate":
        layer = c2.SourceLayer(layer.cfg, seed=0, use_fused_gate=False, device=DEVICE)
        expected = "use_fused_gate is False"
    else:
        latent = layer.wk.view(-1)[: latent.numel()].view(latent.shape)
        expected = "shares memory"
    with pytest.raises(ValueError, match=expected):
        fused.compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    assert torch.equal(pools.ring, ring_before), "a refused call wrote nothing"


def test_the_op_rechecks_a_tensor_changed_in_place():
    layer, pools, batch, projected, latent = setup()
    args = (projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets, layer.norm_w,
            layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent)
    sizes = (layer.cfg.eps, layer.cfg.ring_size, batch.num_rows)
    fused.compress_fused_op(*args, *sizes)
    latent.resize_(latent.shape[0] + 1, latent.shape[1])
    with pytest.raises(ValueError, match="latent_out has shape"):
        fused.compress_fused_op(*args, *sizes)


def test_the_direct_launch_writes_what_the_op_writes():
    """Once with nothing watching (the kernel launched by the path), once under ``count_ops`` (a
    dispatch mode: through the op, which it counts): the same bits in every output."""
    out = []
    for watched in (False, True):
        layer, pools, batch, projected, latent = setup(seed=3)
        if watched:
            with count_ops() as ops:
                fused.compress_fused(layer, projected, batch, pools, latent_out=latent)
            assert dict(ops.counts) == {"c2graph.compress_fused.default": 1}
        else:
            assert fused._nothing_watches()
            fused.compress_fused(layer, projected, batch, pools, latent_out=latent)
        out.append([t.clone() for t in (pools.kv_cache, pools.index_k, pools.ring, latent)])
    for a, b in zip(*out):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_the_op_bumps_the_version_of_what_it_writes():
    layer, pools, batch, projected, latent = setup()
    before = [t._version for t in (pools.ring, pools.kv_cache, pools.index_k, latent, projected, batch.pos)]
    fused.compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    after = [t._version for t in (pools.ring, pools.kv_cache, pools.index_k, latent, projected, batch.pos)]
    assert [a > b for a, b in zip(after, before)] == [True, True, True, True, False, False]


def test_fingerprint_and_record():
    t = torch.zeros(3, 4)
    assert fingerprint((t, None)) == fingerprint((t, None))
    assert fingerprint((t,)) != fingerprint((t.t(),)), "strides are read"
    assert fingerprint((t, "not a tensor")) is None
    record = Passed(size=2)
    for k in range(3):
        record.add(k, str(k))
    assert (record.get(0), record.get(1), record.get(2), record.get(None)) == (None, "1", "2", None)
