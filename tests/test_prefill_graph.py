"""The prefill graph runner, one layer or many, and the broken ways of giving the fused path its offsets.

Runs on the CPU through the graph emulation, and on a GPU (``make gpu-test``) on real CUDA
graphs with compiled kernels: the same assertions hold on both. Every check is graph against
eager, bitwise, from poisoned pools; c2 slot 0 is skipped for torch layers (their dump slot).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case, untouched_slots_keep_poison

import c2graph as c2
from c2graph.compressor.fused import SMALL_BUCKET_GROUPS_PER_BLOCK, grid_blocks
from c2graph.compressor.model import layer_pools, model_preset, served_layers
from c2graph.workshop.broken_offsets import VARIANTS, BrokenOffsetsRunner
from c2graph.measure.compare import compare, compare_pools

HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
CFG = c2.Config.tiny()


def model_case(kind: str, seed: int = 0, pool_requests: int = 6, max_seq_len: int = 96):
    """Layers (``"torch"``, ``"fused"``, or ``"mixed"``: the tiny preset, fused and torch layers
    alternating), an allocator and one poisoned Pools per layer."""
    if kind == "mixed":
        layers = model_preset("tiny", seed=seed)
    else:
        layers = [c2.SourceLayer(CFG, seed=seed, use_fused_gate=kind == "fused")]
    alloc = c2.ReqToTokenPool(CFG, pool_requests, max_seq_len, seed=seed)
    pools = [p.poison(POISON) for p in layer_pools(layers, pool_requests, alloc.kv_slots)]
    return layers, alloc, pools


def hidden(layers, live: int, seed: int) -> list[torch.Tensor]:
    return [layer.random_hidden(live, seed=seed * 101 + i) for i, layer in enumerate(layers)]


def eager(layers, refs, requests, alloc, xs, pad_to=None) -> tuple[c2.ExtendBatch, list[torch.Tensor]]:
    """Every layer by its own path, eagerly, on the unpadded batch (or padded to ``pad_to``)."""
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=pad_to, device=refs[0].device)
    return batch, [c2.compress(layer, x, batch, p) for layer, x, p in zip(layers, xs, refs)]


def assert_same(layers, pools, refs, step=None, want=None, batch=None):
    """Caches and ring of every layer bitwise; with a step, the latents of the group rows too."""
    for i, (layer, p, r) in enumerate(zip(layers, pools, refs)):
        for result in compare_pools(p, r, skip_slot0=not layer.use_fused_gate):
            assert result, f"layer {i} ({c2.layer_path(layer)}): {result}"
    if step is not None:
        groups = batch.group_rows
        for i, (got, w) in enumerate(zip(step.latents, want)):
            assert compare(got[groups], w[groups], f"layer {i} latent"), i


@pytest.fixture(params=["torch", "fused", "mixed"])
def kind(request):
    return request.param


def test_graph_replays_equal_eager_for_1_5_1_0_requests(kind):
    layers, alloc, pools = model_case(kind, seed=1)
    refs = [p.clone() for p in pools]
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16, 32], request_slots=8)
    batches = [[(0, 0, 13)], [(1, 0, 3), (2, 1, 4), (3, 0, 2), (4, 3, 3), (5, 0, 6)], [(0, 13, 9)], []]
    written: set[int] = set()
    for i, reqs in enumerate(batches):
        xs = hidden(layers, sum(r[2] for r in reqs), seed=i)
        pad_to = None if reqs else 16
        step = runner.run(reqs, alloc, xs, pad_to=pad_to)
        assert step.mode == "graph", (i, step.mode)
        batch, want = eager(layers, refs, reqs, alloc, xs, pad_to=pad_to)
        assert_same(layers, pools, refs, step, want, batch)
        written |= set(batch.stored_slots)
        for layer, p in zip(layers, pools):  # slots past the batch and padding rows wrote nothing
            assert untouched_slots_keep_poison(p, written, skip_slot0=not layer.use_fused_gate) == []


@functools.lru_cache(maxsize=None)
def _property_runner():
    """One fused and one torch layer, captured once for every example (buckets 8 and 16)."""
    layers = served_layers(CFG, 2, unfused_every=2, seed=7)
    pools = layer_pools(layers, 4, c2.ReqToTokenPool(CFG, 4, 48).kv_slots)
    return layers, pools, c2.PrefillGraphRunner(layers, pools, buckets=[8, 16], request_slots=4)


@settings()  # max_examples from the profile (tests/conftest.py): 200 in CI
@given(data=st.data())
def test_random_chunked_prefills_in_the_graph_equal_eager(data):
    """A random sequence of 1 to 3 batches, each a chunk of some of four requests (odd and even
    starts), sometimes DP-padded, sometimes an idle rank: graph == eager, bitwise, every layer."""
    layers, pools, runner = _property_runner()
    seed = data.draw(st.integers(0, 2**16), label="seed")
    alloc = c2.ReqToTokenPool(CFG, 4, 48, seed=seed)
    for p in pools:
        p.poison(POISON)  # in place: the graphs hold these tensors
    refs = [p.clone() for p in pools]
    done = {p: data.draw(st.integers(0, 3), label=f"prefix {p}") for p in range(4)}
    for step_no in range(data.draw(st.integers(1, 3), label="batches")):
        who = data.draw(st.lists(st.sampled_from(range(4)), max_size=3, unique=True), label="requests")
        reqs = [(p, done[p], data.draw(st.integers(1, 5), label="rows")) for p in who]
        live = sum(n for *_, n in reqs)
        pad_to = data.draw(st.one_of(st.none(), st.integers(live, 16)), label="pad_to")
        if (live if pad_to is None else pad_to) < 4:
            pad_to = 4  # DP-padded (an idle rank included) to 4 rows or more: bucket 8, not eager
        xs = hidden(layers, live, seed + step_no)
        step = runner.run(reqs, alloc, xs, pad_to=pad_to)
        assert step.mode == "graph"
        batch, want = eager(layers, refs, reqs, alloc, xs, pad_to=pad_to)
        assert_same(layers, pools, refs, step, want, batch)
        for p, pre, n in reqs:
            done[p] = pre + n


def test_dp_padding_and_an_idle_rank_write_nothing(kind):
    """Ranks pad to a shared row count; an idle rank replays with every row padding."""
    layers, alloc, pools = model_case(kind, seed=2)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16, 32], request_slots=4)
    refs = [p.clone() for p in pools]
    reqs = [(0, 1, 5), (1, 0, 4)]
    xs = hidden(layers, 9, seed=3)
    step = runner.run(reqs, alloc, xs, pad_to=30)  # 30 rows shared by all ranks: bucket 32
    assert (step.mode, step.bucket) == ("graph", 32)
    batch, want = eager(layers, refs, reqs, alloc, xs)
    assert_same(layers, pools, refs, step, want, batch)
    before = [p.clone() for p in pools]
    idle = runner.run([], alloc, hidden(layers, 0, seed=4), pad_to=30)
    assert (idle.mode, idle.bucket, idle.batch.live_rows) == ("graph", 32, 0)
    assert_same(layers, pools, before)


def test_node_counts_per_layer():
    """A fused layer is one node; a torch layer over a hundred, the same in every torch layer."""
    layers, _, pools = model_case("mixed")
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=4)
    per_layer = runner.layer_nodes(16)
    counts = [len(nodes) for nodes in per_layer]
    torch_alone = c2.PrefillGraphRunner(*model_case("torch")[::2], buckets=[16], request_slots=4).nodes(16)
    assert runner.paths == ("fused", "torch", "fused", "torch")
    assert counts == [1, len(torch_alone), 1, len(torch_alone)] and len(torch_alone) > 100
    assert all("compress_fused" in nodes[0] for nodes, p in zip(per_layer, runner.paths) if p == "fused")
    assert sum(counts) == len(runner.nodes(16))


def test_bucket_choice_and_eager_fallback():
    layers, alloc, pools = model_case("mixed", seed=3)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[32, 16], request_slots=2)
    assert [runner.pick_bucket(n) for n in (8, 9, 16, 17, 32, 33)] == [16, 16, 16, 32, 32, None]
    assert runner.pick_bucket(7) is None, "padding 7 rows to 16 more than doubles them"
    refs = [p.clone() for p in pools]
    for i, reqs in enumerate(([(0, 0, 4), (1, 0, 4), (2, 0, 4)], [(3, 0, 40)])):  # too many; too long
        xs = hidden(layers, sum(r[2] for r in reqs), seed=i)
        step = runner.run(reqs, alloc, xs)
        assert step.mode == "eager" and len(step.latents) == 4
        batch, want = eager(layers, refs, reqs, alloc, xs)
        assert_same(layers, pools, refs, step, want, batch)


def test_one_layer_keeps_its_one_layer_names():
    layers, alloc, pools = model_case("fused", seed=4)
    runner = c2.PrefillGraphRunner(layers[0], pools[0], buckets=[16], request_slots=2)
    step = runner.run([(0, 1, 9)], alloc, layers[0].random_hidden(9, seed=1))
    assert runner.layer is layers[0] and runner.pools is pools[0] and runner.path == "fused"
    assert step.latent is step.latents[0] and step.latent.shape == (16, CFG.D)
    assert runner.static.projected is runner.static.layers[0].projected
    assert runner.static.extend_offsets is runner.static.low_ratio_extend_offsets
    assert runner.static.extend_offsets.tolist() == [[0, 9], [9, 0]]


def test_every_one_layer_shortcut_is_refused_alike_with_many_layers():
    layers, alloc, pools = model_case("mixed", seed=4)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=2)
    step = runner.run([(0, 1, 9)], alloc, hidden(layers, 9, seed=1))
    for owner, many, get in (("runner", "layers", lambda: runner.layer), ("runner", "layer_pools", lambda: runner.pools),
                             ("static", "layers", lambda: runner.static.latent), ("step", "latents", lambda: step.latent)):
        with pytest.raises(AttributeError, match=rf"this {owner} has 4 layers; use {owner}.{many}\[i\]"):
            get()


def test_the_static_batch_is_one_builder_shared_with_the_workshop():
    """The runner's static buffers are a StaticBatch: one view per bucket made before any capture,
    the dummy batch loaded for a capture, a real batch copied in place."""
    from c2graph.workshop.practice import StaticBatch

    layers, alloc, pools = model_case("torch", seed=6)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[8, 16], request_slots=3)
    static = runner.static
    assert StaticBatch is c2.StaticBatch and isinstance(static, c2.StaticBatch)
    view = static.view(8)
    assert view is static.view(8) and view.pos.data_ptr() == static.pos.data_ptr() and view.num_rows == 8
    batch = c2.ExtendBatch.build([(0, 1, 5), (1, 0, 4)], alloc, request_slots=3, pad_to=16)
    static.load(batch)
    assert static.pos.tolist() == batch.pos.tolist() and static.c2_slot.tolist() == batch.c2_slot.tolist()
    static.load_dummy(8)
    assert static.pos[:8].tolist() == list(range(8)) and static.raw_out_loc[:8].eq(0).all()
    assert static.extend_offsets.tolist() == [[0, 8, 8], [8, 0, 0]]
    with pytest.raises(ValueError, match="rows = 12; expected one of the row counts made at the start"):
        static.view(12)
    with pytest.raises(ValueError, match="batch has 16 rows and 2 request slots; expected at most 16 and exactly 3"):
        static.load(c2.ExtendBatch.build([(2, 0, 4)], alloc, request_slots=2, pad_to=16))


def test_many_layers_share_one_offsets_tensor_and_one_memory_pool():
    layers, alloc, pools = model_case("mixed", seed=5)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16, 32], request_slots=4)
    assert list(runner.graphs) == [32, 16], "largest bucket captured first"
    assert len({g.pool() for g in runner.graphs.values()}) == 1
    with pytest.raises(AttributeError, match="4 layers; use runner.layers"):
        runner.layer
    with pytest.raises(AttributeError, match="runner.layer_pools"):
        runner.pools
    runner.run([(0, 0, 5), (1, 3, 6)], alloc, hidden(layers, 11, seed=0))
    assert runner.static.low_ratio_extend_offsets.tolist() == [[0, 5, 11, 11], [5, 6, 0, 0]]
    audit = runner.audit(16)
    reads = {t.label for r in audit.nodes() for t in r.tensors if t.name == "extend_offsets"}
    assert reads == {"low_ratio_extend_offsets"}, reads  # every fused layer reads the one tensor


def test_bad_input_raises_before_anything_is_written():
    layers, alloc, pools = model_case("mixed", seed=4)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=2)
    before = [p.clone() for p in pools]
    with pytest.raises(ValueError, match="xs has 3 tensors; expected one per layer"):
        runner.run([(0, 0, 6)], alloc, hidden(layers, 6, seed=1)[:3])
    with pytest.raises(ValueError, match=r"xs\[2\] has 5 rows; expected the batch's 6 live rows"):
        runner.run([(0, 0, 6)], alloc, hidden(layers, 6, seed=1)[:2] + hidden(layers, 5, seed=1)[2:])
    with pytest.raises(ValueError, match="pad_to = 4; expected an int >= the batch's 6 live rows"):
        runner.run([(0, 0, 6)], alloc, hidden(layers, 6, seed=1), pad_to=4)
    with pytest.raises(ValueError, match="extend_len = -1"):
        runner.run([(0, 0, -1)], alloc, hidden(layers, 0, seed=1), pad_to=12)
    with pytest.raises(ValueError, match="buckets"):
        c2.PrefillGraphRunner(layers, pools, buckets=[0], request_slots=2)
    with pytest.raises(ValueError, match="request_slots"):
        c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=0)
    with pytest.raises(ValueError, match="4 layers and 3 pools"):
        c2.PrefillGraphRunner(layers, pools[:3], buckets=[16], request_slots=2)
    with pytest.raises(ValueError, match="layers is a SourceLayer and pools a list"):
        c2.PrefillGraphRunner(layers[0], pools, buckets=[16], request_slots=2)
    other = c2.SourceLayer(c2.Config.tiny(hidden=32), seed=0)
    with pytest.raises(ValueError, match=r"layers\[1\].cfg differs"):
        c2.PrefillGraphRunner([layers[0], other], pools[:2], buckets=[16], request_slots=2)
    assert_same(layers, pools, before)


def test_a_runner_built_without_capture_refuses_to_run():
    layers, alloc, pools = model_case("torch", seed=4)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=2, capture=False)
    assert runner.graphs == {}
    with pytest.raises(RuntimeError, match="no graph for bucket 16: .*capture=False"):
        runner.run([(0, 0, 12)], alloc, hidden(layers, 12, seed=0))


# ---------------------------------------------------------------------------------------------
# The broken variants and the fix, through the same batches: each variant raises, or is wrong
# exactly where notebook 03 says; the fix never is.

FIRST = [(0, 0, 5), (1, 0, 3), (2, 0, 8)]  # 16 live rows, every request from position 0
SECOND = [(0, 5, 6), (1, 3, 7), (2, 8, 5)]  # odd, odd, even starts; 18 live rows -> bucket 32


def _through(make_runner):
    layer, alloc, pools = make_case(seed=5)
    runner = make_runner(layer, pools)
    ref = pools.clone()
    batches = []
    for i, reqs in enumerate((FIRST, SECOND)):
        x = layer.random_hidden(sum(r[2] for r in reqs), seed=10 + i)
        step = runner.run(reqs, alloc, x)
        assert step.mode == "graph"
        eager([layer], [ref], reqs, alloc, [x])
        batches.append(step.batch)
    return batches, pools, ref


def _broken_case(variant, **kw):
    return _through(lambda layer, pools: BrokenOffsetsRunner(layer, pools, variant=variant, buckets=[32],
                                                             request_slots=4, **kw))


def _wrong_slots(pools, ref):
    diff = (pools.kv_cache.float() != ref.kv_cache.float()).any(dim=1)
    return set(torch.nonzero(diff).flatten().tolist())


def test_the_fix_equals_eager_on_the_batches_that_break_the_variants():
    _, pools, ref = _through(lambda layer, pools: c2.PrefillGraphRunner(layer, pools, buckets=[32], request_slots=4))
    assert _wrong_slots(pools, ref) == set()
    assert all(compare_pools(pools, ref, skip_slot0=False))


@pytest.mark.parametrize("variant", ["tolist", "tensor_from_list"])
def test_host_reads_of_the_offsets_are_refused_by_capture(variant):
    layer, _, pools = make_case(seed=6)
    with pytest.raises(RuntimeError, match=HOST_COPY):
        BrokenOffsetsRunner(layer, pools, variant=variant, buckets=[32], request_slots=4)


@pytest.mark.parametrize("variant", ["python_ints", "rebound"])
def test_frozen_offsets_pair_across_requests_and_park_nothing(variant):
    """The graph replays the dummy batch's offsets: one request covering all 32 rows."""
    (_, batch), pools, ref = _broken_case(variant)
    raw = batch.raw_out_loc.cpu()
    starts = [rows[0] for rows in batch.row_ranges()]
    # Both odd-start requests of the second batch get a wrong first group:
    # - request 1's first row pairs with request 0's last row instead of its ring row;
    # - request 0's first row does read its ring row, but the first batch parked nothing there.
    expected = {int(raw[starts[0]]) // 2, int(raw[starts[1]]) // 2}
    # The first batch's groups all come out right: under the dummy's one request, the kernel's pairs
    # of rows (0, 1), (2, 3), ... still each hold one group row of the batch, whose partner is the
    # previous row, as eager's is.
    assert _wrong_slots(pools, ref) == expected
    # the dummy's last rows are padding: no request gets its rows parked
    parked = set(batch.parked_ring_rows(2))
    wrong_ring = set(torch.nonzero((pools.ring != ref.ring).any(dim=1)).flatten().tolist())
    assert wrong_ring == parked


def test_a_grid_sized_from_the_capture_batch_never_computes_later_groups():
    batches, pools, ref = _broken_case("grid_from_batch", capture_rows=9)
    blocks = grid_blocks(9, 4, SMALL_BUCKET_GROUPS_PER_BLOCK)  # the frozen grid: one block of 8 groups
    missed = set()
    for batch in batches:  # 9 and 10 pairs: each batch's last group row lies past the grid
        raw = batch.raw_out_loc.cpu()
        plan = c2.program_plan(batch, 2, groups_per_block=SMALL_BUCKET_GROUPS_PER_BLOCK)
        missed |= {int(raw[row]) // 2 for p in plan[blocks:] for row in p["groups"]}
    assert blocks == 1 and len(missed) == 2 and _wrong_slots(pools, ref) == missed
    assert (pools.kv_cache[sorted(missed)].float() == POISON).all(), "never written: still the poison"


def test_every_variant_is_named():
    assert set(VARIANTS) == {"tolist", "tensor_from_list", "python_ints", "rebound", "grid_from_batch"}
    layer, _, pools = make_case()
    with pytest.raises(ValueError, match="variant"):
        BrokenOffsetsRunner(layer, pools, variant="nope", buckets=[16], request_slots=2)
    with pytest.raises(ValueError, match="expected one SourceLayer"):
        BrokenOffsetsRunner([layer], [pools], variant="rebound", buckets=[16], request_slots=2)
