"""Where one program of the fused kernel spends its time: a timestamp at each step, per program.

A copy of :func:`c2graph.compressor.fused_kernel.fused_compress_kernel`'s body (the same stage
functions, called in the same order) stores the GPU's ``%globaltimer`` (nanoseconds) after each
step of every program: its rows, flags and partners; pass A; pass B; the index key; the park.
Each stamp is an inline-asm instruction that takes the step's result as an input, so the compiler
cannot move it before the step's loads have arrived. On a CUDA machine, from the repository root::

    PYTHONPATH=src python3 benchmarks/timeline.py --rows 2048,16384 --variants g16.c64.k64.w4.st2.r96.a3

prints, per row count and variant, the median and the largest time of each step over the programs,
and when the last program started (a second wave of programs starts late). Variants are spelled as
in ``benchmarks/sweep.py``. A block past the batch's last pair skips its passes: its stamps
after the first are then all the park's. ``--compile-only`` compiles the timed kernel for sm_90 on any machine (no GPU), as a check.
The measured tables are in ``benchmarks/NOTES.md``. A test checks that the timed body calls the
kernel's stages in the kernel's order, so the copy cannot drift from the kernel unnoticed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import triton  # before c2graph: compiled, not interpreted
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c2graph.compressor import fused  # noqa: E402
from c2graph.compressor.config import Config  # noqa: E402
from c2graph.compressor.fused_kernel import (gate_and_sum_squares, group_rows, index_key_to_cache,  # noqa: E402
                                             lane_rows, latent_and_index_key, park_in_ring, partners)
from sweep import parse_variant  # noqa: E402

STEPS = ("rows, flags, partners", "pass A", "pass B", "index key", "park")


@triton.jit
def stamp(after):
    """``%globaltimer`` (ns), read once ``after`` (an int32 computed from a step's result) is ready."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def timed_kernel(
    projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, norm_w_ptr, wk_ptr, k_norm_w_ptr,
    inv_freq_ptr, kv_cache_ptr, index_k_ptr, latent_ptr, num_rows, request_slots, num_blocks, eps, ts_ptr,
    D: tl.constexpr, I: tl.constexpr, ROPE: tl.constexpr, RING: tl.constexpr,
    GROUPS: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr, LOG2_CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr, GATE_STAGES: tl.constexpr, S_PAD: tl.constexpr, RING_PAD: tl.constexpr,
):
    """The fused kernel, stamped: ``ts[pid] = [start, rows, pass A, pass B, index key, end]``."""
    pid = tl.program_id(0)
    t = ts_ptr + pid * 6
    tl.store(t, stamp(pid))
    for block in range(tl.program_id(0), num_blocks, tl.num_programs(0)):
        rows, pos, req, raw = lane_rows(block, offsets_ptr, pos_ptr, req_ptr, raw_ptr, request_slots, num_rows,
                                        LANES, GROUPS, S_PAD)
        group = group_rows(rows, pos, raw, offsets_ptr, request_slots, num_rows, S_PAD)
        for i in range(1, 5):  # a block with no group skips its passes: they take no time
            tl.store(t + i, stamp(pid))
        if tl.max(group.to(tl.int32), axis=0) != 0:
            cur, prev = partners(projected_ptr, ring_ptr, rows, pos, req, offsets_ptr, request_slots, D, RING, S_PAD)
            cache_slot = raw // 2
            group_pos = (pos - 1).to(tl.float32)
            tl.store(t + 1, stamp(tl.sum(group.to(tl.int32)) + tl.sum(cache_slot.to(tl.int32))))
            sum_sq = gate_and_sum_squares(cur, prev, group, rows, latent_ptr, D, CHUNK, LOG2_CHUNK, GATE_STAGES)
            inv_rms = tl.rsqrt(sum_sq / D + eps)
            tl.store(t + 2, stamp((tl.sum(inv_rms) > -1.0).to(tl.int32)))
            tl.debug_barrier()
            k = latent_and_index_key(latent_ptr, wk_ptr, norm_w_ptr, inv_freq_ptr, kv_cache_ptr, rows, group,
                                     cache_slot, group_pos, inv_rms, D, I, ROPE, BLOCK_K)
            tl.store(t + 3, stamp((tl.sum(k) > -1.0).to(tl.int32)))
            index_key_to_cache(k, group, cache_slot, group_pos, k_norm_w_ptr, inv_freq_ptr, index_k_ptr, eps, I, ROPE)
            tl.store(t + 4, stamp(pid))
        park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, offsets_ptr, request_slots, block,
                     num_rows, D, RING, RING_PAD, GROUPS, S_PAD)
    tl.store(t + 5, stamp(pid))


def compile_for_sm90(blocks: fused.KernelBlocks, cfg: Config):
    """The timed kernel compiled for sm_90 without a GPU, as ``registers.py`` compiles the real one."""
    import registers

    return registers.compile_for_sm90(blocks, cfg, kernel=timed_kernel, extra={"ts_ptr": "*i64"})


def timeline(rows: int, spec: str, runs: int = 6):
    """``[programs, 6]`` int64 stamps of the last of ``runs`` launches (each on other inputs, after
    a sleep kernel that lets the host queue the launch) of the variant ``spec`` at ``rows`` rows."""
    import torch

    from sweep import Case

    case = Case(rows)
    cfg, b, layer = case.cfg, case.batch, case.layer
    blocks = parse_variant(spec) or fused.kernel_blocks(cfg.D, rows)
    const = fused.kernel_constants(cfg.D, cfg.index_dim, cfg.rope_dim, cfg.ring_size, b.extend_offsets.shape[1],
                                   blocks)
    programs = fused.grid_blocks(rows, b.extend_offsets.shape[1], blocks.groups)
    ts = torch.zeros(programs, 6, dtype=torch.int64, device="cuda")
    for i in range(runs):
        pools, latent = case.fresh()
        torch.cuda._sleep(20_000_000)
        timed_kernel[(programs,)](
            case.buffers[i % len(case.buffers)], pools.ring, b.pos, b.req, b.raw_out_loc, b.extend_offsets,
            layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent,
            rows, b.extend_offsets.shape[1], programs, cfg.eps, ts, **const)
        torch.cuda.synchronize()
    return ts.cpu()


def summary(ts) -> dict:
    """Median and largest µs of each step over the programs, the last program's start and the span."""
    t = ts.double() / 1e3
    start = t[:, 0] - t[:, 0].min()
    steps = {name: (t[:, i + 1] - t[:, i]).tolist() for i, name in enumerate(STEPS)}
    steps["one program"] = (t[:, 5] - t[:, 0]).tolist()
    return {"span_us": float((t[:, 5] - t[:, 0].min()).max()), "last_start_us": float(start.max()),
            **{name: (statistics.median(v), max(v)) for name, v in steps.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2048,16384")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--out", help="a JSON file for the summaries")
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90 and stop (no GPU needed)")
    args = parser.parse_args(argv)
    specs = args.variants.split(",")
    if args.compile_only:
        for spec in specs:
            compile_for_sm90(parse_variant(spec) or fused.kernel_blocks(Config.dsv41().D, 65536), Config.dsv41())
            print(f"compiled {spec} for sm_90")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("timeline.py reads the GPU's timer; this machine has no GPU (try --compile-only).", file=sys.stderr)
        return 2
    found = {}
    for rows in map(int, args.rows.split(",")):
        for spec in specs:
            s = found[f"{rows}:{spec}"] = summary(timeline(rows, spec))
            steps = " | ".join(f"{name} {s[name][0]:.2f}/{s[name][1]:.2f}" for name in (*STEPS, "one program"))
            print(f"{rows:>6} {spec:<28} span {s['span_us']:.2f} µs, last start {s['last_start_us']:.2f} | "
                  f"median/max µs: {steps}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
