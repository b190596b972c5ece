"""The engine's piece (:mod:`c2graph.prefill.fused_graph`) against the teaching runner, and what
the runner does on a step: its checks once each, an interrupted step, many request slots, the
engine-style projection.

The engine's piece and the runner launch the same kernel over the same metadata, so over random
chunked streams they must write the same caches, ring and latents, bitwise, in graph and eager
mode alike: on the CPU (the graph emulation, ``c2graph.Graph`` as the graph) and, marked ``gpu``,
on CUDA (``torch.cuda.graph``).
"""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from support import POISON

import c2graph as c2
from c2graph.compressor.fused import SMALL_BUCKET_GROUPS_PER_BLOCK, grid_blocks
from c2graph.compressor.model import layer_pools, served_layers
from c2graph.compressor.source_layer import project_fused
from c2graph.measure.compare import compare_pools
from c2graph.prefill import fused_graph
from c2graph.prefill.fused_graph import FusedLayer, FusedPrefillGraph, StaticRows, compress_layers

CFG = c2.Config.tiny()
BUCKETS = (8, 16, 32)
SLOTS = 4
DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu)] if c2.HAS_CUDA else ["cpu"]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN included (bf16 and fp32 compared as their integers)."""
    as_int = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
    return a.shape == b.shape and torch.equal(a.view(as_int[a.dtype]), b.view(as_int[b.dtype]))


def assert_pools_bitwise(got: c2.Pools, want: c2.Pools, where: str) -> None:
    for name in ("kv_cache", "index_k", "ring"):
        assert same_bits(getattr(got, name), getattr(want, name)), f"{where}: {name} differs"


def fused_layers(layers, pools, rows: int, projected, latent) -> list[FusedLayer]:
    """Each layer's :class:`FusedLayer`: its first ``rows`` rows of ``projected[i]`` and ``latent[i]``."""
    return [FusedLayer(projected[i][:rows], latent[i][:rows], layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq,
                       p.kv_cache, p.index_k, p.ring, CFG.eps, CFG.ring_size)
            for i, (layer, p) in enumerate(zip(layers, pools))]


class EnginePiece:
    """The engine's piece over its own buffers: static rows of the largest bucket, each layer's
    projection and latents, one graph per bucket (the largest first, one memory pool)."""

    def __init__(self, layers, pools, device):
        D = CFG.D
        self.layers, self.pools = layers, pools
        self.rows = StaticRows.zeros(max(BUCKETS), SLOTS, device)
        self.projected = [torch.zeros(max(BUCKETS), 2 * D, device=device) for _ in layers]
        self.latent = [torch.zeros(max(BUCKETS), D, dtype=torch.bfloat16, device=device) for _ in layers]
        self.graphs, pool = {}, None
        for bucket in sorted(BUCKETS, reverse=True):
            graph = None if device == "cuda" else c2.Graph(pool=pool)
            self.graphs[bucket] = FusedPrefillGraph(self.rows.head(bucket), self.fused_layers(bucket), graph=graph,
                                                    pool=pool)
            pool = self.graphs[bucket].graph.pool()

    def fused_layers(self, rows: int, projected=None, latent=None) -> list[FusedLayer]:
        return fused_layers(self.layers, self.pools, rows, projected or self.projected, latent or self.latent)

    def replay(self, batch: c2.ExtendBatch, xs) -> list[torch.Tensor]:
        live, bucket = batch.live_rows, batch.num_rows
        for i, (layer, x) in enumerate(zip(self.layers, xs)):
            project_fused(layer, x, out=self.projected[i])
            self.projected[i][live:bucket].zero_()
            self.latent[i][:bucket].fill_(float("nan"))
        self.graphs[bucket].replay(batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets)
        return [latent[:bucket] for latent in self.latent]

    def eager(self, batch: c2.ExtendBatch, xs) -> list[torch.Tensor]:
        rows = StaticRows(batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets)
        projected = [c2.project_padded(layer, x, batch) for layer, x in zip(self.layers, xs)]  # padded by pad_to
        latent = [torch.full((batch.num_rows, CFG.D), float("nan"), dtype=torch.bfloat16, device=x.device)
                  for x in xs]
        compress_layers(rows, self.fused_layers(batch.num_rows, projected, latent))
        return latent


def stream(seed: int, steps: int):
    """A random chunked stream: each step continues some of four requests (odd and even starts),
    by 1 to 9 rows, sometimes padded for data parallelism (an idle rank included). It starts with
    a padded step run eagerly (1 row padded to 2: bucket 8 would more than double it), then one
    replayed (3 requests of 5 rows: bucket 16)."""
    g = torch.Generator().manual_seed(seed)
    done = [int(torch.randint(0, 4, (1,), generator=g)) for _ in range(4)]
    for k in range(steps):
        who = torch.randperm(4, generator=g)[: int(torch.randint(0, 4, (1,), generator=g))].tolist()
        reqs = [(p, done[p], int(torch.randint(1, 10, (1,), generator=g))) for p in who]
        live = sum(n for *_, n in reqs)
        pad_to = None if reqs and torch.rand(1, generator=g) < 0.5 else live + int(torch.randint(0, 8, (1,), generator=g))
        if pad_to == 0:
            pad_to = 8  # an idle rank replays the smallest bucket
        if k < 2:
            reqs, pad_to = ([(0, done[0], 1)], 2) if k == 0 else ([(p, done[p], 5) for p in (1, 2, 3)], None)
        yield reqs, pad_to
        for p, pre, n in reqs:
            done[p] = pre + n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_piece_equals_the_runner_bitwise_over_random_chunked_streams(device, seed):
    """Graph and eager steps alike (the runner runs eagerly when padding would more than double
    the rows): every cache, the ring and every latent row the same bits, from poisoned pools."""
    layers = served_layers(CFG, 2, unfused_every=None, seed=seed, device=device)
    alloc = c2.ReqToTokenPool(CFG, 4, 96, seed=seed)
    mine = [p.poison(POISON) for p in layer_pools(layers, 4, alloc.kv_slots, device=device)]
    theirs = [p.clone() for p in mine]
    runner = c2.PrefillGraphRunner(layers, mine, buckets=list(BUCKETS), request_slots=SLOTS)
    engine = EnginePiece(layers, theirs, device)
    modes = set()
    for k, (reqs, pad_to) in enumerate(stream(seed, steps=6)):
        live = sum(n for *_, n in reqs)
        xs = [layer.random_hidden(live, seed=100 * seed + 10 * k + i) for i, layer in enumerate(layers)]
        step = runner.run(reqs, alloc, xs, pad_to=pad_to)
        latents = engine.replay(step.batch, xs) if step.mode == "graph" else engine.eager(step.batch, xs)
        modes.add(step.mode)
        for i in range(len(layers)):
            assert_pools_bitwise(mine[i], theirs[i], f"step {k} ({step.mode}), layer {i}")
            assert same_bits(step.latents[i], latents[i]), f"step {k} ({step.mode}), layer {i}: latents differ"
    assert modes == {"graph", "eager"}


def test_the_engine_piece_is_one_page_and_imports_only_torch_and_the_kernels_launch():
    source = inspect.getsource(fused_graph)
    assert len(source.splitlines()) <= 150
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    assert imported == {"__future__", "collections.abc", "contextlib", "dataclasses", "typing", "torch",
                        "..compressor.fused"}


def test_the_engine_piece_refuses_metadata_of_another_shape_before_writing():
    rows = StaticRows.zeros(16, SLOTS, "cpu")
    rows.load_dummy()
    before = [t.clone() for t in rows.tensors()]
    with pytest.raises(ValueError, match=r"extend_offsets has shape \(2, 5\); expected \(2, 4\)"):
        rows.refresh(torch.arange(16), torch.zeros(16, dtype=torch.int64), torch.zeros(16, dtype=torch.int64),
                     torch.zeros(2, 5, dtype=torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(before, rows.tensors()))
    assert rows.low_ratio_extend_offsets.tolist() == [[0, 16, 16, 16], [16, 0, 0, 0]]  # the dummy batch


def test_a_grid_holds_no_block_for_request_slots_past_the_rows():
    """4096 request slots in a bucket of 16 rows: the grid of 16 rows and 16 one-row requests."""
    assert grid_blocks(16, 4096, SMALL_BUCKET_GROUPS_PER_BLOCK) == grid_blocks(16, 16, SMALL_BUCKET_GROUPS_PER_BLOCK) == 3
    assert grid_blocks(2048, 16, 8) == (2048 + 16) // 16 + 1  # fewer slots than rows: as before


def test_a_runner_with_4096_request_slots_builds_and_equals_eager():
    layer = c2.SourceLayer(CFG, seed=3)
    alloc = c2.ReqToTokenPool(CFG, 4, 64, seed=3)
    pools = c2.Pools(CFG, 4, alloc.kv_slots).poison(POISON)
    ref = pools.clone()
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16], request_slots=4096)
    reqs = [(0, 0, 5), (1, 1, 6), (2, 0, 3)]
    x = layer.random_hidden(14, seed=3)
    assert runner.run(reqs, alloc, x).mode == "graph"
    c2.compress(layer, x, c2.ExtendBatch.build(reqs, alloc), ref)
    assert all(compare_pools(pools, ref))


# -- the runner's step: one check of each thing, an interrupted step, the projection -----------


def _mixed_runner(seed: int = 4):
    layers = served_layers(CFG, 3, unfused_every=3, seed=seed)  # fused, fused, torch
    alloc = c2.ReqToTokenPool(CFG, 4, 96, seed=seed)
    pools = [p.poison(POISON) for p in layer_pools(layers, 4, alloc.kv_slots)]
    return layers, alloc, pools, c2.PrefillGraphRunner(layers, pools, buckets=[16, 32], request_slots=SLOTS)


def test_a_step_checks_the_hidden_states_and_the_pools_once(monkeypatch):
    """One check of each hidden state, and one check of the batch against pools that share a size."""
    from c2graph.compressor import batch as batch_module
    from c2graph.prefill import runner as runner_module

    layers, alloc, pools, runner = _mixed_runner()
    counts = {"hidden": 0, "fits": 0}

    def counting(name, real):
        def count(*args, **kw):
            counts[name] += 1
            return real(*args, **kw)
        return count

    monkeypatch.setattr(runner_module, "check_hidden", counting("hidden", runner_module.check_hidden))
    monkeypatch.setattr(batch_module, "check_batch_fits", counting("fits", batch_module.check_batch_fits))
    xs = [layer.random_hidden(11, seed=i) for i, layer in enumerate(layers)]
    assert runner.run([(0, 0, 5), (1, 1, 6)], alloc, xs).mode == "graph"
    assert counts == {"hidden": len(layers), "fits": 1}


def test_a_captured_tensor_whose_storage_moved_in_place_is_refused():
    layers, alloc, pools, runner = _mixed_runner()
    pools[1].ring.set_(pools[1].ring.clone())  # the same tensor object, new memory
    xs = [layer.random_hidden(10, seed=i) for i, layer in enumerate(layers)]
    with pytest.raises(ValueError, match=r"runner\.layer_pools\[1\]\.ring is not the tensor the graphs captured"):
        runner.run([(0, 0, 10)], alloc, xs)  # bucket 16: a replay


def _snapshot(pools, alloc):
    return [t.clone() for p in pools for t in p.tensors().values()] + [alloc.page_table.clone()]


def _interrupt_after_layer_0(runner, bucket):
    """A replay that a KeyboardInterrupt stops after layer 0 wrote its caches and ring."""
    def replay():
        s = runner.static
        c2.compress_fused(runner.layers[0], s.layers[0].projected[:bucket], s.view(bucket), runner.layer_pools[0],
                          latent_out=s.layers[0].latent[:bucket], validate=False)
        raise KeyboardInterrupt
    return replay


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_an_interrupted_step_makes_the_next_run_refuse_until_its_requests_start_again(mode, monkeypatch):
    """A KeyboardInterrupt between the layers of a step, then the same batch again: refused, in
    the package's words, nothing changed; after its requests are freed and started again from
    position 0, every layer equals eager."""
    from c2graph.prefill import runner as runner_module

    layers, alloc, pools, runner = _mixed_runner()
    first = [(0, 0, 4), (1, 0, 4)]
    xs = [layer.random_hidden(8, seed=i) for i, layer in enumerate(layers)]
    runner.run(first, alloc, xs)
    second = [(0, 4, 7), (1, 4, 5)]  # 12 rows: bucket 16 (graph); padded to 40, past the buckets: eager
    xs = [layer.random_hidden(12, seed=10 + i) for i, layer in enumerate(layers)]
    pad_to = None if mode == "graph" else 40
    if mode == "graph":
        monkeypatch.setattr(runner.graphs[16], "replay", _interrupt_after_layer_0(runner, 16))
    else:
        real, calls = runner_module.compress, []

        def compress_then_interrupt(*args, **kw):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(*args, **kw)
        monkeypatch.setattr(runner_module, "compress", compress_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        runner.run(second, alloc, xs, pad_to=pad_to)
    monkeypatch.undo()
    assert runner.unfinished == "2 request(s), pool indices [0, 1], " + ("16 rows" if mode == "graph" else "40 rows")
    before = _snapshot(pools, alloc)
    with pytest.raises(RuntimeError, match=r"the last step \(2 request\(s\), pool indices \[0, 1\].*did not finish.*"
                                           r"allocator\.free\(pool_index\).*runner\.clear_unfinished\(\)"):
        runner.run(second, alloc, xs, pad_to=pad_to)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(pools, alloc)))
    for pool_index in (0, 1):
        alloc.free(pool_index)
    runner.clear_unfinished()
    refs = [p.clone() for p in pools]
    again = [(0, 0, 7), (1, 0, 5)]
    step = runner.run(again, alloc, xs, pad_to=pad_to)
    assert step.mode == mode and runner.unfinished is None
    batch = c2.ExtendBatch.build(again, alloc, pad_to=pad_to)
    for layer, x, p, r in zip(layers, xs, pools, refs):
        c2.compress(layer, x, batch, r)
        assert all(compare_pools(p, r, skip_slot0=not layer.use_fused_gate))


def test_the_engine_projection_changes_only_the_projection():
    """``projection="engine"``: the GEMM in fp32 (bf16 products, exact in fp32, summed in fp32),
    within fp32 rounding of the exact one; the graph then compresses what it projected, as eager
    compresses the same projection, bitwise."""
    layers, alloc, pools, _ = _mixed_runner(seed=6)
    with pytest.raises(ValueError, match=r"projection = 'fp8'; expected one of \('exact', 'engine'\)"):
        c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=SLOTS, projection="fp8")
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=SLOTS, projection="engine")
    refs = [p.clone() for p in pools]
    reqs = [(0, 0, 5), (1, 1, 6), (2, 0, 3)]
    xs = [layer.random_hidden(14, seed=20 + i) for i, layer in enumerate(layers)]
    exact = project_fused(layers[0], xs[0])
    engine = project_fused(layers[0], xs[0], projection="engine")
    assert torch.allclose(engine, exact, rtol=1e-5, atol=1e-5) and engine.dtype == torch.float32
    step = runner.run(reqs, alloc, xs)
    batch = c2.ExtendBatch.build(reqs, alloc, pad_to=16, request_slots=SLOTS)
    for i, (layer, x, p, r) in enumerate(zip(layers, xs, pools, refs)):
        if layer.use_fused_gate:
            projected = torch.zeros(16, 2 * CFG.D, device=x.device)
            project_fused(layer, x, out=projected, projection="engine")
            latent = c2.compress_fused(layer, projected, batch, r)
            assert same_bits(step.latents[i][batch.group_rows], latent[batch.group_rows])
            assert all(compare_pools(p, r, skip_slot0=False)), i


def test_the_per_batch_version_the_fix_replaces_is_right_eagerly_and_refused_by_a_capture():
    from c2graph.workshop.broken_offsets import compress_layers_per_batch

    layers = served_layers(CFG, 1, unfused_every=None, seed=8)
    alloc = c2.ReqToTokenPool(CFG, 4, 96, seed=8)
    mine = [p.poison(POISON) for p in layer_pools(layers, 4, alloc.kv_slots)]
    theirs = [p.clone() for p in mine]
    engine = EnginePiece(layers, mine, layers[0].device.type)
    reqs = [(0, 0, 5), (1, 1, 6)]
    batch = c2.ExtendBatch.build(reqs, alloc, request_slots=SLOTS, pad_to=16)
    x = [layers[0].random_hidden(11, seed=8)]
    engine.replay(batch, x)
    projected = torch.zeros(16, 2 * CFG.D, device=x[0].device)
    project_fused(layers[0], x[0], out=projected)
    latent = torch.full((16, CFG.D), float("nan"), dtype=torch.bfloat16, device=x[0].device)
    rows = StaticRows(batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets)
    broken = fused_layers(layers, theirs, 16, [projected], [latent])
    compress_layers_per_batch(rows, broken, batch.extend_offsets.tolist(), 11)
    assert_pools_bitwise(mine[0], theirs[0], "eagerly")
    with pytest.raises(RuntimeError, match="Cannot copy between CPU and CUDA tensors during CUDA graph capture"):
        with c2.Graph().capture():
            compress_layers_per_batch(rows, broken, batch.extend_offsets.tolist(), 11)


def test_refresh_takes_one_tensor_for_a_one_layer_runner_as_run_does():
    layer = c2.SourceLayer(CFG, seed=9)
    alloc = c2.ReqToTokenPool(CFG, 4, 64, seed=9)
    pools = c2.Pools(CFG, 4, alloc.kv_slots).poison(POISON)
    ref = pools.clone()
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16], request_slots=SLOTS)
    reqs = [(0, 0, 5), (1, 1, 6)]
    batch = c2.ExtendBatch.build(reqs, alloc, request_slots=SLOTS, pad_to=16)
    x = layer.random_hidden(11, seed=9)
    runner.refresh(batch, x)
    runner.graphs[16].replay()
    c2.compress(layer, x, batch, ref)
    assert all(compare_pools(pools, ref))
