"""Registers and stack of the fused kernel compiled for an H100/H200 (sm_90), on any machine.

No GPU is needed: Triton compiles for a target it is told, and ``cuobjdump`` (shipped with
Triton's NVIDIA backend) reads the registers a thread needs and its stack (spills) from the
binary. From the repository root::

    python benchmarks/registers.py default g16.c64.k64.w4.st2.r96 g8.c64.k64.w4.st2

Variants are spelled as in ``benchmarks/sweep.py`` (``default``: the blocks ``compress_fused``
uses for a bucket of ``--rows`` rows). The kernel is compiled for the ``dsv41`` layer with the
pointer arguments 16-byte aligned, as a real launch specialises them: without that hint no load
is vectorised and the counts come out far too high. A Triton other than the GPU host's may count
a few registers differently: the sweep on the GPU has the last word.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a tool: compiled for a target, not interpreted (a CPU machine too)
    os.environ["TRITON_INTERPRET"] = "0"
import triton  # noqa: E402, F401

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c2graph.compressor import fused  # noqa: E402
from c2graph.compressor.config import Config  # noqa: E402
from c2graph.compressor.fused_kernel import compress_fused_kernel  # noqa: E402
from variants import Variant, parse_variant  # noqa: E402

POINTERS = {"projected_ptr": "*fp32", "ring_ptr": "*fp32", "pos_ptr": "*i64", "req_ptr": "*i64", "raw_ptr": "*i64",
            "offsets_ptr": "*i32", "norm_w_ptr": "*bf16", "wk_ptr": "*bf16", "k_norm_w_ptr": "*bf16",
            "inv_freq_ptr": "*fp32", "kv_cache_ptr": "*bf16", "index_k_ptr": "*bf16", "latent_ptr": "*bf16"}
SCALARS = {"num_rows": "i32", "request_slots": "i32", "num_blocks": "i32", "kv_slots": "i32", "ring_rows": "i32",
           "eps": "fp32"}


def compile_for_sm90(variant: Variant, cfg: Config, request_slots: int = 16,
                     kernel=compress_fused_kernel, extra: dict | None = None):
    """The kernel as ``variant`` for a ``cfg`` layer, compiled for sm_90 (Triton's CompiledKernel),
    with the constants and options a launch would give it (:meth:`Variant.constants`).
    ``kernel``: the fused kernel, or a copy of it that takes ``extra`` arguments too (``{name:
    Triton type}``, after the fused kernel's scalars)."""
    const = variant.constants(cfg.D, cfg.index_dim, cfg.rope_dim, cfg.ring_size, request_slots)
    options = {name: const.pop(name) for name in ("num_warps", "num_stages", "maxnreg") if name in const}
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {**POINTERS, **SCALARS, **(extra or {}), **{name: "constexpr" for name in const}}
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in POINTERS}
    source = ASTSource(kernel, signature, constexprs={(names.index(n),): v for n, v in const.items()},
                       attrs=aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def resource_usage(compiled) -> tuple[int, int]:
    """``(registers a thread, stack bytes)`` of a compiled kernel, read by ``cuobjdump -res-usage``."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        out = subprocess.run([str(tool), "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if not found:
        raise RuntimeError(f"cuobjdump printed no register count:\n{out}")
    return int(found.group(1)), int(found.group(2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=["default"])
    parser.add_argument("--rows", type=int, default=65536, help="the bucket that picks `default` (default %(default)s)")
    args = parser.parse_args(argv)
    cfg = Config.dsv41()
    for spec in args.variants:
        variant = parse_variant(spec) or Variant.default(cfg.D, args.rows)
        regs, stack = resource_usage(compile_for_sm90(variant, cfg))
        print(f"{spec:28} registers {regs:3d}  stack {stack:4d} bytes  ({256 * 1024 // (4 * regs * 32 * variant.blocks.num_warps)}"
              " programs an SM by registers)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
