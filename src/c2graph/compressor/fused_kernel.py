"""The fused kernel: the whole c2 compressor of one extend batch in one Triton launch, stage by stage.

Each ``@triton.jit`` function below is one step of the math, and :data:`STAGES` pairs it with the
torch-path function it replaces (:mod:`c2graph.compressor.torch_path`). The last one,
:func:`fused_compress_kernel`, is the program that runs them.

How the rows are shared out. The grid covers the buffer in *blocks* of ``BLOCK_M`` rows; a
program computes every group that completes in its block (and usually owns one block: a
persistent launch gives a program several). Only a group row (odd ``pos``) stores anything, and
about half the rows are group rows, so a program does not give each row a lane of its tiles:
*lane* ``t`` looks at the pair of rows ``(2t, 2t + 1)`` of the block, and computes the one group
row among them. Inside a request the pair always holds exactly one; where one request ends and
the next begins inside a pair it may hold none, or two. A second pass picks up the second: it
runs only in the blocks where a request boundary made one.

Each pass has two phases, with a barrier between them:

1. pair and gate, RMSNorm, RoPE: the latent of each lane's group, stored in ``latent`` (the
   pre-RoPE latent) and, after RoPE, in the compressed KV cache at the group's c2 slot. Lanes go
   ``SUB_LANES`` at a time: each one loads two rows of ``2 * D`` fp32, which fill registers fast;
2. index key: ``latent @ wk.T`` as one ``tl.dot`` over every lane of the block (one read of
   ``wk`` per block), then RMSNorm and RoPE, stored in the index-K cache. The latent rows are read
   back from ``latent``, where phase 1 just stored them (the barrier makes them visible).

Then the program parks, in the ring, the last rows of the requests whose first row is in its
block.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import triton
import triton.language as tl

from . import torch_path
from .triton_compat import cos, dot, sin, to_bf16

NO_ROW = tl.constexpr(2**62)
"""The first row given to the padding lanes of the request-slot table: past every row."""


# --------------------------------------------------------------------------------------------
# Rows: which request each row belongs to, which rows complete a group, which lane computes it
# --------------------------------------------------------------------------------------------


@triton.jit
def request_slot_table(offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """Every request slot's first row and end (one past its last row): two ``[S_PAD]`` int64.

    Read from the extend offsets (``[2, request_slots]`` int32: first rows, then row counts),
    a tensor refreshed before every replay. Lanes past ``request_slots`` start after every row.
    Read again wherever it is needed (a few cached bytes), rather than held in registers.
    """
    s = tl.arange(0, S_PAD)
    real = s < request_slots
    starts = tl.load(offsets_ptr + s, mask=real, other=0).to(tl.int64)
    counts = tl.load(offsets_ptr + request_slots + s, mask=real, other=0).to(tl.int64)
    return tl.where(real, starts, NO_ROW), tl.where(real, starts + counts, 0)


@triton.jit
def request_of_rows(rows, offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """For each row (``[N]`` int64): the first row of its request, and whether it is live.

    Requests are disjoint and in order, so a row's request is the last one starting at or before
    it, and the row is live if that request ends after it. Padding rows lie in no request. Only
    the offsets decide where one request stops and the next begins: ``pos`` and ``req`` are not
    compared.
    """
    starts, ends = request_slot_table(offsets_ptr, request_slots, S_PAD)
    at_or_before = starts[None, :] <= rows[:, None]  # [N, S_PAD]
    start = tl.max(tl.where(at_or_before, starts[None, :], -1), axis=1)
    end = tl.max(tl.where(at_or_before, ends[None, :], -1), axis=1)
    return start, rows < end


@triton.jit
def group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD: tl.constexpr):
    """Which of ``rows`` (``[N]`` int64) complete a group, and which are their request's first row.

    A group completes at a live row of odd ``pos``. ``raw_out_loc == 0`` marks a padding row: it
    never stores, even if the offsets claimed it. Rows past the buffer load nothing.
    """
    start, live = request_of_rows(rows, offsets_ptr, request_slots, S_PAD)
    in_buffer = rows < num_rows
    pos = tl.load(pos_ptr + rows, mask=in_buffer, other=0)
    raw = tl.load(raw_ptr + rows, mask=in_buffer, other=0)
    return in_buffer & live & (pos % 2 == 1) & (raw != 0), rows == start


@triton.jit
def lane_rows(block_lo, lanes, parity, STRIDE: tl.constexpr):
    """The row each lane looks at in one pass over a block: ``block_lo + STRIDE * lane + parity``.

    ``STRIDE`` is 1 for a block of 16 rows (one pass, a lane a row: ``tl.dot`` needs 16 lanes) and
    2 for larger blocks (a pass over the even rows, ``parity`` 0, and one over the odd rows).
    """
    return block_lo + STRIDE * lanes.to(tl.int64) + parity


# --------------------------------------------------------------------------------------------
# The math of one group, for a tile of lanes
# --------------------------------------------------------------------------------------------


@triton.jit
def pair_and_gate(projected_ptr, ring_ptr, pos_ptr, req_ptr, rows, group, first, num_rows,
                  D: tl.constexpr, RING: tl.constexpr):
    """Each lane's group pooled: ``[N, D]`` fp32, ``(kv_prev * e_prev + kv * e) / (e_prev + e)``.

    ``(e_prev, e)`` are the per-channel softmax weights of the partner's score and the row's.
    The partner is the previous row of the buffer, except for the first row of a request (a
    chunk that starts at an odd position): its partner is the ring row an earlier chunk parked.
    """
    cols = tl.arange(0, D)
    in_buffer = rows < num_rows
    pos = tl.load(pos_ptr + rows, mask=in_buffer, other=1)
    req = tl.load(req_ptr + rows, mask=in_buffer, other=0)
    cur = projected_ptr + rows * (2 * D)  # | kv | score | of the group row
    ring_row = ring_ptr + (req * RING + (pos - 1) % RING) * (2 * D)
    prev = tl.where(first, ring_row, cur - 2 * D)  # | kv | score | of its partner
    # Lanes without a group load nothing; each partner row is read once, by its group row's lane.
    m = group[:, None]
    kv = tl.load(cur[:, None] + cols[None, :], mask=m, other=0.0)
    score = tl.load(cur[:, None] + D + cols[None, :], mask=m, other=0.0)
    kv_prev = tl.load(prev[:, None] + cols[None, :], mask=m, other=0.0)
    score_prev = tl.load(prev[:, None] + D + cols[None, :], mask=m, other=0.0)
    top = tl.maximum(score_prev, score)  # softmax of two: subtract the larger, exp, normalise
    e_prev = tl.exp(score_prev - top)
    e = tl.exp(score - top)
    return (kv_prev * e_prev + kv * e) / (e_prev + e)


@triton.jit
def rms_norm(x, weight_ptr, eps, WIDTH: tl.constexpr):
    """``x`` (``[N, WIDTH]`` fp32) rounded to bf16, then ``x * rsqrt(mean(x**2) + eps) * weight``.

    Computed in fp32 and rounded to bf16; returned as fp32 (every value a bf16).
    """
    x = to_bf16(x).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / WIDTH + eps)
    weight = tl.load(weight_ptr + tl.arange(0, WIDTH)).to(tl.float32)
    return to_bf16(x * inv_rms[:, None] * weight[None, :]).to(tl.float32)


@triton.jit
def rope(src, dst, group_pos, group, inv_freq_ptr, WIDTH: tl.constexpr, ROPE: tl.constexpr):
    """RoPE on the last ``ROPE`` dims of bf16 rows of ``WIDTH``: read from ``src``, turned, written to ``dst``.

    ``src``, ``dst``: ``[N]`` pointers to each lane's row (they may be the same rows). With
    ``b = WIDTH - ROPE``, pair ``(b + 2i, b + 2i + 1)`` turns by ``group_pos * inv_freq[i]``, in
    fp32, rounded to bf16. The pairs' two halves are read as two tiles, even and odd columns.
    """
    i = tl.arange(0, ROPE // 2)
    even = (WIDTH - ROPE + 2 * i)[None, :]
    m = group[:, None]  # lanes without a group read and write nothing
    x_even = tl.load(src[:, None] + even, mask=m, other=0.0).to(tl.float32)
    x_odd = tl.load(src[:, None] + even + 1, mask=m, other=0.0).to(tl.float32)
    angle = group_pos[:, None] * tl.load(inv_freq_ptr + i)[None, :]  # [N, ROPE // 2] fp32
    c = cos(angle)
    s = sin(angle)
    tl.debug_barrier()  # where src is dst, every thread reads its pairs before any is overwritten
    tl.store(dst[:, None] + even, to_bf16(x_even * c - x_odd * s), mask=m)
    tl.store(dst[:, None] + even + 1, to_bf16(x_even * s + x_odd * c), mask=m)


@triton.jit
def index_key(latent_ptr, wk_ptr, rows, group, D: tl.constexpr, I: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """``k = latent @ wk.T`` for each lane's group: ``[N, I]`` fp32 (bf16 operands, fp32 sums).

    The latent rows are read back from ``latent`` (``[T, D]`` bf16), ``BLOCK_K`` columns at a
    time, with the same columns of ``wk`` (``[I, D]`` bf16), so the whole of ``wk`` is read once
    for all the lanes. Lanes without a group multiply zeros.
    """
    j = tl.arange(0, I)
    acc = tl.zeros((rows.shape[0], I), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(latent_ptr + rows[:, None] * D + kk[None, :], mask=group[:, None], other=0.0)
        w = tl.load(wk_ptr + j[None, :] * D + kk[:, None])  # [BLOCK_K, I]: column j of k is row j of wk
        acc = dot(a, w, acc)
    return acc


# --------------------------------------------------------------------------------------------
# The two phases of a pass, and the park
# --------------------------------------------------------------------------------------------


@triton.jit
def latent_and_kv_cache(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, norm_w_ptr, kv_cache_ptr,
                        latent_ptr, rows, offsets_ptr, request_slots, num_rows, eps,
                        D: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr, S_PAD: tl.constexpr):
    """Phase 1 for a tile of lanes: the pre-RoPE latent of each lane's group, stored twice.

    Pair and gate, RMSNorm: stored in ``latent`` at the group row, and its first ``D - ROPE``
    dims (RoPE leaves them alone) in the compressed KV cache at the c2 slot ``raw_out_loc // 2``.
    Lanes whose row completes no group store nothing.
    """
    group, first = group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
    pooled = pair_and_gate(projected_ptr, ring_ptr, pos_ptr, req_ptr, rows, group, first, num_rows, D, RING)
    latent = rms_norm(pooled, norm_w_ptr, eps, D).to(tl.bfloat16)
    c2_slot = tl.load(raw_ptr + rows, mask=rows < num_rows, other=0) // 2
    cols = tl.arange(0, D)
    m = group[:, None]
    tl.store(latent_ptr + rows[:, None] * D + cols[None, :], latent, mask=m)
    tl.store(kv_cache_ptr + c2_slot[:, None] * D + cols[None, :], latent, mask=m & (cols < D - ROPE)[None, :])


@triton.jit
def index_key_and_rope(latent_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, pos_ptr, raw_ptr, kv_cache_ptr,
                       index_k_ptr, rows, offsets_ptr, request_slots, num_rows, eps,
                       D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr, BLOCK_K: tl.constexpr,
                       S_PAD: tl.constexpr):
    """Phase 2 for every lane of the block: the index key, and RoPE on both caches' last dims.

    ``latent @ wk.T`` rounded to bf16, RMSNorm with ``k_norm_w``: stored in the index-K cache at
    the c2 slot. Then RoPE at the group position ``pos - 1`` turns the latent's last dims into the
    KV cache, and the key's last dims in place. Lanes whose row completes no group store nothing.
    """
    group, _ = group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
    k = rms_norm(index_key(latent_ptr, wk_ptr, rows, group, D, I, BLOCK_K), k_norm_w_ptr, eps, I)
    c2_slot = tl.load(raw_ptr + rows, mask=rows < num_rows, other=0) // 2
    j = tl.arange(0, I)
    tl.store(index_k_ptr + c2_slot[:, None] * I + j[None, :], k.to(tl.bfloat16), mask=group[:, None])
    tl.debug_barrier()  # the key's rows, stored by other threads, are read back by RoPE
    group_pos = (tl.load(pos_ptr + rows, mask=rows < num_rows, other=1) - 1).to(tl.float32)
    rope(latent_ptr + rows * D, kv_cache_ptr + c2_slot * D, group_pos, group, inv_freq_ptr, D, ROPE)
    rope(index_k_ptr + c2_slot * I, index_k_ptr + c2_slot * I, group_pos, group, inv_freq_ptr, I, ROPE)


@triton.jit
def park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, request_slots,
                 block_lo, num_rows, D: tl.constexpr, RING: tl.constexpr, RING_PAD: tl.constexpr,
                 BLOCK_M: tl.constexpr, S_PAD: tl.constexpr):
    """Park each request's last ``min(count, RING)`` rows at ring row ``req * RING + pos % RING``.

    A block parks the requests whose FIRST row is in it. Only a request's first row reads that
    request's ring rows, and this program read them in phase 1, before the barrier: no program
    can race with these writes. Starts never decrease, so those requests are the request slots
    ``[lo, hi)``: a loop with run-time bounds.
    """
    starts, _ = request_slot_table(offsets_ptr, request_slots, S_PAD)
    lo = tl.sum((starts < block_lo).to(tl.int32), axis=0)
    hi = tl.sum((starts < block_lo + BLOCK_M).to(tl.int32), axis=0)
    j = tl.arange(0, RING_PAD)
    both = tl.arange(0, 2 * D)  # | kv | score |
    for r in range(lo, hi):
        start = tl.load(offsets_ptr + r).to(tl.int64)
        count = tl.load(offsets_ptr + request_slots + r).to(tl.int64)
        n_park = tl.minimum(count, RING)
        src = start + count - n_park + j  # the request's last rows
        ok = (j < n_park) & (src < num_rows)
        pos = tl.load(pos_ptr + src, mask=ok, other=0)
        req = tl.load(req_ptr + src, mask=ok, other=0)
        ok = ok & (tl.load(raw_ptr + src, mask=ok, other=0) != 0)  # a padding row parks nothing
        dst = req * RING + pos % RING
        rows = tl.load(projected_ptr + src[:, None] * (2 * D) + both[None, :], mask=ok[:, None])
        tl.store(ring_ptr + dst[:, None] * (2 * D) + both[None, :], rows, mask=ok[:, None])


# --------------------------------------------------------------------------------------------
# The kernel: one program, every stage
# --------------------------------------------------------------------------------------------


@triton.jit
def fused_compress_kernel(
    projected_ptr,  # [T, 2D] fp32  | kv | score |
    ring_ptr,  # [pool_requests * RING + 1, 2D] fp32
    pos_ptr, req_ptr, raw_ptr,  # [T] int64 each; raw_out_loc == 0 marks a padding row
    offsets_ptr,  # [2, request_slots] int32: the extend offsets
    norm_w_ptr, wk_ptr, k_norm_w_ptr,  # [D], [I, D], [I] bf16
    inv_freq_ptr,  # [ROPE // 2] fp32
    kv_cache_ptr, index_k_ptr,  # [kv_slots, D], [kv_slots, I] bf16
    latent_ptr,  # [T, D] bf16: the pre-RoPE latents
    num_rows, request_slots, num_blocks, eps,
    D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr,
    BLOCK_M: tl.constexpr, LANES: tl.constexpr, STRIDE: tl.constexpr, SUB_LANES: tl.constexpr,
    BLOCK_K: tl.constexpr,
    S_PAD: tl.constexpr, RING_PAD: tl.constexpr,
):
    # The grid depends only on static sizes (the buffer's blocks, the SMs): the extend offsets,
    # read here from a tensor, decide which lanes do any work. A graph can capture this launch.
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        block_lo = block * BLOCK_M
        # A pass over the block's even rows, then one over its odd rows; a pass is skipped where
        # no row of its parity completes a group (inside one request, every other row does).
        block_rows = block_lo + tl.arange(0, BLOCK_M)
        completes, _ = group_rows(block_rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
        has_even = tl.max((completes & (block_rows % STRIDE == 0)).to(tl.int32), axis=0)
        has_odd = tl.max((completes & (block_rows % STRIDE == 1)).to(tl.int32), axis=0)  # 0 if STRIDE is 1
        for parity in range(1 - has_even, 1 + has_odd):
            # Phase 1, SUB_LANES lanes at a time (each lane loads two rows of 2D fp32).
            for lane0 in range(0, LANES, SUB_LANES):
                sub_rows = lane_rows(block_lo, lane0 + tl.arange(0, SUB_LANES), parity, STRIDE)
                latent_and_kv_cache(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, norm_w_ptr,
                                    kv_cache_ptr, latent_ptr, sub_rows, offsets_ptr,
                                    request_slots, num_rows, eps, D, ROPE, RING, S_PAD)
            # Phase 2 reads the latent rows other threads stored; the barrier makes them visible.
            tl.debug_barrier()
            rows = lane_rows(block_lo, tl.arange(0, LANES), parity, STRIDE)
            index_key_and_rope(latent_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, pos_ptr, raw_ptr, kv_cache_ptr,
                               index_k_ptr, rows, offsets_ptr, request_slots, num_rows, eps,
                               D, I, ROPE, BLOCK_K, S_PAD)
        park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, request_slots, block_lo,
                     num_rows, D, RING, RING_PAD, BLOCK_M, S_PAD)


# --------------------------------------------------------------------------------------------
# The stages, beside the torch-path steps they replace (for notebook 02)
# --------------------------------------------------------------------------------------------


class Stage(NamedTuple):
    """One stage of the kernel: its name, its ``@triton.jit`` function, the torch-path function(s) it
    replaces (none where the torch path has no such step: it gives every row a lane)."""

    name: str
    kernel: object
    torch: tuple


STAGES: tuple[Stage, ...] = (
    Stage("request slot of each row", request_of_rows, (torch_path.previous_row_is_partner,)),
    Stage("group rows and ring partners", group_rows, (torch_path.ring_read_rows,)),
    Stage("rows of a pass", lane_rows, ()),
    Stage("pair and gate", pair_and_gate, (torch_path.pair_partners, torch_path.gate)),
    Stage("RMSNorm", rms_norm, (torch_path.finish, torch_path.rms_norm)),
    Stage("phase 1: the latent", latent_and_kv_cache, (torch_path.compress_torch,)),
    Stage("index key", index_key, (torch_path.index_key,)),
    Stage("RoPE", rope, (torch_path.rope,)),
    Stage("phase 2: index key and RoPE", index_key_and_rope, (torch_path.index_key,)),
    Stage("park", park_in_ring, (torch_path.park_mask, torch_path.park)),
    Stage("one program", fused_compress_kernel, (torch_path.compress_torch,)),
)
"""Every stage of :func:`fused_compress_kernel`, in the order the math runs them."""


def source(fn) -> str:
    """The Python source of a ``@triton.jit`` function (or of a plain one)."""
    return inspect.getsource(getattr(fn, "fn", fn))
