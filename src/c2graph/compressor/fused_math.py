"""The fused kernel's math stages, for a tile of lanes: the partners' rows, the gate, RMSNorm, RoPE,
the index key, and the two sweeps over the columns that run them (pass A, pass B).

Each stage takes what :mod:`~c2graph.compressor.fused_rows` found about the lanes' rows (the row,
its ``pos``, whether it stores) and does one step of the math; compiled, every one is inlined into
:func:`~c2graph.compressor.fused_kernel.compress_fused_kernel`. Sums are written in one order
(:func:`row_sum`, :func:`row_sum_in_order`), so the bits do not depend on the warps.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fused_rows import ring_row
from .triton_compat import cos, dot, sin, to_bf16


@triton.jit
def partners(projected_ptr, ring_ptr, rows, pos, req, from_ring, D: tl.constexpr, RING: tl.constexpr):
    """``[N]`` pointers to the ``| kv | score |`` row of each lane's group row, and of its partner
    (``rows``, ``pos``, ``req``: ``[N]`` int64, the lanes' rows and what they hold; ``from_ring``:
    ``[N]`` bool, the row is its request's first, as :func:`~c2graph.compressor.fused_rows.lane_rows` found).

    The partner is the previous row of the buffer, except for the first row of a request (a
    chunk that starts at an odd position): its partner is the ring row an earlier chunk parked,
    ``req * RING + (pos - 1) % RING``.
    """
    cur = projected_ptr + rows * (2 * D)
    ring = ring_ptr + ring_row(req, pos - 1, RING) * (2 * D)
    return cur, tl.where(from_ring, ring, cur - 2 * D)


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
def rms_norm(x, inv_rms, weight):
    """``x * inv_rms * weight`` in fp32, rounded to bf16 (returned as fp32): one RMSNorm tile.

    ``x``: ``[N, C]`` fp32 holding bf16 values; ``inv_rms``: ``[N]``, ``rsqrt(mean(x**2) + eps)``
    over the whole row (the caller sums the squares of every tile of the row); ``weight``: ``[C]``
    fp32, the norm's weights at the tile's columns.
    """
    return to_bf16(x * inv_rms[:, None] * weight[None, :]).to(tl.float32)


@triton.jit
def rope_frequencies(inv_freq_ptr, pairs, first_rope_pair, ROPE: tl.constexpr):
    """The frequency each pair of dims turns by: ``[P]`` fp32. ``pairs``: ``[P]``, the index of each
    pair of dims ``(2p, 2p + 1)`` in its row; the rope dims are the pairs from ``first_rope_pair``
    on, and pair ``first_rope_pair + i`` turns by ``inv_freq[i]``; every other pair by 0."""
    i = pairs - first_rope_pair
    return tl.load(inv_freq_ptr + i, mask=(i >= 0) & (i < ROPE // 2), other=0.0)


@triton.jit
def rope_angles(group_pos, freq):
    """``cos`` and ``sin`` of the angle that turns each pair of dims: ``[N, P]`` fp32 each, pair
    ``p`` of row ``n`` by ``group_pos[n] * freq[p]`` (``group_pos``: ``[N]`` fp32; ``freq``: ``[P]``,
    :func:`rope_frequencies`). A pair outside the rope dims gets the angle 0: ``cos = 1``,
    ``sin = 0``, which :func:`rope` leaves exactly as it is.
    """
    angle = group_pos[:, None] * freq[None, :]
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
def gated_chunk(cur, prev, group, rows, latent_ptr, cols, squares, D: tl.constexpr):
    """One tile of pass A: the lanes' groups gated at ``cols``, rounded to bf16 and stored in
    ``latent``; returns ``squares`` with the tile's squares added, column by column."""
    x = to_bf16(gate(cur, prev, group, cols, D))
    tl.store(latent_ptr + rows[:, None] * D + cols[None, :], x, mask=group[:, None])
    x = x.to(tl.float32)
    return squares + x * x


@triton.jit
def gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D: tl.constexpr, CHUNK: tl.constexpr,
                         LOG2_CHUNK: tl.constexpr, GATE_STAGES: tl.constexpr, GATE_HALVES: tl.constexpr):
    """Pass A: each lane's group gated ``CHUNK`` columns at a time, rounded to bf16 and stored in
    ``latent`` at the group row, not yet normalised; returns each lane's sum of squares ``[N]`` fp32.

    Only ``CHUNK`` columns of the four input tiles (kv, score, and the partner's) are live at a
    time: few registers a thread, so many programs fit on an SM and hide each other's loads.
    ``GATE_STAGES`` pipelines the sweep: the loads of the next ``GATE_STAGES - 1`` chunks are on
    their way (into shared memory) while this chunk's math runs; under the interpreter it is a
    plain loop. The squares are added up column by column over the chunks, then across the
    columns by :func:`row_sum`: one order of additions, whatever the warps.

    ``GATE_HALVES``: a chunk is gated as two tiles of ``CHUNK // 2`` columns, each with its own
    squares (its first and its second half's columns). The pairwise sum of ``CHUNK`` columns ends
    by adding those of its two halves, so the bits are the same either way. Half-width tiles keep
    each thread's copy to 16 contiguous bytes when a block has few warps: a thread that copies more
    leaves gaps across the warp, and the copies into shared memory, which bypass the L1, fetch
    every 32-byte sector twice.
    """
    if GATE_HALVES:
        HALF: tl.constexpr = CHUNK // 2
        low = tl.full((rows.shape[0], HALF), 0.0, tl.float32)  # column c: squares of columns c, c + CHUNK, ...
        high = tl.full((rows.shape[0], HALF), 0.0, tl.float32)  # column c: those of c + HALF, c + HALF + CHUNK, ...
        for c0 in tl.range(0, D, CHUNK, num_stages=GATE_STAGES):
            low = gated_chunk(cur, prev, group, rows, latent_ptr, c0 + tl.arange(0, HALF), low, D)
            high = gated_chunk(cur, prev, group, rows, latent_ptr, c0 + HALF + tl.arange(0, HALF), high, D)
        return row_sum(low, LOG2_CHUNK - 1) + row_sum(high, LOG2_CHUNK - 1)
    else:
        squares = tl.full((rows.shape[0], CHUNK), 0.0, tl.float32)  # column c: squares of columns c, c + CHUNK, ...
        for c0 in tl.range(0, D, CHUNK, num_stages=GATE_STAGES):
            squares = gated_chunk(cur, prev, group, rows, latent_ptr, c0 + tl.arange(0, CHUNK), squares, D)
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
        latent = rms_norm(x, inv_rms, tl.load(norm_w_ptr + kk).to(tl.float32))
        a = latent.to(tl.bfloat16)
        tl.store(here, a, mask=m)
        to_cache = a
        if k0 + BLOCK_K > D - ROPE:  # a chunk that holds rope dims (the others need no cos or sin)
            freq = rope_frequencies(inv_freq_ptr, k0 // 2 + tl.arange(0, BLOCK_K // 2), (D - ROPE) // 2, ROPE)
            c, s = rope_angles(group_pos, freq)
            to_cache = rope(latent, c, s)
        tl.store(kv_cache_ptr + cache_slot[:, None] * D + kk[None, :], to_cache, mask=m)
        # a [BLOCK_K, I] tile of wk.T: column j of k is row j of wk
        k = dot(a, tl.load(wk_ptr + j[None, :] * D + kk[:, None]), k)
    return k


@triton.jit
def index_key_weights(k_norm_w_ptr, inv_freq_ptr, I: tl.constexpr, ROPE: tl.constexpr):
    """What the index key's RMSNorm and RoPE read, loaded once a program, before anything waits on
    it: ``k_norm_w`` (``[I]`` fp32) and each of its pairs of dims' frequency (``[I // 2]`` fp32)."""
    k_norm = tl.load(k_norm_w_ptr + tl.arange(0, I)).to(tl.float32)
    return k_norm, rope_frequencies(inv_freq_ptr, tl.arange(0, I // 2), (I - ROPE) // 2, ROPE)


@triton.jit
def index_key_to_cache(k, group, cache_slot, group_pos, k_norm, key_freq, index_k_ptr, eps, I: tl.constexpr):
    """The index key ``k`` (``[N, I]`` fp32) rounded to bf16, RMSNorm with ``k_norm`` (``[I]``
    fp32), RoPE on its last dims (``key_freq``, :func:`index_key_weights`), stored in the index-K
    cache at the c2 slot. Nothing here waits on memory: the weights are already in registers."""
    k = to_bf16(k).to(tl.float32)
    inv_rms = tl.rsqrt(row_sum_in_order(k * k, I) / I + eps)
    j = tl.arange(0, I)
    c, s = rope_angles(group_pos, key_freq)
    key = rope(rms_norm(k, inv_rms, k_norm), c, s)
    tl.store(index_k_ptr + cache_slot[:, None] * I + j[None, :], key, mask=group[:, None])
