"""Where each program of the fused kernel spends its time: a timestamp after each step, per program.

:func:`timed_kernel` is :func:`~c2graph.compressor.fused_kernel.compress_fused_kernel`'s body (the
same stages, called in the same order) with the GPU's ``%globaltimer`` (nanoseconds) stored after
each step of every program: its rows and flags (the pair table, each lane's row, the partners);
pass A; pass B; the index key; the park. Each stamp is an inline-asm instruction that takes the
step's result as an input, so the compiler cannot move it before the step's loads have arrived.
A block past the batch's last pair skips its passes: its stamps after the first are then all the
park's. A test checks that the timed body calls the kernel's stages in the kernel's order.

Compiled only (the interpreter has no timer): :func:`program_stamps` launches it on a CUDA device.
"""

from __future__ import annotations

import statistics

import c2graph  # noqa: F401, I001  (first: on a machine without CUDA it decides how Triton runs)
import torch
import triton
import triton.language as tl

from c2graph.compressor import fused
from c2graph.compressor.fused_kernel import (gate_and_sum_squares, index_key_to_cache, index_key_weights, lane_rows,
                                             latent_and_index_key, pair_table, park_in_ring, partners, stores_group)
from variants import Variant

STEPS = ("rows and flags", "pass A", "pass B", "index key", "park")
"""The steps of one program, in order: a program's stamps ``[start, *ends of each step]``."""


@triton.jit
def stamp(after):
    """``%globaltimer`` (ns), read once ``after`` (an int32 computed from a step's result) is ready."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def timed_kernel(
    projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr,
    inv_freq_ptr, kv_cache_ptr, index_k_ptr, latent_ptr, num_rows, request_slots, num_blocks, kv_slots,
    ring_rows, eps, ts_ptr,
    D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, GATE_HALVES: tl.constexpr, S_PAD: tl.constexpr,
    RING_PAD: tl.constexpr,
):
    """The fused kernel, stamped: ``ts[pid] = [start, rows and flags, pass A, pass B, index key, end]``."""
    pid = tl.program_id(0)
    t = ts_ptr + pid * 6
    tl.store(t, stamp(pid))
    starts, ends, pairs, first_pair = pair_table(offsets_ptr, request_slots, S_PAD)
    k_norm, key_freq = index_key_weights(k_norm_w_ptr, inv_freq_ptr, I, ROPE)
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        rows, pos, req, raw, from_ring = lane_rows(block, starts, ends, pairs, first_pair, pos_ptr, req_ptr,
                                                   raw_ptr, num_rows, LANES, GROUPS_PER_BLOCK)
        group = stores_group(rows, pos, req, raw, from_ring, num_rows, kv_slots, ring_rows, RING)
        for i in range(1, 5):  # a block with no group skips its passes: they take no time
            tl.store(t + i, stamp(tl.sum(group.to(tl.int32))))
        if tl.max(group.to(tl.int32), axis=0) != 0:
            cur, prev = partners(projected_ptr, ring_ptr, rows, pos, req, from_ring, D, RING)
            cache_slot = raw // 2
            group_pos = (pos - 1).to(tl.float32)
            tl.store(t + 1, stamp(tl.sum(group.to(tl.int32)) + tl.sum(cache_slot.to(tl.int32))))
            sum_sq = gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D, CHUNK, LOG2_CHUNK, GATE_STAGES,
                                          GATE_HALVES)
            inv_rms = tl.rsqrt(sum_sq / D + eps)
            tl.store(t + 2, stamp((tl.sum(inv_rms) > -1.0).to(tl.int32)))
            tl.debug_barrier()
            k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                     cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
            tl.store(t + 3, stamp((tl.sum(k) > -1.0).to(tl.int32)))
            index_key_to_cache(k, group, cache_slot, group_pos, k_norm, key_freq, index_k_ptr, eps, I)
            tl.store(t + 4, stamp(pid))
        park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, starts, ends, first_pair, block,
                     num_rows, ring_rows, D, RING, RING_PAD, GROUPS_PER_BLOCK, S_PAD)
    tl.store(t + 5, stamp(pid))


def program_stamps(layer, projected: torch.Tensor, batch, pools, latent: torch.Tensor,
                   variant: Variant | None = None) -> torch.Tensor:
    """One launch of :func:`timed_kernel` on a CUDA device, one program a block, after a sleep
    kernel that lets the host queue it: ``[programs, 6]`` int64 stamps (ns). Writes the caches, ring
    and latents as :func:`~c2graph.compressor.fused.compress_fused` does; ``variant`` defaults to
    the bucket's blocks (:func:`~c2graph.compressor.fused.kernel_blocks` for ``batch.num_rows``)."""
    cfg = layer.cfg
    variant = variant or Variant.default(cfg.D, batch.num_rows)
    programs, args, const = fused.kernel_arguments(
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets, layer.norm_w,
        layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent, cfg.eps, cfg.ring_size,
        batch.num_rows, blocks=variant.blocks)
    ts = torch.zeros(programs, 6, dtype=torch.int64, device=projected.device)
    torch.cuda._sleep(20_000_000)
    timed_kernel[(programs,)](*args, ts, **variant.with_cap(const))
    torch.cuda.synchronize()
    return ts.cpu()


def summary(ts: torch.Tensor) -> dict:
    """Median and largest µs of each step over the programs, the last program's start and the span
    of the launch (first start to last end)."""
    t = ts.double() / 1e3
    start = t[:, 0] - t[:, 0].min()
    steps = {name: (t[:, i + 1] - t[:, i]).tolist() for i, name in enumerate(STEPS)}
    steps["one program"] = (t[:, 5] - t[:, 0]).tolist()
    return {"span_us": float((t[:, 5] - t[:, 0].min()).max()), "last_start_us": float(start.max()),
            **{name: (statistics.median(v), max(v)) for name, v in steps.items()}}
