"""The fused path: same function as the torch path, one launch, writes exactly what it must.

On a CPU the kernel runs in Triton's interpreter (slow), so these tests use the tiny preset and
small batches. On a CUDA machine the same tests run the compiled kernel (``pytest -m gpu``).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import (
    POISON,
    make_case,
    ragged_requests,
    untouched_slots_keep_poison,
    written_slots_hold_no_poison,
)

import c2graph as c2
import c2graph.compressor.fused_kernel
from c2graph.measure.compare import compare, compare_pools
from c2graph.compressor.fused import (
    SMALL_BUCKET_GROUPS_PER_BLOCK, SMALL_BUCKET_ROWS, KernelBlocks, check_launch, compress_fused, compress_fused_op, grid_blocks, kernel_blocks,
    launch_fused,
)
from c2graph.compressor.fused_kernel import source
from kernel_stages import stages
from variants import Variant, launch_variant
from c2graph.compressor.programs import program_plan
from c2graph.measure.traffic import minimum_bytes
from c2graph.measure.opcount import count_cuda_kernels, count_ops

TOL = 2**-6  # fused vs torch, and fused vs the float64 reference (docs/design.md, "The math")

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu)] if c2.HAS_CUDA else ["cpu"]
EXAMPLES = settings(max_examples=25, deadline=None)


def poisoned_latents(batch, cfg, device):
    return torch.full((batch.num_rows, cfg.D), POISON, dtype=torch.bfloat16, device=device)


def random_projected(layer, rows: int, seed: int) -> torch.Tensor:
    """``[rows, 2D]`` fp32 ``| kv | score |`` from the fused-gate projection of random hidden states."""
    return c2.project_fused(layer, layer.random_hidden(rows, seed))


def build(requests, alloc, device, *, extra_slots=0, padding=0):
    live = sum(r[2] for r in requests)
    return c2.ExtendBatch.build(
        requests, alloc, request_slots=len(requests) + extra_slots, pad_to=live + padding, device=device
    )


def run_previous_chunk(layer, alloc, pools, requests, chunk_len: int, seed: int, device) -> None:
    """Compress the chunk before each request's prefix, so that odd-start requests read real ring rows."""
    prev = [(p, max(0, pre - chunk_len), min(pre, chunk_len)) for p, pre, _ in requests if pre > 0]
    if not prev:
        return
    batch = build(prev, alloc, device)
    c2.compress_torch(layer, *c2.split_projected(random_projected(layer, batch.num_rows, seed)), batch, pools)


# ------------------------------------------------------------------------------------------------
# fused vs torch on random ragged batches, with the poison checks
# ------------------------------------------------------------------------------------------------


def run_fused(layer, projected, batch, pools, latent, blocks=None):
    """The fused path with the library's blocks, with other ``KernelBlocks``, or as a benchmark's
    :class:`Variant` (a persistent grid): the same checks, one launch."""
    if blocks is None:
        return compress_fused(layer, projected, batch, pools, latent_out=latent)
    cfg = layer.cfg
    args = (projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
            layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent)
    check_launch(*args, cfg.eps, cfg.ring_size, batch.num_rows)
    if isinstance(blocks, Variant):
        launch_variant(*args, cfg.eps, cfg.ring_size, batch.num_rows, variant=blocks)
    else:
        launch_fused(*args, cfg.eps, cfg.ring_size, batch.num_rows, blocks=blocks)
    return latent


def check_against_torch(cfg, requests, *, extra_slots=0, padding=0, chunk_len=3, seed=0, device="cpu",
                        blocks=None):
    """Fused vs torch on one batch after a previous chunk, with every poison check; returns the batch."""
    layer, alloc, pools = make_case(cfg, seed=seed, device=device)
    run_previous_chunk(layer, alloc, pools, requests, chunk_len, seed + 1, device)
    pools.kv_cache.fill_(POISON)  # the previous chunk's stores are not this batch's
    pools.index_k.fill_(POISON)
    batch = build(requests, alloc, device, extra_slots=extra_slots, padding=padding)
    projected = random_projected(layer, batch.num_rows, seed + 2)

    want_pools, got_pools = pools.clone(), pools.clone()
    want = c2.compress_torch(layer, *c2.split_projected(projected), batch, want_pools,
                             latent_out=poisoned_latents(batch, cfg, device))
    got = run_fused(layer, projected, batch, got_pools, poisoned_latents(batch, cfg, device), blocks)

    groups = batch.group_rows
    if groups:
        assert compare(got, want, "latent", rtol=TOL, atol=TOL, rows=torch.tensor(groups))
    for c in compare_pools(got_pools, want_pools, rtol=TOL, atol=TOL):
        assert c, c

    # Latents: group rows written, every other row (even, padding) keeps its poison.
    others = [r for r in range(batch.num_rows) if r not in set(groups)]
    assert bool((got[others].float() == POISON).all())
    assert not bool((got[groups].float() == POISON).any(dim=1).any())

    # Caches: exactly the batch's c2 slots are written; every other slot, c2 slot 0 included, is poison.
    stored = set(batch.stored_slots)
    assert untouched_slots_keep_poison(got_pools, stored, skip_slot0=False) == []
    assert written_slots_hold_no_poison(got_pools, stored) == []

    # Ring: each request's last rows parked bitwise; every other row, the sentinel included, unchanged.
    parked = batch.parked_ring_rows(cfg.ring_size)
    for ring_row, row in parked.items():
        assert torch.equal(got_pools.ring[ring_row], projected[row])
    untouched = [r for r in range(pools.ring.shape[0]) if r not in parked]
    assert torch.equal(got_pools.ring[untouched], pools.ring[untouched])
    return batch


@pytest.mark.parametrize("device", DEVICES)
@EXAMPLES
@given(
    requests=ragged_requests(max_len=9),
    ring_size=st.sampled_from([2, 4]),
    extra_slots=st.integers(0, 2),
    padding=st.integers(0, 5),
    chunk_len=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_fused_matches_torch(device, requests, ring_size, extra_slots, padding, chunk_len, seed):
    check_against_torch(c2.Config.tiny(ring_size=ring_size), requests, extra_slots=extra_slots,
                        padding=padding, chunk_len=chunk_len, seed=seed, device=device)


# Rows 0 | 1 2 3 | 4 | 5 6 7 8 | 9 10 at pos 1 | 3 4 5 | 5 | 0 1 2 3 | 7 8: group rows of both
# parities, and neighbours that both complete a group (rows 0, 1 and rows 8, 9).
BOTH_PARITIES = [(0, 1, 1), (1, 3, 3), (2, 5, 1), (3, 0, 4), (4, 7, 2)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_block_whose_groups_lie_in_several_requests(device):
    """A block's lanes take the batch's groups in turn, whichever requests and row parities they lie in."""
    blocks = KernelBlocks(groups_per_block=16, chunk=16, block_k=32, num_warps=4)
    batch = check_against_torch(c2.Config.tiny(), BOTH_PARITIES, extra_slots=1, padding=3, device=device,
                                blocks=blocks)
    program, *rest = program_plan(batch, ring_size=2, groups_per_block=16)
    assert program["lanes"] == [0, 1, 3, 4, 6, 8, 9] + [None] * 9
    assert all(not p["groups"] for p in rest)
    small = program_plan(batch, ring_size=2, D=c2.Config.tiny().D)  # 8 groups a block, in 16-lane tiles: lanes 8.. idle
    assert small[0]["lanes"] == [0, 1, 3, 4, 6, 8, 9] + [None] * 9


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("blocks", [
    KernelBlocks(groups_per_block=16, chunk=8, block_k=16, num_warps=4),
    Variant(KernelBlocks(groups_per_block=32, chunk=16, block_k=32, num_warps=4), programs_per_sm=2),  # persistent
    KernelBlocks(groups_per_block=64, chunk=32, block_k=32, num_warps=8, num_stages=2),
    KernelBlocks(groups_per_block=16, chunk=16, block_k=16, num_warps=4, gate_halves=True),
], ids=["g16", "g32-persistent", "g64", "g16-halves"])
def test_every_block_shape_computes_the_same_function(device, blocks):
    """More groups a block, narrower column sweeps, programs looping over blocks: the same function."""
    requests = [(0, 3, 40), (1, 0, 9), (2, 8, 1), (3, 1, 1), (4, 5, 70), (5, 0, 2)]
    check_against_torch(c2.Config.tiny(), requests, extra_slots=2, padding=7, seed=3, device=device,
                        blocks=blocks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bucket", [SMALL_BUCKET_ROWS, 4 * SMALL_BUCKET_ROWS], ids=["small", "large"])
def test_dsv41_matches_torch(device, bucket):
    """The served model's sizes, with the blocks of a small and of a large bucket, on a small batch."""
    cfg = c2.Config.dsv41()
    requests = [(0, 5, 100), (1, 0, 33), (2, 7, 1), (3, 2, 120)]
    check_against_torch(cfg, requests, extra_slots=1, padding=2, seed=4, device=device,
                        blocks=kernel_blocks(cfg.D, bucket))


@pytest.mark.parametrize("device", DEVICES)
def test_dsv41_small_and_large_bucket_blocks_agree_bitwise(device):
    """The two buckets' blocks share the groups out differently (and gate pass A's chunks whole or in
    halves) but give each group the same arithmetic:
    a batch compressed with either writes the same bits (a request gives the same caches whichever
    bucket its chunk lands in)."""
    cfg = c2.Config.dsv41()
    layer, alloc, pools = make_case(cfg, seed=6, device=device)
    run_previous_chunk(layer, alloc, pools, [(0, 3, 40), (1, 0, 17), (2, 1, 2)], 3, 7, device)
    batch = build([(0, 3, 40), (1, 0, 17), (2, 1, 2)], alloc, device, extra_slots=1, padding=5)
    projected = random_projected(layer, batch.num_rows, 8)
    runs = []
    for bucket in (SMALL_BUCKET_ROWS, 4 * SMALL_BUCKET_ROWS):
        got_pools = pools.clone()
        latent = run_fused(layer, projected, batch, got_pools, poisoned_latents(batch, cfg, device),
                           kernel_blocks(cfg.D, bucket))
        runs.append((latent, got_pools))
    (small, small_pools), (large, large_pools) = runs
    assert kernel_blocks(cfg.D, SMALL_BUCKET_ROWS) != kernel_blocks(cfg.D, 4 * SMALL_BUCKET_ROWS)
    def bits(t):  # bf16 compared as its bits: the same rounding, not merely close
        return t.view(torch.int16) if t.dtype == torch.bfloat16 else t

    assert torch.equal(bits(small), bits(large))
    for name in ("kv_cache", "index_k", "ring"):
        assert torch.equal(bits(getattr(small_pools, name)), bits(getattr(large_pools, name))), name


# ------------------------------------------------------------------------------------------------
# bad input raises before the launch, and writes nothing
# ------------------------------------------------------------------------------------------------


def bad_offsets_cases(T: int):
    return {
        "count past the buffer": ([[0, 5], [5, T]], torch.int32, "past the buffer"),
        "overlapping requests": ([[0, 3], [5, 4]], torch.int32, "disjoint"),
        "decreasing starts": ([[5, 0], [3, 5]], torch.int32, "non-decreasing"),
        "negative count": ([[0, 5], [-1, 3]], torch.int32, "row count must be >= 0"),
        "wrong dtype": ([[0, 5], [5, 4]], torch.int64, "dtype"),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(bad_offsets_cases(0)))
def test_bad_offsets_raise_before_launch(device, case):
    layer, alloc, pools = make_case(device=device)
    batch = build([(0, 1, 5), (1, 0, 4)], alloc, device, padding=2)
    values, dtype, message = bad_offsets_cases(batch.num_rows)[case]
    bad = dataclasses.replace(batch, extend_offsets=torch.tensor(values, dtype=dtype, device=device))
    projected = random_projected(layer, batch.num_rows, 0)
    before, latent = pools.clone(), poisoned_latents(batch, layer.cfg, device)
    with pytest.raises(ValueError, match=message):
        compress_fused(layer, projected, bad, pools, latent_out=latent)
    for c in compare_pools(pools, before, skip_slot0=False):
        assert c, c
    assert bool((latent.float() == POISON).all())


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_raise(device):
    layer, alloc, pools = make_case(device=device)
    batch = build([(0, 1, 5)], alloc, device)
    projected = random_projected(layer, batch.num_rows, 0)
    before = pools.clone()
    kv, score = c2.split_projected(projected)
    cases = [
        ((projected.to(torch.bfloat16),), "dtype"),
        ((projected[:, : layer.cfg.D].contiguous(),), "shape"),
        ((projected[:-1],), "shape"),
        (((kv, score),), "one \\[T, 2D\\] fp32 tensor"),
    ]
    for (p,), message in cases:
        with pytest.raises(ValueError, match=message):
            compress_fused(layer, p, batch, pools)
    with pytest.raises(ValueError, match="latent_out"):
        compress_fused(layer, projected, batch, pools, latent_out=torch.zeros(3, 3, device=device))
    unfused, _, _ = make_case(use_fused_gate=False, device=device)
    with pytest.raises(ValueError, match="layer.use_fused_gate"):
        compress_fused(unfused, projected, batch, pools)
    for c in compare_pools(pools, before, skip_slot0=False):
        assert c, c


def test_cpu_tensors_refused_when_triton_is_compiled(monkeypatch):
    # On a GPU machine Triton compiles the kernel, which cannot read host memory: CPU tensors get
    # a clear error before any launch. On a CPU machine, pretend the interpreter is off.
    import c2graph.compressor.fused as fused

    monkeypatch.setattr(fused, "INTERPRET", False)
    layer, alloc, pools = make_case(device="cpu")
    batch = build([(0, 1, 5)], alloc, "cpu")
    projected = random_projected(layer, batch.num_rows, 0)
    before = pools.clone()
    with pytest.raises(ValueError, match="projected is on cpu.*needs CUDA tensors"):
        compress_fused(layer, projected, batch, pools)
    for c in compare_pools(pools, before, skip_slot0=False):
        assert c, c


def test_sizes_must_be_powers_of_two():
    cfg = c2.Config(hidden=64, D=48, rope_dim=8, index_dim=16, page_size=16)
    layer, alloc, pools = make_case(cfg)
    batch = build([(0, 0, 4)], alloc, pools.device)
    with pytest.raises(ValueError, match="Config.D = 48"):
        compress_fused(layer, random_projected(layer, batch.num_rows, 0), batch, pools)


# ------------------------------------------------------------------------------------------------
# the custom op: one op per launch, and calling it again runs the kernel again
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_one_op_per_launch_and_reruns(device):
    layer, alloc, pools = make_case(device=device)
    batch = build([(0, 3, 6), (2, 0, 9)], alloc, device, extra_slots=1, padding=3)
    projected = random_projected(layer, batch.num_rows, 1)
    latent = poisoned_latents(batch, layer.cfg, device)
    with count_ops() as ops:
        compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
    assert dict(ops.counts) == {"c2graph.compress_fused.default": 1}

    first, first_latent = pools.clone(), latent.clone()
    pools.poison(POISON)
    latent.fill_(POISON)
    cfg = layer.cfg
    torch.ops.c2graph.compress_fused.default(
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
        layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent,
        cfg.eps, cfg.ring_size, batch.num_rows,
    )
    for c in compare_pools(pools, first, skip_slot0=False):
        assert c, c
    assert compare(latent, first_latent, "latent")


def rows_for_blocks(k: int, request_slots: int, groups_per_block: int = SMALL_BUCKET_GROUPS_PER_BLOCK) -> int:
    """A ``grid_rows`` whose grid has exactly ``k`` blocks."""
    rows = 0 if k == 0 else max(1, 2 * groups_per_block * (k - 1) - request_slots)
    assert grid_blocks(rows, request_slots, groups_per_block) == k
    return rows


@pytest.mark.parametrize("device", DEVICES)
def test_grid_rows_sets_the_groups_computed(device):
    """A grid sized for fewer rows than the batch has computes only the groups its blocks hold."""
    layer, alloc, pools = make_case(device=device)
    batch = build([(0, 0, 12), (1, 1, 24)], alloc, device)  # 6 + 12 groups: three blocks of 8
    projected = random_projected(layer, batch.num_rows, 2)
    cfg = layer.cfg
    latent = poisoned_latents(batch, cfg, device)
    grid_rows = 10
    assert grid_blocks(grid_rows, batch.request_slots, SMALL_BUCKET_GROUPS_PER_BLOCK) == 1  # one block: the batch's first 8 groups
    compress_fused_op(
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
        layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent,
        cfg.eps, cfg.ring_size, grid_rows,
    )
    written = ~(latent.float() == POISON).all(dim=1).cpu()
    assert written.nonzero().flatten().tolist() == batch.group_rows[:SMALL_BUCKET_GROUPS_PER_BLOCK]


def test_grid_blocks_hold_every_group_and_one_past():
    """The grid holds the most groups any batch of its rows and slots can have, and the number
    just past them (the block that parks trailing requests with no group)."""
    for rows, slots, groups_per_block in [(16, 1, 8), (17, 4, 8), (2048, 16, 8), (16384, 16, 16), (5, 3, 16)]:
        most = (rows + slots) // 2  # every request a single odd row, and the rest odd-started
        assert grid_blocks(rows, slots, groups_per_block) * groups_per_block > most
    assert grid_blocks(0, 4, 8) == 0


def test_program_plan_matches_the_batch():
    layer, alloc, pools = make_case(device="cpu")
    requests = [(0, 3, 6), (2, 0, 15), (4, 9, 12)]
    batch = c2.ExtendBatch.build(requests, alloc, request_slots=5, pad_to=40, device="cpu")
    plan = program_plan(batch, ring_size=2, D=layer.cfg.D)
    assert len(plan) == grid_blocks(40, 5, SMALL_BUCKET_GROUPS_PER_BLOCK) == 3
    assert sum((p["groups"] for p in plan), []) == batch.group_rows
    assert sum((p["from_ring"] for p in plan), []) == batch.ring_partner_rows
    parks = {k: v for p in plan for k, v in p["parks"].items()}
    assert parks == batch.parked_ring_rows(2)
    # Pairs of rows: request 0 (rows 0..5, pos 3..8) three, its groups at rows 0, 2, 4; request 1
    # (rows 6..20, pos 0..14) eight, the last (row 20, pos 14, alone) without a group; request 2
    # (rows 21..32, pos 9..20) six, groups at rows 21, 23, .., 31. 17 pairs: blocks of 8 pairs.
    pairs = batch.plan(2).pairs
    assert len(pairs) == 17 and pairs[:4] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert pairs[10] == range(20, 21) and pairs[11] == range(21, 23)  # request 1's last row, alone
    assert plan[0]["lanes"] == [0, 2, 4, 7, 9, 11, 13, 15] + [None] * 8
    assert plan[1]["lanes"] == [17, 19, None, 21, 23, 25, 27, 29] + [None] * 8
    assert plan[2]["lanes"] == [31] + [None] * 15
    assert plan[0]["rows"] == range(0, 16) and plan[1]["rows"] == range(16, 30)  # row 21's partner: the ring
    # Block 0 holds the first pairs of requests 0 and 1 and parks them (request 1's last rows, 19
    # and 20, lie in block 1's rows); block 1 holds request 2's first pair and parks it.
    assert plan[0]["parks"] == {1: 4, 0: 5, 5: 19, 4: 20}
    assert plan[1]["parks"] == {9: 31, 8: 32}
    assert plan[2]["parks"] == {} and plan[2]["groups"] == [31]
    assert [p["parked_slots"] for p in plan] == [[0, 1], [2], []]
    wide = program_plan(batch, ring_size=2, groups_per_block=16)  # blocks of 16 groups
    assert [r for p in wide for r in p["lanes"] if r is not None] == batch.group_rows and len(wide) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_program_plan_is_what_the_kernel_does(device):
    """Run the first k blocks only (``grid_rows``): they write exactly the plan's groups and parks."""
    layer, alloc, pools = make_case(device=device)
    batch = build([(0, 3, 7), (2, 0, 15), (4, 9, 12), (5, 1, 1)], alloc, device, extra_slots=1, padding=5)
    projected = random_projected(layer, batch.num_rows, 7)
    plan = program_plan(batch, ring_size=2, D=layer.cfg.D)
    cfg = layer.cfg
    for k in range(len(plan) + 1):
        got, latent = pools.clone(), poisoned_latents(batch, cfg, device)
        compress_fused_op(projected, got.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
                        layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, got.kv_cache, got.index_k,
                        latent, cfg.eps, cfg.ring_size, rows_for_blocks(k, batch.request_slots))
        written = (latent.float() != POISON).any(dim=1).nonzero().flatten().tolist()
        assert written == sorted(r for p in plan[:k] for r in p["groups"])
        parked = (got.ring != pools.ring).any(dim=1).nonzero().flatten().tolist()
        assert parked == sorted(ring for p in plan[:k] for ring in p["parks"])


def test_every_stage_shows_its_source():
    """Each stage's source is readable (notebook 02 prints the kernel's), with the torch step it replaces."""
    table = stages()
    names = [stage.name for stage in table]
    assert len(set(names)) == len(names)
    assert table[-1].kernel is c2.compressor.fused_kernel.compress_fused_kernel
    for stage in table:
        text = source(stage.kernel)
        assert text.startswith("@triton.jit") and f"def {stage.function_name}(" in text, stage.name
        for fn in stage.torch:
            assert fn.__module__ == "c2graph.compressor.torch_path"
            assert f"def {fn.__name__}(" in source(fn)


def test_the_stage_table_holds_every_stage_the_kernel_calls():
    """The table misses no stage: every ``@triton.jit`` function the kernel's body calls is in it."""
    import ast

    called = {n.func.id for n in ast.walk(ast.parse(source(c2.compressor.fused_kernel.compress_fused_kernel)))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    jitted = {name for name in called if name in vars(c2.compressor.fused_rows) or name in vars(c2.compressor.fused_math)}
    assert jitted and jitted <= {stage.function_name for stage in stages()}


def test_minimum_bytes():
    cfg = c2.Config.tiny()
    layer, alloc, pools = make_case(cfg, device="cpu")
    batch = c2.ExtendBatch.build([(0, 3, 6), (2, 0, 5)], alloc, request_slots=3, pad_to=12, device="cpu")
    need = minimum_bytes(cfg, batch)
    groups = 3 + 2  # odd positions 3, 5, 7 and 1, 3
    assert need["read | kv | score |"] == 12 * 64 * 4
    assert need["write kv_cache"] == groups * 32 * 2
    assert need["read ring partners"] == 1 * 64 * 4  # (0, 3, 6) starts odd
    assert need["write ring"] == 4 * 64 * 4


# ------------------------------------------------------------------------------------------------
# launch counts
# ------------------------------------------------------------------------------------------------


def test_launch_counts_on_the_dispatcher():
    layer, alloc, pools = make_case()
    batch = build([(0, 3, 6), (2, 0, 9), (1, 4, 3)], alloc, pools.device, extra_slots=1, padding=4)
    projected = random_projected(layer, batch.num_rows, 3)
    fused_pools, torch_pools = pools.clone(), pools.clone()
    fused_latent, torch_latent = (poisoned_latents(batch, layer.cfg, pools.device) for _ in range(2))
    with count_ops() as fused:
        compress_fused(layer, projected, batch, fused_pools, latent_out=fused_latent, validate=False)
    with count_ops() as checked:
        compress_fused(layer, projected, batch, fused_pools, latent_out=fused_latent)
    with count_ops() as torch_path:
        c2.compress_torch(layer, *c2.split_projected(projected), batch, torch_pools, latent_out=torch_latent)
    print(f"\nlaunches: fused {fused.total}, torch path {torch_path.total}")
    assert dict(fused.counts) == {"c2graph.compress_fused.default": 1}
    # validate=True reads the batch on the host (ExtendBatch.check): on a GPU that is a copy to the
    # host of each of its four row tensors and of the offsets, no kernel
    host_reads = {"aten._to_copy.default": 5} if pools.device.type == "cuda" else {}
    assert dict(checked.counts) == {"c2graph.compress_fused.default": 1, **host_reads}
    assert torch_path.total > 30


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.profiler's CUDA kernel events need CUDA")
def test_cuda_kernel_counts():
    layer, alloc, pools = make_case(device="cuda")
    batch = build([(0, 3, 6), (2, 0, 9), (1, 4, 3)], alloc, "cuda", extra_slots=1, padding=4)
    projected = random_projected(layer, batch.num_rows, 3)  # the projection runs before, not counted
    latent = poisoned_latents(batch, layer.cfg, "cuda")
    fused = count_cuda_kernels(lambda: compress_fused(layer, projected, batch, pools, latent_out=latent))
    torch_path = count_cuda_kernels(
        lambda: c2.compress_torch(layer, *c2.split_projected(projected), batch, pools, latent_out=latent)
    )
    print(f"\nCUDA kernels: fused {fused.total}, torch path {torch_path.total}\n{torch_path.table(10)}")
    assert fused.total == 1, fused.table()
    assert torch_path.total > 30


@pytest.mark.parametrize("field, value, words", [
    ("groups_per_block", 12, "KernelBlocks.groups_per_block = 12; expected a power of two"),
    ("chunk", 48, "KernelBlocks.chunk = 48; expected a power of two"),
    ("block_k", 0, "KernelBlocks.block_k = 0; expected an int >= 1"),
    ("num_warps", 3, "KernelBlocks.num_warps = 3; expected a power of two"),
    ("gate_stages", 0, "KernelBlocks.gate_stages = 0; expected an int >= 1"),
    ("gate_halves", 2, "KernelBlocks.gate_halves = 2; expected True or False"),
])
def test_kernel_blocks_refuse_sizes_the_kernel_cannot_take_in_the_packages_words(field, value, words):
    fields = dict(groups_per_block=16, chunk=16, block_k=32, num_warps=4)
    fields[field] = value
    with pytest.raises(ValueError, match=re.escape(words)):
        KernelBlocks(**fields)
