"""The prefill graph runner (SPEC §6) and the broken ways of giving the fused path its offsets.

Runs on the CPU through the graph emulation, and on a GPU (``make gpu-test``) on real CUDA
graphs with compiled kernels: the same assertions hold on both.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case

import c2graph as c2
from c2graph.graphs.broken_offsets import VARIANTS, BrokenOffsetsRunner
from c2graph.measure.compare import compare_pools
from c2graph.compressor.fused import BLOCK_M

HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"


def eager(layer, pools, requests, alloc, x, pad_to=None):
    """The same path, eagerly, on the unpadded batch (or padded to ``pad_to``)."""
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=pad_to, device=pools.device)
    if layer.use_fused_gate:
        projected = torch.zeros(batch.num_rows, 2 * layer.cfg.D, device=pools.device)
        c2.project_fused(layer, x, out=projected)
        c2.compress_fused(layer, projected, batch, pools)
    else:
        kv, score = (torch.zeros(batch.num_rows, layer.cfg.D, device=pools.device) for _ in range(2))
        k, s = c2.project(layer, x)
        kv[: batch.live_rows], score[: batch.live_rows] = k, s
        c2.compress_torch(layer, kv, score, batch, pools)
    return batch


def assert_same(pools, ref, fused):
    for result in compare_pools(pools, ref, skip_slot0=not fused):
        assert result, result


@pytest.fixture(params=["torch", "fused"])
def path(request):
    return request.param


def test_graph_replays_equal_eager_for_1_5_1_0_requests(path):
    fused = path == "fused"
    layer, alloc, pools = make_case(use_fused_gate=fused, seed=1)
    ref = pools.clone()
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16, 32], request_slots=8)
    batches = [
        [(0, 0, 13)],
        [(1, 0, 3), (2, 1, 4), (3, 0, 2), (4, 3, 3), (5, 0, 6)],
        [(0, 13, 9)],
        [],
    ]
    for i, reqs in enumerate(batches):
        x = layer.random_hidden(sum(r[2] for r in reqs), seed=i)
        step = runner.run(reqs, alloc, x, pad_to=None if reqs else 16)
        assert step.mode == "graph", (i, step.mode)
        eager(layer, ref, reqs, alloc, x, pad_to=None if reqs else 16)
        assert_same(pools, ref, fused)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_random_chunked_prefills_in_the_graph_equal_eager(data):
    """Random sequences of batches, each a chunk of some of four requests: graph == eager, bitwise."""
    fused = data.draw(st.booleans(), label="fused")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    layer, alloc, pools = make_case(use_fused_gate=fused, seed=seed)
    ref = pools.clone()
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16, 32], request_slots=4)
    done = {p: data.draw(st.integers(0, 3), label=f"prefix {p}") for p in range(4)}
    for step_no in range(data.draw(st.integers(2, 4), label="batches")):
        who = data.draw(st.lists(st.sampled_from(range(4)), min_size=1, max_size=4, unique=True))
        reqs = [(p, done[p], data.draw(st.integers(1, 7))) for p in who]
        x = layer.random_hidden(sum(n for *_, n in reqs), seed=seed + step_no)
        runner.run(reqs, alloc, x)
        eager(layer, ref, reqs, alloc, x)
        for p, pre, n in reqs:
            done[p] = pre + n
        assert_same(pools, ref, fused)


def test_dp_padding_and_an_idle_rank_write_nothing(path):
    """Ranks pad to a shared row count; an idle rank replays with every row padding."""
    fused = path == "fused"
    layer, alloc, pools = make_case(use_fused_gate=fused, seed=2)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16, 32], request_slots=4)
    ref = pools.clone()
    reqs = [(0, 1, 5), (1, 0, 4)]
    x = layer.random_hidden(9, seed=3)
    step = runner.run(reqs, alloc, x, pad_to=30)  # 30 rows shared by all ranks: bucket 32
    assert (step.mode, step.bucket) == ("graph", 32)
    eager(layer, ref, reqs, alloc, x)
    assert_same(pools, ref, fused)
    before = pools.clone()
    idle = runner.run([], alloc, layer.random_hidden(0, seed=4), pad_to=30)
    assert (idle.mode, idle.batch.live_rows) == ("graph", 0)
    assert_same(pools, before, fused)


def test_bucket_choice_and_eager_fallback():
    layer, alloc, pools = make_case(seed=3)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[32, 16], request_slots=2)
    assert [runner.pick_bucket(n) for n in (8, 9, 16, 17, 32, 33)] == [16, 16, 16, 32, 32, None]
    assert runner.pick_bucket(7) is None, "padding 7 rows to 16 more than doubles them"
    too_many = [(0, 0, 4), (1, 0, 4), (2, 0, 4)]
    assert runner.run(too_many, alloc, layer.random_hidden(12, seed=1)).mode == "eager"
    assert runner.run([(3, 0, 40)], alloc, layer.random_hidden(40, seed=2)).mode == "eager"


def test_node_lists():
    """The torch path is over a hundred nodes in the graph; the fused path is one."""
    torch_layer, _, torch_pools = make_case(use_fused_gate=False)
    fused_layer, _, fused_pools = make_case(use_fused_gate=True)
    torch_nodes = c2.PrefillGraphRunner(torch_layer, torch_pools, buckets=[16], request_slots=4).nodes(16)
    fused_nodes = c2.PrefillGraphRunner(fused_layer, fused_pools, buckets=[16], request_slots=4).nodes(16)
    assert len(torch_nodes) > 100, len(torch_nodes)
    assert len(fused_nodes) == 1 and "fused_compress" in fused_nodes[0], fused_nodes


def test_bad_input_raises_before_anything_is_written():
    layer, alloc, pools = make_case(seed=4)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16], request_slots=2)
    before = pools.clone()
    with pytest.raises(ValueError, match="x has 5 rows; expected the batch's 6 live rows"):
        runner.run([(0, 0, 6)], alloc, layer.random_hidden(5, seed=1))
    with pytest.raises(ValueError, match="extend_len = -1"):
        runner.run([(0, 0, -1)], alloc, layer.random_hidden(0, seed=1), pad_to=12)
    with pytest.raises(ValueError, match="buckets"):
        c2.PrefillGraphRunner(layer, pools, buckets=[0], request_slots=2)
    with pytest.raises(ValueError, match="request_slots"):
        c2.PrefillGraphRunner(layer, pools, buckets=[16], request_slots=0)
    assert_same(pools, before, fused=True)


# ---------------------------------------------------------------------------------------------
# The broken variants: each raises, or is wrong exactly where the story says.

FIRST = [(0, 0, 5), (1, 0, 3), (2, 0, 8)]  # 16 live rows, run eagerly-equivalent in the graph
SECOND = [(0, 5, 6), (1, 3, 7), (2, 8, 5)]  # odd, odd, even starts; 18 live rows -> bucket 32


def _broken_case(variant, **kw):
    layer, alloc, pools = make_case(seed=5)
    runner = BrokenOffsetsRunner(layer, pools, variant=variant, buckets=[32], request_slots=4, **kw)
    ref = pools.clone()
    for i, reqs in enumerate((FIRST, SECOND)):
        x = layer.random_hidden(sum(r[2] for r in reqs), seed=10 + i)
        step = runner.run(reqs, alloc, x)
        assert step.mode == "graph"
        eager(layer, ref, reqs, alloc, x)
    return step.batch, pools, ref


def _wrong_slots(pools, ref):
    diff = (pools.kv_cache.float() != ref.kv_cache.float()).any(dim=1)
    return set(torch.nonzero(diff).flatten().tolist())


@pytest.mark.parametrize("variant", ["tolist", "tensor_from_list"])
def test_host_reads_of_the_offsets_are_refused_by_capture(variant):
    layer, _, pools = make_case(seed=6)
    with pytest.raises(RuntimeError, match=HOST_COPY):
        BrokenOffsetsRunner(layer, pools, variant=variant, buckets=[32], request_slots=4)


@pytest.mark.parametrize("variant", ["python_ints", "rebound"])
def test_frozen_offsets_pair_across_requests_and_park_nothing(variant):
    """The graph replays the dummy batch's offsets: one request covering all 32 rows."""
    batch, pools, ref = _broken_case(variant)
    raw = batch.raw_out_loc.cpu()
    starts = [rows[0] for rows in batch.row_ranges()]
    # Both odd-start requests of the second batch get a wrong first group:
    # - request 1's first row pairs with request 0's last row instead of its ring row;
    # - request 0's first row does read its ring row, but the first batch parked nothing there.
    expected = {int(raw[starts[0]]) // 2, int(raw[starts[1]]) // 2}
    assert _wrong_slots(pools, ref) == expected
    # the dummy's last rows are padding: no request gets its rows parked
    parked = set(batch.parked_ring_rows(2))
    wrong_ring = set(torch.nonzero((pools.ring != ref.ring).any(dim=1)).flatten().tolist())
    assert wrong_ring == parked


def test_a_grid_sized_from_the_capture_batch_never_visits_later_rows():
    batch, pools, ref = _broken_case("grid_from_batch", capture_rows=9)
    visited = -(-9 // BLOCK_M) * BLOCK_M  # the frozen grid covers whole blocks of rows
    raw = batch.raw_out_loc.cpu()
    missed = {int(raw[row]) // 2 for row in batch.group_rows() if row >= visited}
    assert missed and _wrong_slots(pools, ref) == missed
    assert (pools.kv_cache[sorted(missed)].float() == POISON).all(), "never written: still the poison"


def test_every_variant_is_named():
    assert set(VARIANTS) == {"tolist", "tensor_from_list", "python_ints", "rebound", "grid_from_batch"}
    layer, _, pools = make_case()
    with pytest.raises(ValueError, match="variant"):
        BrokenOffsetsRunner(layer, pools, variant="nope", buckets=[16], request_slots=2)
