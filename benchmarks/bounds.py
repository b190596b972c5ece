"""How fast could the fused kernel be? Simpler kernels on the same inputs, timed beside it.

On a CUDA machine, from the repository root::

    PYTHONPATH=src python3 benchmarks/bounds.py --rows 256,2048,16384,65536 --out bounds.json

All read the same ``dsv41`` buffers as ``benchmarks/sweep.py`` (enough of them that replays come
from memory, not from the L2), are replayed in CUDA graphs and timed the same way, and are checked
against torch before they are timed:

- ``stream.g<pairs>.c<chunk>.w<warps>.st<stages>``: the step's bytes and nothing else. Each pair
  of rows ``(2p, 2p + 1)`` is read once, ``CHUNK`` columns at a time (pipelined, as pass A is), and
  a latent row, a KV cache row and an index key are written for it; the math is one multiply-add
  a column. No offsets, no metadata, no ring, no barrier: the most a one-pass Triton kernel over
  these rows gets from the memory.
- ``sketch.<blocks>``: the fused kernel's own math stages (:mod:`c2graph.compressor.fused_math`:
  pass A, the barrier, pass B, the index key) on the same pairs, with ``blocks`` as
  ``benchmarks/sweep.py`` spells them, but every lane's rows found by arithmetic: no extend
  offsets, no ``pos``, ``req`` or ``raw_out_loc`` to read, no ring partner and no park. What the
  kernel's shape costs without its bookkeeping.
- ``sketchA.<blocks>``, ``sketchAB.<blocks>``: the sketch cut short, to see what each part costs:
  pass A alone (the gated rows stored, and each group's ``1 / rms``, so that its sum of squares
  is computed), or passes A and B without the index key's product (the latent and the KV cache).
- ``split<S>.<blocks>``: the sketch with pass A's columns spread over ``S`` programs a block; each
  stores its slice of the gated rows and arrives on the block's counter (an atomic add), and the
  last to arrive sums the squares from the stored rows (the same order as pass A's), then runs
  pass B and the index key for the whole block (pass A's chunks whole: no ``.h1``). No program
  waits for another, so it runs under the interpreter too. What spreading a group's columns over
  programs would buy.
- ``super<S>.<blocks>``: the sketch with the index key's product taken out of the blocks: each
  block runs pass A and pass B without it (the latent and the KV cache), then arrives on its
  *super-block*'s counter (``S`` blocks); the last to arrive multiplies all ``S * GROUPS_PER_BLOCK`` rows'
  latents by ``wk`` at once (``wk`` read once for them, ``S``-times taller tiles) and stores their
  index keys. What one read of ``wk`` for many blocks, in taller products, would buy.
- ``fused.<blocks>`` (``fused.default``: the library's blocks): the fused kernel itself, on the
  sweep's ragged batch of the same rows.

Prints a table; writes every number to ``--out`` (``benchmarks/NOTES.md`` keeps what was measured).
The share of the copy bandwidth counts each kernel's own bytes (the weights once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

import c2graph as c2
from c2graph.compressor import fused, torch_path
from c2graph.compressor.fused_math import (dot, gate_and_sum_squares, gated_chunk, index_key_to_cache,
                                           index_key_weights,
                                           latent_and_index_key, rms_norm, rope, rope_angles, rope_frequencies,
                                           row_sum)
from c2graph.compressor.pools import POISON
from c2graph.measure.traffic import weight_bytes
from sweep import TOL, Case, _pct, copy_bandwidth, cuda_graph, measure_variant, time_replays
from variants import Variant, parse_variant


@triton.jit
def stream_kernel(projected_ptr, latent_ptr, kv_cache_ptr, index_k_ptr, num_pairs, D: tl.constexpr,
                  I: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, STAGES: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * LANES + tl.arange(0, LANES)
    m = (p < num_pairs)[:, None]
    row = 2 * p + 1
    cur = projected_ptr + row * (2 * D)
    prev = cur - 2 * D
    slot = p + 1
    for c0 in tl.range(0, D, CHUNK, num_stages=STAGES):
        cols = c0 + tl.arange(0, CHUNK)
        kv = tl.load(cur[:, None] + cols[None, :], mask=m, other=0.0)
        score = tl.load(cur[:, None] + D + cols[None, :], mask=m, other=0.0)
        kv_prev = tl.load(prev[:, None] + cols[None, :], mask=m, other=0.0)
        score_prev = tl.load(prev[:, None] + D + cols[None, :], mask=m, other=0.0)
        x = (kv_prev * score_prev + kv * score).to(tl.bfloat16)
        tl.store(latent_ptr + row[:, None] * D + cols[None, :], x, mask=m)
        tl.store(kv_cache_ptr + slot[:, None] * D + cols[None, :], x, mask=m)
        tl.store(index_k_ptr + slot[:, None] * I + cols[None, :], x, mask=m & (cols[None, :] < I))


@triton.jit
def sketch_kernel(projected_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, kv_cache_ptr, index_k_ptr,
                  latent_ptr, num_pairs, eps, D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr,
                  GROUPS_PER_BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
                  BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, GATE_HALVES: tl.constexpr,
                  PASSES: tl.constexpr):
    k_norm, key_freq = index_key_weights(k_norm_w_ptr, inv_freq_ptr, I, ROPE)
    lane = tl.arange(0, LANES)
    p = tl.program_id(0).to(tl.int64) * GROUPS_PER_BLOCK + lane
    group = (lane < GROUPS_PER_BLOCK) & (p < num_pairs)
    rows = 2 * p + 1
    cur = projected_ptr + rows * (2 * D)
    cache_slot = p + 1
    group_pos = (2 * p).to(tl.float32)
    sum_sq = gate_and_sum_squares(cur, cur - 2 * D, group, rows, latent_ptr, D, CHUNK, LOG2_CHUNK, GATE_STAGES,
                                  GATE_HALVES)
    inv_rms = tl.rsqrt(sum_sq / D + eps)
    if PASSES == 1:  # pass A alone: its sum of squares stored where the index key goes, so it is computed
        tl.store(index_k_ptr + cache_slot * I, inv_rms.to(tl.bfloat16), mask=group)
    else:
        tl.debug_barrier()
        if PASSES == 2:
            normalise(latent_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group, cache_slot, group_pos, inv_rms,
                      D, ROPE, BLOCK_K)
        else:
            k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                     cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
            index_key_to_cache(k, group, cache_slot, group_pos, k_norm, key_freq, index_k_ptr, eps, I)


@triton.jit
def normalise(latent_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group, cache_slot, group_pos, inv_rms,
              D: tl.constexpr, ROPE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Pass B without the index key's product: the gated rows read back, normalised, stored, and turned
    into the KV cache (the steps of ``latent_and_index_key`` but its ``tl.dot``)."""
    m = group[:, None]
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        here = latent_ptr + rows[:, None] * D + kk[None, :]
        latent = rms_norm(tl.load(here, mask=m, other=0.0).to(tl.float32), inv_rms,
                          tl.load(norm_w_ptr + kk).to(tl.float32))
        tl.store(here, latent.to(tl.bfloat16), mask=m)
        to_cache = latent.to(tl.bfloat16)
        if k0 + BLOCK_K > D - ROPE:
            freq = rope_frequencies(inv_freq_ptr, k0 // 2 + tl.arange(0, BLOCK_K // 2), (D - ROPE) // 2, ROPE)
            c, s = rope_angles(group_pos, freq)
            to_cache = rope(latent, c, s)
        tl.store(kv_cache_ptr + cache_slot[:, None] * D + kk[None, :], to_cache, mask=m)


@triton.jit
def split_kernel(projected_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, kv_cache_ptr, index_k_ptr,
                 latent_ptr, arrivals_ptr, num_pairs, eps, D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr,
                 GROUPS_PER_BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
                 BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, SLICES: tl.constexpr):
    block = tl.program_id(0) // SLICES
    part = tl.program_id(0) % SLICES
    lane = tl.arange(0, LANES)
    p = block.to(tl.int64) * GROUPS_PER_BLOCK + lane
    group = (lane < GROUPS_PER_BLOCK) & (p < num_pairs)
    rows = 2 * p + 1
    cur = projected_ptr + rows * (2 * D)
    cache_slot = p + 1
    group_pos = (2 * p).to(tl.float32)
    SLICE: tl.constexpr = D // SLICES
    squares = tl.full((LANES, CHUNK), 0.0, tl.float32)
    for c0 in tl.range(part * SLICE, (part + 1) * SLICE, CHUNK, num_stages=GATE_STAGES):
        squares = gated_chunk(cur, cur - 2 * D, group, rows, latent_ptr, c0 + tl.arange(0, CHUNK), squares, D)
    tl.debug_barrier()  # every thread's stores before the arrival
    ticket = tl.atomic_add(arrivals_ptr + block, 1)  # acq_rel: the last to arrive sees every slice's stores
    if ticket % SLICES == SLICES - 1:
        k_norm, key_freq = index_key_weights(k_norm_w_ptr, inv_freq_ptr, I, ROPE)
        squares = tl.full((LANES, CHUNK), 0.0, tl.float32)
        for c0 in tl.range(0, D, CHUNK, num_stages=GATE_STAGES):
            cols = c0 + tl.arange(0, CHUNK)
            x = tl.load(latent_ptr + rows[:, None] * D + cols[None, :], mask=group[:, None], other=0.0,
                        cache_modifier=".cg").to(tl.float32)
            squares += x * x
        inv_rms = tl.rsqrt(row_sum(squares, LOG2_CHUNK) / D + eps)
        tl.debug_barrier()
        k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                 cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
        index_key_to_cache(k, group, cache_slot, group_pos, k_norm, key_freq, index_k_ptr, eps, I)


@triton.jit
def super_kernel(projected_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, kv_cache_ptr, index_k_ptr,
                 latent_ptr, arrivals_ptr, num_pairs, num_blocks, eps, D: tl.constexpr, I: tl.constexpr,
                 ROPE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr,
                 LOG2_CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr,
                 GATE_HALVES: tl.constexpr, SUPER: tl.constexpr):
    # passes A and B without the product: the sketch's own
    sketch_kernel(projected_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr, inv_freq_ptr, kv_cache_ptr, index_k_ptr,
                  latent_ptr, num_pairs, eps, D, I, ROPE, GROUPS_PER_BLOCK, LANES, CHUNK, LOG2_CHUNK, BLOCK_K, GATE_STAGES,
                  GATE_HALVES, 2)
    block = tl.program_id(0)
    tl.debug_barrier()  # every thread's stores before the arrival
    first = (block // SUPER) * SUPER
    arriving = tl.minimum(num_blocks - first, SUPER)  # the last super-block may hold fewer blocks
    ticket = tl.atomic_add(arrivals_ptr + block // SUPER, 1)  # acq_rel: the last sees every block's latents
    if ticket % arriving == arriving - 1:
        k_norm, key_freq = index_key_weights(k_norm_w_ptr, inv_freq_ptr, I, ROPE)
        q = first.to(tl.int64) * GROUPS_PER_BLOCK + tl.arange(0, SUPER * GROUPS_PER_BLOCK)
        mine = q < num_pairs
        j = tl.arange(0, I)
        k = tl.full((SUPER * GROUPS_PER_BLOCK, I), 0.0, tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(latent_ptr + (2 * q + 1)[:, None] * D + kk[None, :], mask=mine[:, None], other=0.0,
                        cache_modifier=".cg")
            k = dot(a, tl.load(wk_ptr + j[None, :] * D + kk[:, None]), k)
        index_key_to_cache(k, mine, q + 1, (2 * q).to(tl.float32), k_norm, key_freq, index_k_ptr, eps, I)


def parse_stream(spec: str) -> dict:
    """``g16.c64.w4.st3`` -> the stream kernel's sizes and launch options."""
    keys = {"g": "LANES", "c": "CHUNK", "w": "num_warps", "st": "STAGES"}
    return {keys[part.rstrip("0123456789")]: int(part[len(part.rstrip("0123456789")):]) for part in spec.split(".")}


class Outputs:
    """Poisoned outputs for ``pairs`` pairs of rows: latent ``[T, D]``, caches ``[pairs + 1, ...]`` (slot 0 unused)."""

    def __init__(self, case: Case):
        cfg, pairs = case.cfg, case.rows // 2
        full = dict(dtype=torch.bfloat16, device=case.device)
        self.latent = torch.full((case.rows, cfg.D), POISON, **full)
        self.kv_cache = torch.full((pairs + 1, cfg.D), POISON, **full)
        self.index_k = torch.full((pairs + 1, cfg.index_dim), POISON, **full)
        self.arrivals = torch.zeros(pairs + 1, dtype=torch.int32, device=case.device)  # only ever + SLICES a block


def launch(case: Case, kind: str, spec: str, projected: torch.Tensor, out: Outputs):
    cfg, layer, pairs = case.cfg, case.layer, case.rows // 2
    if kind == "stream":
        sizes = parse_stream(spec)
        return stream_kernel[(triton.cdiv(pairs, sizes["LANES"]),)](
            projected, out.latent, out.kv_cache, out.index_k, pairs, D=cfg.D, I=cfg.index_dim, **sizes)
    variant = parse_variant(spec) or Variant.default(cfg.D, case.rows)
    blocks = variant.blocks
    const = variant.constants(cfg.D, cfg.index_dim, cfg.rope_dim, cfg.ring_size, 1)
    for name in ("RING", "S_PAD", "RING_PAD"):
        const.pop(name)
    if kind.startswith("super"):
        num_blocks = triton.cdiv(pairs, blocks.groups_per_block)
        return super_kernel[(num_blocks,)](
            projected, layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, out.kv_cache, out.index_k,
            out.latent, out.arrivals, pairs, num_blocks, cfg.eps, SUPER=int(kind[len("super"):]), **const)
    if kind.startswith("split"):
        slices = int(kind[len("split"):])
        const.pop("GATE_HALVES")
        return split_kernel[(triton.cdiv(pairs, blocks.groups_per_block) * slices,)](
            projected, layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, out.kv_cache, out.index_k,
            out.latent, out.arrivals, pairs, cfg.eps, SLICES=slices, **const)
    passes = {"sketchA": 1, "sketchAB": 2, "sketch": 3}[kind]
    return sketch_kernel[(triton.cdiv(pairs, blocks.groups_per_block),)](
        projected, layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, out.kv_cache, out.index_k, out.latent,
        pairs, cfg.eps, PASSES=passes, **const)


def check(case: Case, kind: str, projected: torch.Tensor, out: Outputs) -> list[str]:
    """Where the kernel's outputs differ from torch on the same pairs (empty: nowhere)."""
    cfg, layer = case.cfg, case.layer
    D, I = cfg.D, cfg.index_dim
    cur, prev = projected[1::2], projected[0::2]
    bad = []
    if kind == "stream":
        x = (prev[:, :D] * prev[:, D:] + cur[:, :D] * cur[:, D:]).to(torch.bfloat16)
        want = {"latent": x, "kv_cache": x, "index_k": x[:, :I]}
    else:
        pooled = torch_path.gate(prev[:, :D], prev[:, D:], cur[:, :D], cur[:, D:])
        latent = torch_path.finish(pooled, layer.norm_w, cfg.eps)
        group_pos = torch.arange(0, case.rows, 2, device=case.device)
        want = {"latent": latent, "kv_cache": torch_path.rope(latent, group_pos, layer.inv_freq),
                "index_k": torch_path.index_key(latent, layer, group_pos)}
        if kind == "sketchAB":
            del want["index_k"]
        if kind == "sketchA":
            gated = pooled.to(torch.bfloat16)
            inv_rms = torch.rsqrt(gated.double().pow(2).mean(-1) + cfg.eps).to(torch.bfloat16)
            want = {"latent": gated}
            bad += check_close("inv_rms", out.index_k[1:, 0], inv_rms)
    got = {"latent": out.latent[1::2], "kv_cache": out.kv_cache[1:], "index_k": out.index_k[1:]}
    for name, w in want.items():
        bad += check_close(name, got[name], w)
    if not (out.latent[0::2].float() == POISON).all():
        bad.append("a latent row that completes no group was written")
    return bad


def check_close(name: str, got: torch.Tensor, want: torch.Tensor) -> list[str]:
    g, w = got.float(), want.float()
    if ((g - w).abs() <= TOL + TOL * w.abs()).all():
        return []
    return [f"{name} differs from torch by {float((g - w).abs().max()):.3g}"]


def nbytes(case: Case, kind: str) -> int:
    """The bytes a kernel moves: the rows read once, a latent, a KV cache row and an index key a pair
    written, and for the sketch the weights once."""
    cfg, pairs = case.cfg, case.rows // 2
    written = {"sketchA": cfg.D + 1, "sketchAB": 2 * cfg.D}.get(kind, 2 * cfg.D + cfg.index_dim)
    moved = case.rows * 2 * cfg.D * 4 + pairs * written * 2
    return moved + (0 if kind in ("stream", "sketchA", "sketchAB") else weight_bytes(cfg))


def measure(case: Case, variant: str, reps: int) -> dict:
    kind, _, spec = variant.partition(".")
    if kind == "fused":
        want = case.fresh()
        case.torch_path(case.buffers[0], *want)
        r = measure_variant(case, spec, want, reps)
        return {**r, "variant": variant, "bytes": case.nbytes}
    out = Outputs(case)
    compiled = launch(case, kind, spec, case.buffers[0], out)
    torch.cuda.synchronize()
    problems = check(case, kind, case.buffers[0], out)
    graphs = [cuda_graph(lambda p=p: launch(case, kind, spec, p, out)) for p in case.buffers]
    us = time_replays(graphs, reps) if not problems else [float("nan")]
    del graphs
    return {"variant": variant, "rows": case.rows, "median_us": statistics.median(us), "p10_us": _pct(us, 10),
            "p90_us": _pct(us, 90), "bytes": nbytes(case, kind),
            "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
            "problems": problems}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="256,2048,16384,65536")
    parser.add_argument("--variants", default="fused.default,sketch.default,stream.g16.c64.w4.st3")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--out", default="bounds.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bounds.py times kernels on a CUDA GPU; this machine has none.", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth()
    env = c2.environment()
    report = {"environment": env, "copy_GBps": bandwidth / 1e9, "records": []}
    print(f"{env['device']}: copy {bandwidth / 1e9:.0f} GB/s", flush=True)
    for rows in map(int, args.rows.split(",")):
        case = Case(rows)
        for variant in args.variants.split(","):
            try:
                r = measure(case, variant, args.reps)
            except Exception as e:  # reported: one bad variant must not end the run
                print(f"{rows:>6} {variant:<32} failed: {type(e).__name__}: {e}"[:2000], flush=True)
                continue
            r["bw_fraction"] = r["bytes"] / (r["median_us"] / 1e6) / bandwidth
            report["records"].append(r)
            print(f"{rows:>6} {variant:<32} {r['median_us']:8.1f} us  {r['bw_fraction']:5.0%} of copy  "
                  f"regs {r['n_regs']} spills {r['n_spills']}  {'; '.join(r['problems']) or 'checks pass'}",
                  flush=True)
        del case
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
