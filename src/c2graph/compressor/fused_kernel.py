"""The fused kernel: the whole c2 compressor of one extend batch in one Triton launch, stage by stage.

Each stage is one ``@triton.jit`` function: the row stages (which row each lane computes, where it
stores, the park) in :mod:`~c2graph.compressor.fused_rows`, the math stages in
:mod:`~c2graph.compressor.fused_math`; :func:`compress_fused_kernel`, here, is the program that
runs them. Compiled, they are all inlined into it: one launch.

How the work is shared out. Only a group row (odd ``pos``) stores anything, so the kernel gives a
lane to each *group*, not to each row, and finds a request's groups from its rows alone: its
*pairs* of rows 0 and 1, 2 and 3, and so on. Two consecutive positions hold exactly one odd one,
so a pair holds at most one group row (exactly one, but for a request's last row left alone at an
even position). The batch's groups are numbered pair by pair in row order, and the grid covers
them in *blocks* of ``GROUPS_PER_BLOCK``, one program a block (a persistent launch gives a
program several, in turn): lane ``t`` of block ``b`` takes group ``b * GROUPS_PER_BLOCK + t``,
found from the extend offsets alone, and computes its row at an odd position. So every lane of a
full block is busy, whichever requests and row parities its groups lie in. The tiles have
``LANES`` rows, at least 16 (``tl.dot``'s smallest tile): a block of 8 groups leaves half of them
idle.

A block makes two sweeps over the columns of its lanes' groups, with a barrier between them:

A. the gate, ``CHUNK`` columns at a time (as two tiles of half as many columns where a block's
   warps are few: the same bits): each lane's two rows are read once, the pooled row rounded to
   bf16 and stored in ``latent`` (not yet normalised: RMSNorm needs the sum of squares of the
   whole row first), the sum of squares accumulated;
B. ``BLOCK_K`` columns at a time: the gated row read back from ``latent`` (the barrier makes the
   other threads' stores visible), normalised, stored over itself and, turned by RoPE where the
   chunk holds rope dims, in the KV cache, and multiplied into the index key, ``latent @ wk.T``
   (one read of ``wk`` a block). Then the index key's RMSNorm and RoPE, and its store.

Each sweep holds one chunk of columns at a time, so a program needs few registers and many fit on
an SM: while one waits for memory, the others compute.

Then the program parks, in the ring, the last rows of the requests whose first pair is one of
its block's.

What a program knows about its rows it finds once: the pair table from the extend offsets, at
the start (the same for every block), then each lane's row, ``pos``, ``req``, ``raw_out_loc``
and whether its partner is in the ring, in :func:`~c2graph.compressor.fused_rows.lane_rows`.
Every store is masked by the real extents of the caches and the ring, whatever the batch's
tensors hold: a launch never writes outside a tensor.
"""

from __future__ import annotations

import inspect
import sys

import triton
import triton.language as tl

from .._runtime import INTERPRET
from . import fused_math, fused_rows
from .fused_math import gate_and_sum_squares, index_key_to_cache, index_key_weights, latent_and_index_key, partners
from .fused_rows import lane_rows, pair_table, park_in_ring, stores_group

if INTERPRET:
    from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def compress_fused_kernel(
    projected_ptr,  # [T, 2D] fp32  | kv | score |
    ring_ptr,  # [ring_rows, 2D] fp32: pool_requests * RING rows, then the sentinel
    pos_ptr, req_ptr, raw_ptr,  # [T] int64 each; raw_out_loc == 0 marks a padding row
    offsets_ptr,  # [2, request_slots] int32: the extend offsets
    norm_w_ptr, wk_ptr, k_norm_w_ptr,  # [D], [I, D], [I] bf16
    inv_freq_ptr,  # [ROPE // 2] fp32
    kv_cache_ptr, index_k_ptr,  # [kv_slots, D], [kv_slots, I] bf16
    latent_ptr,  # [T, D] bf16: the pre-RoPE latents
    num_rows, request_slots, num_blocks, kv_slots, ring_rows, eps,
    D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, GATE_HALVES: tl.constexpr, S_PAD: tl.constexpr,
    RING_PAD: tl.constexpr,
):
    # The grid depends only on static sizes (the buffer's rows, the request slots, the SMs): the
    # extend offsets, read here from a tensor, decide which group each lane computes. A graph can
    # capture this launch. The pair table is the same for every block, and so are the index key's
    # weights: read once a program, at its start, so that no later step waits for them.
    starts, ends, pairs, first_pair = pair_table(offsets_ptr, request_slots, S_PAD)
    k_norm, key_freq = index_key_weights(k_norm_w_ptr, inv_freq_ptr, I, ROPE)
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        rows, pos, req, raw, from_ring = lane_rows(block, starts, ends, pairs, first_pair, pos_ptr, req_ptr,
                                                   raw_ptr, num_rows, LANES, GROUPS_PER_BLOCK)
        group = stores_group(rows, pos, req, raw, from_ring, num_rows, kv_slots, ring_rows, RING)
        if tl.max(group.to(tl.int32), axis=0) != 0:  # a block past the batch's last group skips the passes
            cur, prev = partners(projected_ptr, ring_ptr, rows, pos, req, from_ring, D, RING)
            cache_slot = raw // 2  # the group's c2 slot
            group_pos = (pos - 1).to(tl.float32)
            # Pass A: gate, and the sum of squares the RMSNorm needs before it can scale any column.
            sum_sq = gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D, CHUNK, LOG2_CHUNK, GATE_STAGES,
                                          GATE_HALVES)
            inv_rms = tl.rsqrt(sum_sq / D + eps)
            # Pass B reads the gated rows other threads stored; the barrier makes them visible.
            tl.debug_barrier()
            k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                     cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
            index_key_to_cache(k, group, cache_slot, group_pos, k_norm, key_freq, index_k_ptr, eps, I)
        park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, starts, ends, first_pair, block,
                     num_rows, ring_rows, D, RING, RING_PAD, GROUPS_PER_BLOCK, S_PAD)


def source(fn) -> str:
    """The Python source of a ``@triton.jit`` function (or of a plain one)."""
    return inspect.getsource(getattr(fn, "fn", fn))


if INTERPRET:
    # Triton's interpreter re-patches triton.language at every call of a @triton.jit function (about
    # a millisecond, dozens of calls a program): the interpreted kernel calls the stages' Python
    # functions instead, the same code. Compiled, every stage is inlined into the one kernel anyway.
    for _module in (fused_rows, fused_math, sys.modules[__name__]):
        for _name, _value in list(vars(_module).items()):
            if isinstance(_value, InterpretedFunction) and _value is not compress_fused_kernel:
                setattr(_module, _name, _value.fn)
