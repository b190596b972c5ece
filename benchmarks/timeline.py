"""Where one program of the fused kernel spends its time: a timestamp at each step, per program.

The stamped copy of the kernel is :func:`c2graph.compressor.fused_timeline.timed_kernel` (the
kernel's stages, in the kernel's order, with the GPU's ``%globaltimer`` stored after each step of
every program). On a CUDA machine, from the repository root::

    PYTHONPATH=src python3 benchmarks/timeline.py --rows 2048,16384 --variants default,g16.c64.k64.w4.st3.a3

prints, per row count and variant, the median and the largest time of each step over the programs,
and when the last program started (a second wave of programs starts late), on the sweep's batches
(``benchmarks/sweep.py``). Variants are spelled as in the sweep. ``--compile-only`` compiles the
timed kernel for sm_90 on any machine (no GPU), as a check. ``make bench`` draws the same stamps at
256 and 2048 rows (:mod:`c2graph.pictures.timeline`). The measured tables are in ``benchmarks/NOTES.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import triton  # noqa: F401  (before c2graph: compiled, not interpreted)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c2graph.compressor import fused  # noqa: E402
from c2graph.compressor.config import Config  # noqa: E402
from c2graph.compressor.fused_timeline import STEPS, program_stamps, summary, timed_kernel  # noqa: E402
from sweep import parse_variant  # noqa: E402


def compile_for_sm90(blocks: fused.KernelBlocks, cfg: Config):
    """The timed kernel compiled for sm_90 without a GPU, as ``registers.py`` compiles the real one."""
    import registers

    return registers.compile_for_sm90(blocks, cfg, kernel=timed_kernel, extra={"ts_ptr": "*i64"})


def timeline(rows: int, spec: str, runs: int = 6):
    """``[programs, 6]`` int64 stamps of the last of ``runs`` launches (each on other inputs) of the
    variant ``spec`` at ``rows`` rows."""
    from sweep import Case

    case = Case(rows)
    for i in range(runs):
        pools, latent = case.fresh()
        ts = program_stamps(case.layer, case.buffers[i % len(case.buffers)], case.batch, pools, latent,
                            parse_variant(spec))
    return ts


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
