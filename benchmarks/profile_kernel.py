"""Launch the fused kernel a few times on one of the sweep's cases, for a profiler to read.

On a CUDA machine, from the repository root, under Nsight Compute (the counters of the fourth
launch: three to warm up)::

    PYTHONPATH=src ncu --clock-control none -k regex:compress_fused --launch-skip 3 --launch-count 1 \
        --set full python3 benchmarks/profile_kernel.py --rows 65536 --variant default

The case is ``benchmarks/sweep.py``'s (a ``dsv41`` ragged batch, random inputs), each launch on
the next of its input buffers, so the profiled launch reads its rows from memory, as a replay does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep import Case  # noqa: E402
from variants import parse_variant  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--variant", default="default")
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_kernel.py launches on a GPU; this machine has none.", file=sys.stderr)
        return 2
    case = Case(args.rows)
    variant = parse_variant(args.variant)
    pools, latent = case.fresh()
    for k in range(args.launches):
        case.fused(variant, case.buffers[k % len(case.buffers)], pools, latent)
    torch.cuda.synchronize()
    print(f"{args.launches} launches of {args.variant} at {args.rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
