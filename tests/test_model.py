"""The many-layer model preset: the served layer pattern, fused and torch layers, one Pools each."""

from __future__ import annotations

import pytest
import torch

import c2graph as c2
from c2graph.compressor.model import SERVED_C2_LAYERS, is_fused, layer_pools, model_preset, served_layers


def test_every_nth_layer_lacks_the_fused_gate():
    layers = served_layers(c2.Config.tiny(), 6, unfused_every=3, seed=5)
    assert [c2.layer_path(layer) for layer in layers] == ["fused", "fused", "torch"] * 2
    assert all(layer.use_fused_gate for layer in served_layers(c2.Config.tiny(), 3, unfused_every=None))
    assert [is_fused(i, 2) for i in range(4)] == [True, False, True, False]


def test_layers_have_their_own_seeded_weights():
    a = served_layers(c2.Config.tiny(), 2, seed=5)
    b = served_layers(c2.Config.tiny(), 2, seed=5)
    assert torch.equal(a[0].wkv, b[0].wkv) and torch.equal(a[1].wk, b[1].wk)
    assert not torch.equal(a[0].wkv, a[1].wkv)
    assert torch.equal(a[1].wkv, c2.SourceLayer(c2.Config.tiny(), seed=6).wkv)


def test_presets():
    tiny = model_preset("tiny")
    assert len(tiny) == 4 and [layer.use_fused_gate for layer in tiny] == [True, False, True, False]
    assert tiny[0].cfg == c2.Config.tiny()
    assert SERVED_C2_LAYERS == 18
    with pytest.raises(ValueError, match="name = 'big'; expected one of"):
        model_preset("big")


def test_one_pools_per_layer():
    layers = model_preset("tiny")
    pools = layer_pools(layers, pool_requests=3, kv_slots=40)
    assert len(pools) == 4 and len({id(p.kv_cache) for p in pools}) == 4
    assert all(p.kv_slots == 40 and p.pool_requests == 3 for p in pools)


@pytest.mark.parametrize("kw, match", [(dict(n_layers=0), "n_layers = 0"), (dict(unfused_every=0), "unfused_every = 0"),
                                       (dict(unfused_every=True), "unfused_every = True")])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        served_layers(c2.Config.tiny(), **{"n_layers": 2, **kw})
    with pytest.raises(ValueError, match="cfg is a str"):
        served_layers("tiny")
