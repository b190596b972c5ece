"""The fused path: the whole c2 compressor of one extend batch in ONE Triton launch (SPEC §7).

The torch path (:mod:`c2graph.torch_path`) spends about a hundred small launches per source
layer, each reading its inputs from memory and writing its result back. The fused kernel reads
the ``| kv | score |`` buffer once, keeps every intermediate in registers (or, for the two
places where a program needs its own results in another layout, re-reads the rows it just
wrote), and writes only what the batch must write: the compressed KV cache, the index-K cache,
the ring and the pre-RoPE latents.

The grid has ``cdiv(grid_rows, BLOCK_M)`` programs and depends only on static sizes (the
number of rows of the buffer, normally the bucket), never on how the rows are split into
requests: the extend offsets are read *inside* the kernel, from a tensor. This is what will let
the launch be captured in a CUDA graph later.

Entry points:

- :func:`compress_fused` takes a layer, the projected buffer, an :class:`ExtendBatch` and the
  :class:`Pools`, checks everything, and launches;
- :func:`fused_compress_` is the launcher on plain tensors, registered as the torch custom op
  ``c2graph::fused_compress`` so that dispatch-level tools (the op counter, the CPU emulation of
  CUDA graphs) see the launch as one op and can run it again.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .._runtime import INTERPRET
from .batch import ExtendBatch
from .config import Config
from .extend_offsets import check_extend_offsets
from .pools import Pools
from .source_layer import SourceLayer
from .arguments import check_layer_batch_pools, check_projected, check_tensor

BLOCK_M = 16
"""Rows per program. ``tl.dot`` needs every dimension >= 16, so this is also the smallest legal M."""

_NO_SLOT_START = tl.constexpr(2**31 - 1)
"""First row of the padding lanes of the request-slot vector: past every row, so no row is in them."""


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def _round_bf16(x):
    """fp32 -> bf16 with round-to-nearest-even, written out.

    Triton's interpreter truncates in ``x.to(tl.bfloat16)``; rounding the bits first makes the
    cast exact, so the interpreted and the compiled kernel round the same way (as torch does).
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    bits = (bits >> 16) << 16
    rounded = bits.to(tl.float32, bitcast=True)
    return tl.where(x == x, rounded, x).to(tl.bfloat16)  # NaN stays NaN


@triton.jit
def _cos(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.cos(x)  # numpy's cos in the interpreter
    else:
        return libdevice.cos(x)  # full range reduction: angles reach thousands of radians


@triton.jit
def _sin(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.sin(x)
    else:
        return libdevice.sin(x)


@triton.jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    """``acc + a @ b`` with fp32 accumulation. bf16 operands on the GPU (exact products);
    the interpreter's bf16 ``tl.dot`` is wrong, so there the operands are widened to fp32 first."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _fused_compress_kernel(
    projected_ptr,  # [T, 2D] fp32  | kv | score |
    ring_ptr,  # [pool_requests * RING + 1, 2D] fp32
    pos_ptr,  # [T] int64
    req_ptr,  # [T] int64
    raw_ptr,  # [T] int64  raw_out_loc; 0 marks a padding row
    offsets_ptr,  # [2, S] int32  extend offsets: row 0 first rows, row 1 row counts
    norm_w_ptr,  # [D] bf16
    wk_ptr,  # [I, D] bf16
    k_norm_w_ptr,  # [I] bf16
    inv_freq_ptr,  # [ROPE // 2] fp32
    kv_cache_ptr,  # [kv_slots, D] bf16
    index_k_ptr,  # [kv_slots, I] bf16
    latent_ptr,  # [T, D] bf16  pre-RoPE latents
    num_rows,  # T: rows of the buffer (loads and stores never go past it)
    request_slots,  # S
    eps,
    D: tl.constexpr,
    I: tl.constexpr,
    ROPE: tl.constexpr,
    RING: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    S_PAD: tl.constexpr,  # next power of two >= S
    I_NOPE_PAD: tl.constexpr,  # index key's un-rotated width, padded to a power of two >= 16
    HALF_PAD: tl.constexpr,  # ROPE // 2 padded to a power of two >= 16
    RING_PAD: tl.constexpr,  # next power of two >= RING
    INTERPRET: tl.constexpr,
):
    # Program b owns rows [b * BLOCK_M, (b + 1) * BLOCK_M). The grid, cdiv(grid_rows, BLOCK_M)
    # programs, depends only on static sizes; the extend offsets, read below from a tensor,
    # decide which rows do any work. This is what will let the launch be captured in a graph.
    pid = tl.program_id(0)
    block_lo = pid * BLOCK_M
    rows = block_lo.to(tl.int64) + tl.arange(0, BLOCK_M)  # int64: rows * 2D can be large
    in_buffer = rows < num_rows
    cols = tl.arange(0, D)

    # ---- Which request does each row belong to? ---------------------------------------------
    # Every program loads all request slots' first rows and counts as one vector. Padding lanes
    # get a first row past every row and count 0. A row's slot is the last slot starting at or
    # before it; the row is live only if it also lies before that slot's end. Only the offsets
    # decide where one request stops and the next begins: pos and req are not compared.
    s = tl.arange(0, S_PAD)
    starts = tl.load(offsets_ptr + s, mask=s < request_slots, other=_NO_SLOT_START)
    counts = tl.load(offsets_ptr + request_slots + s, mask=s < request_slots, other=0)
    at_or_before = starts[None, :].to(tl.int64) <= rows[:, None]  # [BLOCK_M, S_PAD]
    slot = tl.sum(at_or_before.to(tl.int32), axis=1) - 1  # [BLOCK_M]; -1: before every slot
    is_slot = s[None, :] == slot[:, None]
    start = tl.sum(tl.where(is_slot, starts[None, :], 0), axis=1).to(tl.int64)
    count = tl.sum(tl.where(is_slot, counts[None, :], 0), axis=1).to(tl.int64)
    live = (slot >= 0) & (rows < start + count) & in_buffer

    pos = tl.load(pos_ptr + rows, mask=in_buffer, other=0)
    req = tl.load(req_ptr + rows, mask=in_buffer, other=0)
    raw = tl.load(raw_ptr + rows, mask=in_buffer, other=0)
    # A group completes at an odd position. raw_out_loc == 0 (a padding row) never stores,
    # even if the offsets claim the row: the same defence as the engine's kernel.
    group = live & (pos % 2 == 1) & (raw != 0)
    c2_slot = raw // 2
    group_pos = (pos - 1).to(tl.float32)  # the group's even position, for RoPE

    # ---- Phase 1: pair, gate, finish -> the pre-RoPE latent ----------------------------------
    # The partner of a group row is the previous row of the buffer, unless the row is the first
    # of its request (a chunk that starts at an odd position): then it is the ring row that the
    # previous chunk parked. One gather load, with a per-row base pointer chosen by tl.where.
    from_ring = rows == start
    ring_row = req * RING + (pos - 1) % RING
    cur = projected_ptr + rows * (2 * D)
    prev = tl.where(from_ring, ring_ptr + ring_row * (2 * D), projected_ptr + (rows - 1) * (2 * D))
    m2 = group[:, None]
    kv = tl.load(cur[:, None] + cols[None, :], mask=m2, other=0.0)
    score = tl.load(cur[:, None] + D + cols[None, :], mask=m2, other=0.0)
    kv_prev = tl.load(prev[:, None] + cols[None, :], mask=m2, other=0.0)
    score_prev = tl.load(prev[:, None] + D + cols[None, :], mask=m2, other=0.0)

    # Per-channel softmax over the pair of scores.
    m = tl.maximum(score_prev, score)
    e0 = tl.exp(score_prev - m)
    e1 = tl.exp(score - m)
    pooled = kv_prev * (e0 / (e0 + e1)) + kv * (e1 / (e0 + e1))

    # pooled -> bf16, RMSNorm over D in fp32 with norm_w -> bf16: the pre-RoPE latent.
    p = _round_bf16(pooled).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(p * p, axis=1) / D + eps)
    norm_w = tl.load(norm_w_ptr + cols).to(tl.float32)
    latent = _round_bf16(p * inv_rms[:, None] * norm_w[None, :])
    tl.store(latent_ptr + rows[:, None] * D + cols[None, :], latent, mask=m2)
    # RoPE leaves the first D - ROPE dims alone: they go to the KV cache as they are.
    nope = m2 & (cols < D - ROPE)[None, :]
    tl.store(kv_cache_ptr + c2_slot[:, None] * D + cols[None, :], latent, mask=nope)

    # The latent rows just stored are read back below in other layouts (K-chunks for the dot,
    # even/odd halves for RoPE); the barrier makes every thread's stores visible to the program.
    tl.debug_barrier()

    # ---- Phase 2: index key and RoPE -----------------------------------------------------------
    # k = latent @ wk.T, computed as three products so that RoPE's interleaved pairs come out
    # as separate tiles: the un-rotated columns [0, I - ROPE), the even rope columns and the odd
    # rope columns. Padding columns (to reach tl.dot's minimum of 16) load zero weights.
    I_NOPE = I - ROPE
    HALF = ROPE // 2
    jn = tl.arange(0, I_NOPE_PAD)
    jh = tl.arange(0, HALF_PAD)
    n_ok = jn < I_NOPE
    h_ok = jh < HALF
    acc_n = tl.zeros((BLOCK_M, I_NOPE_PAD), dtype=tl.float32)
    acc_e = tl.zeros((BLOCK_M, HALF_PAD), dtype=tl.float32)
    acc_o = tl.zeros((BLOCK_M, HALF_PAD), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(latent_ptr + rows[:, None] * D + kk[None, :], mask=m2, other=0.0)
        # wk^T chunks [BLOCK_K, N]: column n of k is row n of wk
        w_n = tl.load(wk_ptr + jn[None, :] * D + kk[:, None], mask=n_ok[None, :], other=0.0)
        w_e = tl.load(wk_ptr + (I_NOPE + 2 * jh)[None, :] * D + kk[:, None], mask=h_ok[None, :], other=0.0)
        w_o = tl.load(wk_ptr + (I_NOPE + 1 + 2 * jh)[None, :] * D + kk[:, None], mask=h_ok[None, :],
                      other=0.0)
        acc_n = _dot(a, w_n, acc_n, INTERPRET)
        acc_e = _dot(a, w_e, acc_e, INTERPRET)
        acc_o = _dot(a, w_o, acc_o, INTERPRET)

    # k -> bf16, RMSNorm over I with k_norm_w -> bf16 (padding columns are zero: they add nothing).
    k_n = _round_bf16(acc_n).to(tl.float32)
    k_e = _round_bf16(acc_e).to(tl.float32)
    k_o = _round_bf16(acc_o).to(tl.float32)
    sum_sq = tl.sum(k_n * k_n, axis=1) + tl.sum(k_e * k_e, axis=1) + tl.sum(k_o * k_o, axis=1)
    inv_rms_k = tl.rsqrt(sum_sq / I + eps)[:, None]
    kw_n = tl.load(k_norm_w_ptr + jn, mask=n_ok, other=0.0).to(tl.float32)
    kw_e = tl.load(k_norm_w_ptr + I_NOPE + 2 * jh, mask=h_ok, other=0.0).to(tl.float32)
    kw_o = tl.load(k_norm_w_ptr + I_NOPE + 2 * jh + 1, mask=h_ok, other=0.0).to(tl.float32)
    k_n = _round_bf16(k_n * inv_rms_k * kw_n[None, :])
    k_e = _round_bf16(k_e * inv_rms_k * kw_e[None, :]).to(tl.float32)
    k_o = _round_bf16(k_o * inv_rms_k * kw_o[None, :]).to(tl.float32)

    # RoPE at the group position: pair i turns by group_pos * inv_freq[i], computed in fp32.
    inv_freq = tl.load(inv_freq_ptr + jh, mask=h_ok, other=0.0)
    angle = group_pos[:, None] * inv_freq[None, :]
    cos = _cos(angle, INTERPRET)
    sin = _sin(angle, INTERPRET)

    ik = index_k_ptr + c2_slot[:, None] * I
    tl.store(ik + jn[None, :], k_n, mask=m2 & n_ok[None, :])
    tl.store(ik + (I_NOPE + 2 * jh)[None, :], _round_bf16(k_e * cos - k_o * sin), mask=m2 & h_ok[None, :])
    tl.store(ik + (I_NOPE + 2 * jh + 1)[None, :], _round_bf16(k_e * sin + k_o * cos), mask=m2 & h_ok[None, :])

    # The latent's rope dims, read back from the latent rows as even and odd halves.
    b = D - ROPE
    lat_row = latent_ptr + rows[:, None] * D
    x_e = tl.load(lat_row + (b + 2 * jh)[None, :], mask=m2 & h_ok[None, :], other=0.0).to(tl.float32)
    x_o = tl.load(lat_row + (b + 2 * jh + 1)[None, :], mask=m2 & h_ok[None, :], other=0.0).to(tl.float32)
    kvc = kv_cache_ptr + c2_slot[:, None] * D
    tl.store(kvc + (b + 2 * jh)[None, :], _round_bf16(x_e * cos - x_o * sin), mask=m2 & h_ok[None, :])
    tl.store(kvc + (b + 2 * jh + 1)[None, :], _round_bf16(x_e * sin + x_o * cos), mask=m2 & h_ok[None, :])

    # Phase 3 overwrites ring rows; every ring read of this program (phase 1) must come first.
    tl.debug_barrier()

    # ---- Phase 3: park each request's last rows in the ring ----------------------------------
    # This program parks the requests whose FIRST row lies in its block. Only a request's first
    # row ever reads that request's ring rows, and it belongs to this very program, which read
    # them in phase 1: no other program can race with these writes. Starts never decrease, so
    # those requests are the slots [lo, hi): a loop with run-time bounds.
    lo = tl.sum((starts < block_lo).to(tl.int32), axis=0)
    hi = tl.sum((starts < block_lo + BLOCK_M).to(tl.int32), axis=0)
    j = tl.arange(0, RING_PAD)
    both = tl.arange(0, 2 * D)  # | kv | score |
    for r in range(lo, hi):
        r_start = tl.load(offsets_ptr + r).to(tl.int64)
        r_count = tl.load(offsets_ptr + request_slots + r).to(tl.int64)
        n_park = tl.minimum(r_count, RING)  # the last min(count, ring_size) rows
        src = r_start + r_count - n_park + j
        ok = (j < n_park) & (src < num_rows)
        p_pos = tl.load(pos_ptr + src, mask=ok, other=0)
        p_req = tl.load(req_ptr + src, mask=ok, other=0)
        ok = ok & (tl.load(raw_ptr + src, mask=ok, other=0) != 0)
        dst = p_req * RING + p_pos % RING
        row_vals = tl.load(projected_ptr + src[:, None] * (2 * D) + both[None, :], mask=ok[:, None])
        tl.store(ring_ptr + dst[:, None] * (2 * D) + both[None, :], row_vals, mask=ok[:, None])


# --------------------------------------------------------------------------------------------
# The launcher: one custom op, one launch
# --------------------------------------------------------------------------------------------


def check_kernel_sizes(D: int, index_dim: int, rope_dim: int) -> None:
    """Raise ``ValueError`` unless the kernel's tile sizes are powers of two (``tl.arange`` needs them)."""
    for name, value in (("D", D), ("index_dim", index_dim), ("rope_dim", rope_dim)):
        if value < 2 or value & (value - 1):
            raise ValueError(
                f"Config.{name} = {value}; the fused kernel needs a power of two >= 2 "
                "(its tiles are tl.arange ranges)"
            )


@functools.lru_cache(maxsize=None)
def _kernel_config(D: int, index_dim: int, rope_dim: int, ring_size: int, request_slots: int) -> dict:
    """Compile-time sizes for one layer shape (these choose the compiled binary, never the batch)."""
    return dict(
        D=D,
        I=index_dim,
        ROPE=rope_dim,
        RING=ring_size,
        BLOCK_M=BLOCK_M,
        BLOCK_K=min(64, D),
        S_PAD=triton.next_power_of_2(max(request_slots, 1)),
        I_NOPE_PAD=max(16, triton.next_power_of_2(max(index_dim - rope_dim, 1))),
        HALF_PAD=max(16, rope_dim // 2),
        RING_PAD=triton.next_power_of_2(ring_size),
        INTERPRET=INTERPRET,
        # [16, 512] fp32 tiles at D = 512: 8 warps keep them at 32 registers a thread each.
        num_warps=8 if D >= 256 else 4,
        num_stages=1,  # no software pipelining: the K-loop is short, and loads stay after the barrier
    )


def _check_launch_args(
    projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
    kv_cache, index_k, latent, ring_size, grid_rows,
) -> None:
    """Shapes, dtypes, devices and layouts of the launcher's tensors. Reads no tensor values."""
    if not isinstance(projected, torch.Tensor) or projected.dim() != 2 or projected.shape[1] % 2:
        shape = tuple(projected.shape) if isinstance(projected, torch.Tensor) else type(projected).__name__
        raise ValueError(f"projected has shape {shape}; expected [T, 2D] fp32 (| kv | score |)")
    T, D = projected.shape[0], projected.shape[1] // 2
    index_dim, rope_dim = wk.shape[0], 2 * inv_freq.shape[0]
    check_kernel_sizes(D, index_dim, rope_dim)
    if not isinstance(ring_size, int) or ring_size < 2:
        raise ValueError(f"ring_size = {ring_size!r}; expected an int >= 2")
    if not isinstance(grid_rows, int) or grid_rows < 0:
        raise ValueError(f"grid_rows = {grid_rows!r}; expected an int >= 0")
    dev = projected.device
    if dev.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"projected is on {dev}, but Triton runs compiled on this machine: the fused kernel "
            "needs CUDA tensors (build the layer, batch and pools on the default device, cuda); "
            "Triton's interpreter runs it on the CPU only when TRITON_INTERPRET=1 is set before "
            "c2graph is imported"
        )
    check_tensor("projected", projected, (T, 2 * D), torch.float32, dev)
    check_tensor("ring", ring, (ring.shape[0], 2 * D), torch.float32, dev)
    if ring.shape[0] % ring_size != 1:
        raise ValueError(
            f"ring has {ring.shape[0]} rows; expected pool_requests * ring_size ({ring_size}) + 1"
        )
    for name, t in (("pos", pos), ("req", req), ("raw_out_loc", raw_out_loc)):
        check_tensor(name, t, (T,), torch.int64, dev)
    if not isinstance(extend_offsets, torch.Tensor) or extend_offsets.dim() != 2:
        raise ValueError("extend_offsets must be an int32 tensor [2, request_slots]")
    check_tensor("extend_offsets", extend_offsets, (2, extend_offsets.shape[1]), torch.int32, dev)
    check_tensor("norm_w", norm_w, (D,), torch.bfloat16, dev)
    check_tensor("wk", wk, (index_dim, D), torch.bfloat16, dev)
    check_tensor("k_norm_w", k_norm_w, (index_dim,), torch.bfloat16, dev)
    check_tensor("inv_freq", inv_freq, (rope_dim // 2,), torch.float32, dev)
    check_tensor("kv_cache", kv_cache, (kv_cache.shape[0], D), torch.bfloat16, dev)
    check_tensor("index_k", index_k, (kv_cache.shape[0], index_dim), torch.bfloat16, dev)
    check_tensor("latent", latent, (T, D), torch.bfloat16, dev)
    names = ("projected", "ring", "pos", "req", "raw_out_loc", "extend_offsets", "norm_w", "wk",
             "k_norm_w", "inv_freq", "kv_cache", "index_k", "latent")
    tensors = (projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w,
               inv_freq, kv_cache, index_k, latent)
    for name, t in zip(names, tensors):
        if not t.is_contiguous():
            raise ValueError(
                f"{name} is not contiguous (strides {t.stride()}); expected a dense row-major tensor"
            )


@torch.library.custom_op("c2graph::fused_compress", mutates_args=("ring", "kv_cache", "index_k", "latent"))
def fused_compress_(
    projected: torch.Tensor,
    ring: torch.Tensor,
    pos: torch.Tensor,
    req: torch.Tensor,
    raw_out_loc: torch.Tensor,
    extend_offsets: torch.Tensor,
    norm_w: torch.Tensor,
    wk: torch.Tensor,
    k_norm_w: torch.Tensor,
    inv_freq: torch.Tensor,
    kv_cache: torch.Tensor,
    index_k: torch.Tensor,
    latent: torch.Tensor,
    eps: float,
    ring_size: int,
    grid_rows: int,
) -> None:
    """Launch the fused c2 kernel once, writing ``ring``, ``kv_cache``, ``index_k`` and ``latent`` in place.

    - ``projected``: ``[T, 2D]`` fp32, ``| kv | score |`` of every row
    - ``ring``: ``[pool_requests * ring_size + 1, 2D]`` fp32 (read, then each request's last rows parked)
    - ``pos``, ``req``, ``raw_out_loc``: ``[T]`` int64 per-row metadata
    - ``extend_offsets``: ``[2, request_slots]`` int32, first row and row count of each request slot
    - ``norm_w``: ``[D]`` bf16; ``wk``: ``[index_dim, D]`` bf16; ``k_norm_w``: ``[index_dim]`` bf16;
      ``inv_freq``: ``[rope_dim // 2]`` fp32
    - ``kv_cache``: ``[kv_slots, D]`` bf16 and ``index_k``: ``[kv_slots, index_dim]`` bf16, written
      at the c2 slot of each group row; ``latent``: ``[T, D]`` bf16, written on group rows only
    - ``grid_rows``: the rows the grid covers, ``cdiv(grid_rows, BLOCK_M)`` programs (normally
      ``T``); rows of blocks past it are not visited

    Checks shapes, dtypes and layouts (no tensor values: no host sync), so it can run inside a
    graph capture. It trusts the extend offsets: check them first (:func:`check_extend_offsets`).
    """
    _check_launch_args(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk,
                       k_norm_w, inv_freq, kv_cache, index_k, latent, ring_size, grid_rows)
    programs = triton.cdiv(grid_rows, BLOCK_M)  # the grid: from a size, never from the batch's requests
    if programs == 0:
        return
    D, request_slots = projected.shape[1] // 2, extend_offsets.shape[1]
    config = _kernel_config(D, wk.shape[0], 2 * inv_freq.shape[0], ring_size, request_slots)
    _fused_compress_kernel[(programs,)](
        projected, ring, pos, req, raw_out_loc, extend_offsets,
        norm_w, wk, k_norm_w, inv_freq, kv_cache, index_k, latent,
        projected.shape[0], request_slots, eps,
        **config,
    )


@fused_compress_.register_fake
def _fused_compress_fake(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w,
                         inv_freq, kv_cache, index_k, latent, eps, ring_size, grid_rows) -> None:
    return None


# --------------------------------------------------------------------------------------------
# The path: checks, then the one launch
# --------------------------------------------------------------------------------------------


def compress_fused(
    layer: SourceLayer,
    projected: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    latent_out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Compress one extend batch in one launch: write ``pools.kv_cache``, ``pools.index_k``, ``pools.ring``.

    ``projected``: ``[T, 2D]`` fp32, the one ``| kv | score |`` buffer of the fused-gate source
    projection (``T = batch.num_rows``). Returns the pre-RoPE latents ``[T, D]`` bf16
    (``latent_out`` if given, else a new buffer filled with NaN); only rows that complete a group
    are written. Computes the same function as :func:`compress_torch` (within ``rtol = atol =
    2**-6``; the ring bitwise), but never writes for even rows, padding rows or slots past the
    batch, not even c2 slot 0.

    With ``validate`` (the default) the extend offsets are also checked on the host, a sync;
    ``validate=False`` skips only that check, so the call reads no tensor values (graph capture).
    """
    cfg: Config = layer.cfg
    if not layer.use_fused_gate:
        raise ValueError(
            "layer.use_fused_gate is False; the fused path reads the one | kv | score | buffer of "
            "the fused-gate projection: use compress_torch for this layer"
        )
    check_kernel_sizes(cfg.D, cfg.index_dim, cfg.rope_dim)
    check_layer_batch_pools(layer, batch, pools)
    T = batch.num_rows
    if not isinstance(projected, torch.Tensor):
        raise ValueError(
            f"projected is a {type(projected).__name__}; expected one [T, 2D] fp32 tensor "
            "(| kv | score |), as the fused-gate projection writes it"
        )
    check_projected(layer, projected, T, pools.device)
    if latent_out is None:
        latent_out = torch.full((T, cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    check_tensor("latent_out", latent_out, (T, cfg.D), torch.bfloat16, pools.device)
    if validate:
        check_extend_offsets(batch.extend_offsets, T)
    fused_compress_(
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
        layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq,
        pools.kv_cache, pools.index_k, latent_out,
        cfg.eps, cfg.ring_size, T,
    )
    return latent_out
