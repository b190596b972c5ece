"""The fused kernel: the whole c2 compressor of one extend batch in one Triton launch, stage by stage.

Each ``@triton.jit`` function below is one step of the math, and :data:`STAGES` pairs it with the
torch-path function it replaces (:mod:`c2graph.compressor.torch_path`). The last one,
:func:`fused_compress_kernel`, is the program that runs them; compiled, they are all inlined
into it: one launch.

How the work is shared out. Only a group row (odd ``pos``) stores anything, so the kernel gives a
lane to each *pair* of rows, not to each row: a request's rows 0 and 1, 2 and 3, and so on. Two
consecutive positions hold exactly one odd one, so a pair completes at most one group (exactly
one, but for a request's last row left alone at an even position). The batch's pairs are numbered
in row order, and the grid covers them in *blocks* of ``GROUPS``, one program a block (a
persistent launch gives a program several, in turn): lane ``t`` of block ``b`` takes pair
``b * GROUPS + t``, found from the extend offsets alone, and computes the pair's row at an odd
position. So every lane of a full block is busy, whichever requests and row parities its pairs
lie in. The tiles have ``LANES`` rows, at least 16 (``tl.dot``'s smallest tile): a block of 8
pairs leaves half of them idle.

A block makes two sweeps over the columns of its lanes' groups, with a barrier between them:

A. the gate, ``CHUNK`` columns at a time: each lane's two rows are read once, the pooled row
   rounded to bf16 and stored in ``latent`` (not yet normalised: RMSNorm needs the sum of
   squares of the whole row first), the sum of squares accumulated;
B. ``BLOCK_K`` columns at a time: the gated row read back from ``latent`` (the barrier makes the
   other threads' stores visible), normalised, stored over itself and, turned by RoPE where the
   chunk holds rope dims, in the KV cache, and multiplied into the index key, ``latent @ wk.T``
   (one read of ``wk`` a block). Then the index key's RMSNorm and RoPE, and its store.

Each sweep holds one chunk of columns at a time, so a program needs few registers and many fit on
an SM: while one waits for memory, the others compute.

Then the program parks, in the ring, the last rows of the requests whose first pair is one of
its block's.
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
def pair_table(offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """Every request slot's *pairs* of rows: its first row and end, its number of pairs, and the
    batch-wide number of its first pair (the pairs of the slots before it): ``[S_PAD]`` int64 each.

    A request of ``n`` rows is cut into ``(n + 1) // 2`` pairs: its rows 0 and 1, 2 and 3, ... (the
    last pair of an odd ``n`` has one row). Two consecutive positions hold exactly one odd one, so
    each pair completes at most one group. Counted in slot order, the pairs are numbered in row
    order. Read from the extend offsets alone.
    """
    starts, ends = request_slot_table(offsets_ptr, request_slots, S_PAD)
    pairs = tl.where(tl.arange(0, S_PAD) < request_slots, (ends - starts + 1) // 2, 0)
    first_pair = tl.cumsum(pairs, axis=0) - pairs
    return starts, ends, pairs, first_pair


@triton.jit
def lane_rows(block, offsets_ptr, pos_ptr, req_ptr, raw_ptr, request_slots, num_rows, LANES: tl.constexpr,
              GROUPS: tl.constexpr, S_PAD: tl.constexpr):
    """The group row each lane computes, with its ``pos``, ``req`` and ``raw_out_loc``: four ``[LANES]`` int64.

    Lane ``t`` of block ``b`` takes the batch's pair number ``b * GROUPS + t``, found in the request
    whose pairs hold it, and computes the pair's row at an odd ``pos``. Both rows' ``pos``, ``req``
    and ``raw_out_loc`` are loaded at once (one trip to memory, not two). A lane past ``GROUPS``
    (``tl.dot`` needs 16 lanes) or past the batch's last pair gets ``num_rows``: past the buffer, so
    it loads and stores nothing; so does a lane whose pair has no odd position (a request's last
    row, alone and at an even position).
    """
    lane = tl.arange(0, LANES)
    p = block * GROUPS + lane.to(tl.int64)
    starts, ends, pairs, first_pair = pair_table(offsets_ptr, request_slots, S_PAD)
    # [S_PAD, LANES]: each lane's pair number inside each request (the request slots down the
    # tile: summed over axis 0, the lanes' rows come out in the layout the lanes' tiles use).
    k = p[None, :] - first_pair[:, None]
    mine = (k >= 0) & (k < pairs[:, None])
    first = tl.sum(tl.where(mine, starts[:, None] + 2 * k, 0), axis=0)  # the pair's first row
    end = tl.sum(tl.where(mine, ends[:, None], 0), axis=0)  # one past its request's last row
    busy = (tl.max(mine.to(tl.int32), axis=0) != 0) & (lane < GROUPS)
    a = busy & (first < num_rows)
    b = a & (first + 1 < end)
    pos_a = tl.load(pos_ptr + first, mask=a, other=0)
    pos_b = tl.load(pos_ptr + first + 1, mask=b, other=0)
    req_a = tl.load(req_ptr + first, mask=a, other=0)
    req_b = tl.load(req_ptr + first + 1, mask=b, other=0)
    raw_a = tl.load(raw_ptr + first, mask=a, other=0)
    raw_b = tl.load(raw_ptr + first + 1, mask=b, other=0)
    take_a = a & (pos_a % 2 == 1)
    take_b = b & (pos_b % 2 == 1) & ~take_a
    rows = tl.where(take_a, first, tl.where(take_b, first + 1, num_rows))
    return (rows, tl.where(take_a, pos_a, pos_b), tl.where(take_a, req_a, req_b),
            tl.where(take_a, raw_a, tl.where(take_b, raw_b, 0)))


@triton.jit
def group_rows(rows, pos, raw, offsets_ptr, request_slots, num_rows, S_PAD: tl.constexpr):
    """``[N]`` bool: each lane's row (``[N]`` int64, with its ``pos`` and ``raw_out_loc``) completes a group.

    A group completes at a live row of odd ``pos``. ``raw_out_loc == 0`` marks a padding row: it
    never stores, even if the offsets claimed it. Rows past the buffer complete nothing.
    """
    live = live_rows(rows, offsets_ptr, request_slots, S_PAD)
    return (rows < num_rows) & live & (pos % 2 == 1) & (raw != 0)


# --------------------------------------------------------------------------------------------
# The math of one group, for a tile of lanes
# --------------------------------------------------------------------------------------------


@triton.jit
def partners(projected_ptr, ring_ptr, rows, pos, req, offsets_ptr, request_slots, D: tl.constexpr,
             RING: tl.constexpr, S_PAD: tl.constexpr):
    """``[N]`` pointers to the ``| kv | score |`` row of each lane's group row, and of its partner
    (``rows``, ``pos``, ``req``: ``[N]`` int64, the lanes' rows and what they hold).

    The partner is the previous row of the buffer, except for the first row of a request (a
    chunk that starts at an odd position): its partner is the ring row an earlier chunk parked,
    ``req * RING + (pos - 1) % RING``.
    """
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
def rope_angles(group_pos, inv_freq_ptr, pairs, first_rope_pair, ROPE: tl.constexpr):
    """``cos`` and ``sin`` of the angle that turns each pair of dims: ``[N, P]`` fp32 each.

    ``pairs``: ``[P]``, the index of each pair of dims ``(2p, 2p + 1)`` in its row; the rope dims
    are the pairs from ``first_rope_pair`` on, and pair ``first_rope_pair + i`` turns by
    ``group_pos * inv_freq[i]`` (``group_pos``: ``[N]`` fp32). Every other pair gets the angle 0:
    ``cos = 1``, ``sin = 0``, which :func:`rope` leaves exactly as it is.
    """
    i = pairs - first_rope_pair
    turned = (i >= 0) & (i < ROPE // 2)
    angle = group_pos[:, None] * tl.load(inv_freq_ptr + i, mask=turned, other=0.0)[None, :]
    return cos(angle), sin(angle)


@triton.jit
def rope(x, c, s):
    """Turn each pair of dims of ``x`` (``[N, 2P]`` fp32: dims ``2p`` and ``2p + 1``) by the angle
    whose cosine and sine are ``c[:, p]``, ``s[:, p]`` (``[N, P]``), in fp32; rounded to bf16.

    The pairs are split out of the tile (``[N, P, 2]``, then the even and the odd dims) and joined
    back: the tile never leaves the registers.
    """
    even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
    turned = tl.join(even * c - odd * s, even * s + odd * c)
    return to_bf16(tl.reshape(turned, (x.shape[0], x.shape[1])))


@triton.jit
def row_sum(x, LOG2_N: tl.constexpr):
    """Each row of ``x`` (``[N, 2**LOG2_N]`` fp32) summed in one fixed order: neighbouring columns
    in pairs, then neighbouring pairs, and so on (``((x0 + x1) + (x2 + x3)) + ...``).

    ``tl.sum`` adds in the order its threads hold the values, and that order changes with the
    number of warps: the same kernel with 4 or 8 warps would round some sums differently, and a
    request's caches would depend on the bucket its chunk lands in. Written as elementwise adds of
    halves, the sum is the same, to the bit, for any number of warps, compiled or interpreted.
    """
    for _ in tl.static_range(LOG2_N):
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = even + odd
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def row_sum_in_order(x, N: tl.constexpr):
    """Each row of ``x`` (``[rows, N]`` fp32) summed column by column, ``((x0 + x1) + x2) + ...``:
    a product with a ``[N, 16]`` tile of ones on the CUDA cores (``input_precision="ieee"``: fp32
    fused multiply-adds, each output accumulated over ``N`` in order, whatever the warps), every
    column of it the same sum. For a tile in the tensor cores' layout (the index key), where
    :func:`row_sum`'s halving would cost many registers.
    """
    sums = tl.dot(x, tl.full((N, 16), 1.0, tl.float32), input_precision="ieee")
    return tl.max(sums, axis=1)  # 16 equal values: their max is each of them


@triton.jit
def gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D: tl.constexpr, CHUNK: tl.constexpr,
                         LOG2_CHUNK: tl.constexpr, GATE_STAGES: tl.constexpr):
    """Pass A: each lane's group gated ``CHUNK`` columns at a time, rounded to bf16 and stored in
    ``latent`` at the group row, not yet normalised; returns each lane's sum of squares ``[N]`` fp32.

    Only ``CHUNK`` columns of the four input tiles (kv, score, and the partner's) are live at a
    time: few registers a thread, so many programs fit on an SM and hide each other's loads.
    ``GATE_STAGES`` pipelines the sweep: the loads of the next ``GATE_STAGES - 1`` chunks are on
    their way (into shared memory) while this chunk's math runs; under the interpreter it is a
    plain loop. The squares are added up column by column over the chunks, then across the
    columns by :func:`row_sum`: one order of additions, whatever the warps.
    """
    m = group[:, None]
    squares = tl.full((rows.shape[0], CHUNK), 0.0, tl.float32)  # column c: squares of columns c, c + CHUNK, ...
    for c0 in tl.range(0, D, CHUNK, num_stages=GATE_STAGES):
        cols = c0 + tl.arange(0, CHUNK)
        x = to_bf16(gate(cur, prev, group, cols, D))
        tl.store(latent_ptr + rows[:, None] * D + cols[None, :], x, mask=m)
        x = x.to(tl.float32)
        squares += x * x
    return row_sum(squares, LOG2_CHUNK)


@triton.jit
def latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group, cache_slot,
                         group_pos, inv_rms, D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """Pass B, ``BLOCK_K`` columns at a time: the gated row read back from ``latent``, normalised
    (the pre-RoPE latent) and stored over itself; turned by RoPE where the chunk holds rope dims
    (the chunk's other dims turn by the angle 0) and stored in the KV cache at the c2 slot; and
    ``k = latent @ wk.T``, bf16 operands, fp32 sums: ``[N, I]``, returned. ``wk`` is read once for
    all lanes.

    Each element of ``latent`` is read, then written, by the same lane: no lane overtakes another.
    """
    m = group[:, None]
    j = tl.arange(0, I)
    k = tl.full((rows.shape[0], I), 0.0, tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        here = latent_ptr + rows[:, None] * D + kk[None, :]
        x = tl.load(here, mask=m, other=0.0).to(tl.float32)
        latent = rms_norm(x, inv_rms, norm_w_ptr, kk, kk < D)
        a = latent.to(tl.bfloat16)
        tl.store(here, a, mask=m)
        to_cache = a
        if k0 + BLOCK_K > D - ROPE:  # a chunk that holds rope dims (the others need no cos or sin)
            c, s = rope_angles(group_pos, inv_freq_ptr, k0 // 2 + tl.arange(0, BLOCK_K // 2), (D - ROPE) // 2, ROPE)
            to_cache = rope(latent, c, s)
        tl.store(kv_cache_ptr + cache_slot[:, None] * D + kk[None, :], to_cache, mask=m)
        # a [BLOCK_K, I] tile of wk.T: column j of k is row j of wk
        k = dot(a, tl.load(wk_ptr + j[None, :] * D + kk[:, None]), k)
    return k


@triton.jit
def index_key_to_cache(k, group, cache_slot, group_pos, k_norm_w_ptr, inv_freq_ptr, index_k_ptr, eps,
                       I: tl.constexpr, ROPE: tl.constexpr):
    """The index key ``k`` (``[N, I]`` fp32) rounded to bf16, RMSNorm with ``k_norm_w``, RoPE on
    its last ``ROPE`` dims, stored in the index-K cache at the c2 slot."""
    k = to_bf16(k).to(tl.float32)
    inv_rms = tl.rsqrt(row_sum_in_order(k * k, I) / I + eps)
    j = tl.arange(0, I)
    c, s = rope_angles(group_pos, inv_freq_ptr, tl.arange(0, I // 2), (I - ROPE) // 2, ROPE)
    key = rope(rms_norm(k, inv_rms, k_norm_w_ptr, j, j < I), c, s)
    tl.store(index_k_ptr + cache_slot[:, None] * I + j[None, :], key, mask=group[:, None])


@triton.jit
def park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, request_slots,
                 block, num_rows, D: tl.constexpr, RING: tl.constexpr, RING_PAD: tl.constexpr,
                 GROUPS: tl.constexpr, S_PAD: tl.constexpr):
    """Park each request's last ``min(count, RING)`` rows at ring row ``req * RING + pos % RING``.

    A block parks the requests whose first pair is one of its lanes' (a request with no rows: the
    number its first pair would have had). Only a request's first row reads that request's ring
    rows, in its first pair's lane, and this program read them in pass A, before the barrier: no
    program can race with these writes. First pair numbers never decrease, so those requests are
    the request slots ``[lo, hi)``: a loop with run-time bounds.
    """
    _, _, _, first_pair = pair_table(offsets_ptr, request_slots, S_PAD)
    first_pair = tl.where(tl.arange(0, S_PAD) < request_slots, first_pair, NO_ROW)
    lo = tl.sum((first_pair < block * GROUPS).to(tl.int32), axis=0)
    hi = tl.sum((first_pair < (block + 1) * GROUPS).to(tl.int32), axis=0)
    j = tl.arange(0, RING_PAD)
    both = tl.arange(0, 2 * D)  # | kv | score |
    for r in range(lo, hi):
        start = tl.load(offsets_ptr + r).to(tl.int64)
        count = tl.load(offsets_ptr + request_slots + r).to(tl.int64)
        n_park = tl.minimum(count, RING)
        src = start + count - n_park + j  # the request's last rows
        ok = (j < n_park) & (src < num_rows)
        # The rows and what they hold, in one trip to memory: the rows' loads need only ``src``.
        rows = tl.load(projected_ptr + src[:, None] * (2 * D) + both[None, :], mask=ok[:, None])
        pos = tl.load(pos_ptr + src, mask=ok, other=0)
        req = tl.load(req_ptr + src, mask=ok, other=0)
        ok = ok & (tl.load(raw_ptr + src, mask=ok, other=0) != 0)  # a padding row parks nothing
        dst = req * RING + pos % RING
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
    GROUPS: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, S_PAD: tl.constexpr, RING_PAD: tl.constexpr,
):
    # The grid depends only on static sizes (the buffer's rows, the request slots, the SMs): the
    # extend offsets, read here from a tensor, decide which group each lane computes. A graph can
    # capture this launch.
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        rows, pos, req, raw = lane_rows(block, offsets_ptr, pos_ptr, req_ptr, raw_ptr, request_slots, num_rows,
                                        LANES, GROUPS, S_PAD)
        group = group_rows(rows, pos, raw, offsets_ptr, request_slots, num_rows, S_PAD)
        if tl.max(group.to(tl.int32), axis=0) != 0:  # a block past the batch's last pair skips the passes
            cur, prev = partners(projected_ptr, ring_ptr, rows, pos, req, offsets_ptr, request_slots, D, RING, S_PAD)
            cache_slot = raw // 2  # the group's c2 slot
            group_pos = (pos - 1).to(tl.float32)
            # Pass A: gate, and the sum of squares the RMSNorm needs before it can scale any column.
            sum_sq = gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D, CHUNK, LOG2_CHUNK, GATE_STAGES)
            inv_rms = tl.rsqrt(sum_sq / D + eps)
            # Pass B reads the gated rows other threads stored; the barrier makes them visible.
            tl.debug_barrier()
            k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                     cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
            index_key_to_cache(k, group, cache_slot, group_pos, k_norm_w_ptr, inv_freq_ptr, index_k_ptr, eps, I, ROPE)
        park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, request_slots, block,
                     num_rows, D, RING, RING_PAD, GROUPS, S_PAD)


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
    Stage("pairs of rows", pair_table, ()),
    Stage("the group of each lane", lane_rows, ()),
    Stage("group rows", group_rows, ()),
    Stage("partners", partners, (torch_path.pair_partners,)),
    Stage("gate", gate, (torch_path.gate,)),
    Stage("RMSNorm", rms_norm, (torch_path.finish, torch_path.rms_norm)),
    Stage("RoPE angles", rope_angles, (torch_path.rope,)),
    Stage("RoPE", rope, (torch_path.rope,)),
    Stage("pass A: gate and sum of squares", gate_and_sum_squares, (torch_path.gate,)),
    Stage("pass B: latent, KV cache, index key", latent_and_index_key, (torch_path.finish, torch_path.index_key)),
    Stage("index key to its cache", index_key_to_cache, (torch_path.index_key,)),
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
