"""The fused kernel: the whole c2 compressor of one extend batch in one Triton launch, stage by stage.

Each ``@triton.jit`` function below is one step of the math, and :data:`STAGES` pairs it with the
torch-path function it replaces (:mod:`c2graph.compressor.torch_path`). The last one,
:func:`fused_compress_kernel`, is the program that runs them; compiled, they are all inlined
into it: one launch.

How the rows are shared out. The grid covers the buffer in *blocks* of ``BLOCK_M`` rows, one
program a block (a persistent launch gives a program several, in turn). Only a group row (odd
``pos``) stores anything, and inside a request every other row is one, so a block of more than
16 rows is computed in two *passes*: its even rows, then its odd rows, ``LANES = BLOCK_M // 2``
rows a pass, one a lane; a pass whose rows complete no group is skipped, so a block inside one
request runs one pass, every lane busy. A block of 16 rows (``tl.dot``'s smallest tile) runs one
pass over all its rows.

A pass has two phases, with a barrier between them:

1. partners, gate, RMSNorm, RoPE: the latent of each lane's group, stored in ``latent`` (the
   pre-RoPE latent) and, turned by RoPE, in the compressed KV cache at the group's c2 slot.
   Lanes go ``SUB_LANES`` at a time: each loads two rows of ``2 * D`` fp32, which fill registers;
2. the index key: ``latent @ wk.T`` over every lane of the pass (one read of ``wk`` a pass), then
   RMSNorm and RoPE, stored in the index-K cache. The latent rows are read back from ``latent``,
   where phase 1 just stored them (the barrier makes them visible).

Then the program parks, in the ring, the last rows of the requests whose first row is in its
block.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import triton
import triton.language as tl

from .._runtime import INTERPRET
from . import torch_path
from .triton_compat import cos, dot, sin, to_bf16

if INTERPRET:
    from triton.runtime.interpreter import InterpretedFunction

NO_ROW = tl.constexpr(2**62)
"""The first row given to the padding lanes of the request-slot table: past every row."""


# --------------------------------------------------------------------------------------------
# Rows: which rows lie in a request, which complete a group, which row a lane computes
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
def live_rows(rows, offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """``[N]`` bool: each row (``[N]`` int64) lies inside a request; padding rows lie in none.

    Only the offsets decide where one request stops and the next begins: ``pos`` and ``req`` are
    not compared.
    """
    starts, ends = request_slot_table(offsets_ptr, request_slots, S_PAD)
    inside = (starts[None, :] <= rows[:, None]) & (rows[:, None] < ends[None, :])  # [N, S_PAD]
    return tl.max(inside.to(tl.int32), axis=1) != 0


@triton.jit
def first_rows(rows, offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """``[N]`` bool: each row is the first row of a request (whose partner may be in the ring)."""
    starts, ends = request_slot_table(offsets_ptr, request_slots, S_PAD)
    first = (starts[None, :] == rows[:, None]) & (rows[:, None] < ends[None, :])  # [N, S_PAD]
    return tl.max(first.to(tl.int32), axis=1) != 0


@triton.jit
def group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD: tl.constexpr):
    """``[N]`` bool: each row (``[N]`` int64) completes a group.

    A group completes at a live row of odd ``pos``. ``raw_out_loc == 0`` marks a padding row: it
    never stores, even if the offsets claimed it. Rows past the buffer load nothing.
    """
    in_buffer = rows < num_rows
    pos = tl.load(pos_ptr + rows, mask=in_buffer, other=0)
    raw = tl.load(raw_ptr + rows, mask=in_buffer, other=0)
    live = live_rows(rows, offsets_ptr, request_slots, S_PAD)
    return in_buffer & live & (pos % 2 == 1) & (raw != 0)


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
def partners(projected_ptr, ring_ptr, pos_ptr, req_ptr, rows, offsets_ptr, request_slots, num_rows,
             D: tl.constexpr, RING: tl.constexpr, S_PAD: tl.constexpr):
    """``[N]`` pointers to the ``| kv | score |`` row of each lane's group row, and of its partner.

    The partner is the previous row of the buffer, except for the first row of a request (a
    chunk that starts at an odd position): its partner is the ring row an earlier chunk parked,
    ``req * RING + (pos - 1) % RING``.
    """
    in_buffer = rows < num_rows
    pos = tl.load(pos_ptr + rows, mask=in_buffer, other=1)
    req = tl.load(req_ptr + rows, mask=in_buffer, other=0)
    cur = projected_ptr + rows * (2 * D)
    ring_row = ring_ptr + (req * RING + (pos - 1) % RING) * (2 * D)
    first = first_rows(rows, offsets_ptr, request_slots, S_PAD)
    return cur, tl.where(first, ring_row, cur - 2 * D)


@triton.jit
def gate(cur, prev, group, cols, D: tl.constexpr):
    """Each lane's group pooled at ``cols``: ``[N, C]`` fp32, ``(kv_prev * e_prev + kv * e) / (e_prev + e)``.

    ``(e_prev, e)`` are the per-channel softmax weights of the partner's score and the row's.
    Lanes without a group load nothing: each buffer row is read once, by its group's lane.
    """
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
def rms_norm(x, inv_rms, weight_ptr, cols, valid):
    """``x * inv_rms * weight[cols]`` in fp32, rounded to bf16 (returned as fp32): one RMSNorm tile.

    ``x``: ``[N, C]`` fp32 holding bf16 values; ``inv_rms``: ``[N]``, ``rsqrt(mean(x**2) + eps)``
    over the whole row (the caller sums the squares of every tile of the row). Columns that are not
    ``valid`` (padding) come out zero.
    """
    weight = tl.load(weight_ptr + cols, mask=valid, other=0.0).to(tl.float32)
    return to_bf16(x * inv_rms[:, None] * weight[None, :]).to(tl.float32)


@triton.jit
def rope(x_even, x_odd, group_pos, inv_freq_ptr, i, valid):
    """Turn each pair ``(x_even[:, i], x_odd[:, i])`` by the angle ``group_pos * inv_freq[i]``, in fp32.

    ``x_even``, ``x_odd``: ``[N, H]`` fp32, the even and odd dims of the last ``2H`` dims of a row;
    ``group_pos``: ``[N]`` fp32. Returns the turned pair, rounded to bf16.
    """
    angle = group_pos[:, None] * tl.load(inv_freq_ptr + i, mask=valid, other=0.0)[None, :]
    c = cos(angle)
    s = sin(angle)
    return to_bf16(x_even * c - x_odd * s), to_bf16(x_even * s + x_odd * c)


@triton.jit
def index_key(latent_ptr, wk_ptr, rows, group, D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr,
              BLOCK_K: tl.constexpr, NOPE_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    """``k = latent @ wk.T`` for each lane's group, bf16 operands, fp32 sums, as three tiles.

    The un-rotated dims ``[0, I - ROPE)`` (``[N, NOPE_PAD]``), and RoPE's even and odd dims
    (``[N, HALF_PAD]`` each): a product per tile, with the rows of ``wk`` that give its dims (padding
    dims, up to ``tl.dot``'s 16, get zero weights). The latent rows are read back from ``latent``,
    ``BLOCK_K`` columns at a time; ``wk`` is read once for all the lanes.
    """
    jn = tl.arange(0, NOPE_PAD)
    jh = tl.arange(0, HALF_PAD)
    n_ok = (jn < I - ROPE)[None, :]
    h_ok = (jh < ROPE // 2)[None, :]
    acc_n = tl.full((rows.shape[0], NOPE_PAD), 0.0, tl.float32)
    acc_e = tl.full((rows.shape[0], HALF_PAD), 0.0, tl.float32)
    acc_o = tl.full((rows.shape[0], HALF_PAD), 0.0, tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = (k0 + tl.arange(0, BLOCK_K))[:, None]
        a = tl.load(latent_ptr + rows[:, None] * D + kk.T, mask=group[:, None], other=0.0)
        # [BLOCK_K, dims] tiles of wk.T: column j of k is row j of wk
        acc_n = dot(a, tl.load(wk_ptr + jn[None, :] * D + kk, mask=n_ok, other=0.0), acc_n)
        acc_e = dot(a, tl.load(wk_ptr + (I - ROPE + 2 * jh)[None, :] * D + kk, mask=h_ok, other=0.0), acc_e)
        acc_o = dot(a, tl.load(wk_ptr + (I - ROPE + 1 + 2 * jh)[None, :] * D + kk, mask=h_ok, other=0.0), acc_o)
    return acc_n, acc_e, acc_o


# --------------------------------------------------------------------------------------------
# The two phases of a pass, and the park
# --------------------------------------------------------------------------------------------


@triton.jit
def latent_and_kv_cache(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, norm_w_ptr, inv_freq_ptr,
                        kv_cache_ptr, latent_ptr, rows, offsets_ptr, request_slots, num_rows, eps,
                        D: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr, S_PAD: tl.constexpr):
    """Phase 1 for a tile of lanes: the latent of each lane's group, in ``latent`` and the KV cache.

    Partners, gate, RMSNorm: the pre-RoPE latent, stored in ``latent`` at the group row and, but
    for its last ``ROPE`` dims, in the KV cache at the c2 slot ``raw_out_loc // 2``. RoPE turns
    pairs of those last dims, so they are gated and normalised once more as two tiles, the even
    dims and the odd dims (the same values: the rows were just read, the L1 holds them), turned,
    and stored at the c2 slot.
    """
    group = group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
    cur, prev = partners(projected_ptr, ring_ptr, pos_ptr, req_ptr, rows, offsets_ptr, request_slots, num_rows,
                         D, RING, S_PAD)
    cols = tl.arange(0, D)
    x = to_bf16(gate(cur, prev, group, cols, D)).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    latent = rms_norm(x, inv_rms, norm_w_ptr, cols, cols < D).to(tl.bfloat16)
    i = tl.arange(0, ROPE // 2)
    even = D - ROPE + 2 * i
    rope_dims = i < ROPE // 2  # every one: the tiles are exactly the rope dims
    x_even = to_bf16(gate(cur, prev, group, even, D)).to(tl.float32)
    x_even = rms_norm(x_even, inv_rms, norm_w_ptr, even, rope_dims)
    x_odd = to_bf16(gate(cur, prev, group, even + 1, D)).to(tl.float32)
    x_odd = rms_norm(x_odd, inv_rms, norm_w_ptr, even + 1, rope_dims)
    in_buffer = rows < num_rows
    group_pos = (tl.load(pos_ptr + rows, mask=in_buffer, other=1) - 1).to(tl.float32)
    turned_even, turned_odd = rope(x_even, x_odd, group_pos, inv_freq_ptr, i, rope_dims)
    m = group[:, None]
    tl.store(latent_ptr + rows[:, None] * D + cols[None, :], latent, mask=m)
    cache_row = kv_cache_ptr + (tl.load(raw_ptr + rows, mask=in_buffer, other=0) // 2)[:, None] * D
    tl.store(cache_row + cols[None, :], latent, mask=m & (cols < D - ROPE)[None, :])
    tl.store(cache_row + even[None, :], turned_even, mask=m)
    tl.store(cache_row + even[None, :] + 1, turned_odd, mask=m)


@triton.jit
def index_key_and_cache(latent_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, pos_ptr, raw_ptr, index_k_ptr,
                        rows, offsets_ptr, request_slots, num_rows, eps, D: tl.constexpr, I: tl.constexpr,
                        ROPE: tl.constexpr, BLOCK_K: tl.constexpr, NOPE_PAD: tl.constexpr,
                        HALF_PAD: tl.constexpr, S_PAD: tl.constexpr):
    """Phase 2 for every lane of the block: the index key, stored in the index-K cache.

    ``latent @ wk.T`` (three tiles) rounded to bf16, RMSNorm with ``k_norm_w`` over all three,
    RoPE on the even and odd tiles, stored at the c2 slot. Lanes without a group store nothing.
    """
    group = group_rows(rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
    k_n, k_e, k_o = index_key(latent_ptr, wk_ptr, rows, group, D, I, ROPE, BLOCK_K, NOPE_PAD, HALF_PAD)
    k_n = to_bf16(k_n).to(tl.float32)
    k_e = to_bf16(k_e).to(tl.float32)
    k_o = to_bf16(k_o).to(tl.float32)
    sum_sq = tl.sum(k_n * k_n, axis=1) + tl.sum(k_e * k_e, axis=1) + tl.sum(k_o * k_o, axis=1)  # padding: zeros
    inv_rms = tl.rsqrt(sum_sq / I + eps)
    jn = tl.arange(0, NOPE_PAD)
    i = tl.arange(0, HALF_PAD)
    even = I - ROPE + 2 * i
    in_buffer = rows < num_rows
    group_pos = (tl.load(pos_ptr + rows, mask=in_buffer, other=1) - 1).to(tl.float32)
    turned_e, turned_o = rope(rms_norm(k_e, inv_rms, k_norm_w_ptr, even, i < ROPE // 2),
                              rms_norm(k_o, inv_rms, k_norm_w_ptr, even + 1, i < ROPE // 2),
                              group_pos, inv_freq_ptr, i, i < ROPE // 2)
    key_row = index_k_ptr + (tl.load(raw_ptr + rows, mask=in_buffer, other=0) // 2)[:, None] * I
    m = group[:, None]
    tl.store(key_row + jn[None, :], rms_norm(k_n, inv_rms, k_norm_w_ptr, jn, jn < I - ROPE),
             mask=m & (jn < I - ROPE)[None, :])
    tl.store(key_row + even[None, :], turned_e, mask=m & (i < ROPE // 2)[None, :])
    tl.store(key_row + even[None, :] + 1, turned_o, mask=m & (i < ROPE // 2)[None, :])


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
    NOPE_PAD: tl.constexpr, HALF_PAD: tl.constexpr, S_PAD: tl.constexpr, RING_PAD: tl.constexpr,
):
    # The grid depends only on static sizes (the buffer's blocks, the SMs): the extend offsets,
    # read here from a tensor, decide which lanes do any work. A graph can capture this launch.
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        block_lo = block * BLOCK_M
        # Blocks of 16 rows: one pass, a lane a row. Larger blocks: a pass over their even rows,
        # then one over their odd rows, each skipped where no row of its parity completes a group
        # (inside one request every other row does: one pass is usually enough).
        first_pass, end_pass = 0, 1
        if STRIDE == 2:
            block_rows = block_lo + tl.arange(0, BLOCK_M)
            completes = group_rows(block_rows, offsets_ptr, request_slots, pos_ptr, raw_ptr, num_rows, S_PAD)
            first_pass = 1 - tl.max((completes & (block_rows % 2 == 0)).to(tl.int32), axis=0)
            end_pass = 1 + tl.max((completes & (block_rows % 2 == 1)).to(tl.int32), axis=0)
        for parity in range(first_pass, end_pass):
            # Phase 1, SUB_LANES lanes at a time (each lane loads two rows of 2D fp32).
            for lane0 in range(0, LANES, SUB_LANES):
                sub_rows = lane_rows(block_lo, lane0 + tl.arange(0, SUB_LANES), parity, STRIDE)
                latent_and_kv_cache(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, norm_w_ptr,
                                    inv_freq_ptr, kv_cache_ptr, latent_ptr, sub_rows, offsets_ptr,
                                    request_slots, num_rows, eps, D, ROPE, RING, S_PAD)
            # Phase 2 reads the latent rows other threads stored; the barrier makes them visible.
            tl.debug_barrier()
            rows = lane_rows(block_lo, tl.arange(0, LANES), parity, STRIDE)
            index_key_and_cache(latent_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, pos_ptr, raw_ptr, index_k_ptr,
                                rows, offsets_ptr, request_slots, num_rows, eps, D, I, ROPE, BLOCK_K, NOPE_PAD,
                                HALF_PAD, S_PAD)
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
    Stage("rows inside a request", live_rows, (torch_path.previous_row_is_partner,)),
    Stage("first rows of requests", first_rows, (torch_path.ring_read_rows,)),
    Stage("group rows", group_rows, ()),
    Stage("rows of a pass", lane_rows, ()),
    Stage("partners", partners, (torch_path.pair_partners,)),
    Stage("gate", gate, (torch_path.gate,)),
    Stage("RMSNorm", rms_norm, (torch_path.finish, torch_path.rms_norm)),
    Stage("RoPE", rope, (torch_path.rope,)),
    Stage("phase 1: the latent", latent_and_kv_cache, (torch_path.compress_torch,)),
    Stage("index key", index_key, (torch_path.index_key,)),
    Stage("phase 2: index key and RoPE", index_key_and_cache, (torch_path.index_key,)),
    Stage("park", park_in_ring, (torch_path.park_mask, torch_path.park)),
    Stage("one program", fused_compress_kernel, (torch_path.compress_torch,)),
)
"""Every stage of :func:`fused_compress_kernel`, in the order the math runs them."""


def source(fn) -> str:
    """The Python source of a ``@triton.jit`` function (or of a plain one)."""
    return inspect.getsource(getattr(fn, "fn", fn))


if INTERPRET:
    # Triton's interpreter re-patches triton.language at every call of a @triton.jit function (about
    # a millisecond, dozens of calls a program): the interpreted kernel calls the stages' Python
    # functions instead, the same code. Compiled, every stage is inlined into the one kernel anyway.
    for _name, _value in list(globals().items()):
        if isinstance(_value, InterpretedFunction) and _value is not fused_compress_kernel:
            globals()[_name] = _value.fn
