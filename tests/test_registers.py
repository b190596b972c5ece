"""``benchmarks/registers.py`` compiles the fused kernel for sm_90 without a GPU and reads its registers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


# Not a hidden failure: on a CUDA host the same registers come from the launched kernel (sweep.py
# reports Triton's n_regs), and the GPU host's Triton need not take this CPU compile path.
@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="a CPU tool: on a CUDA host benchmarks/sweep.py reads the registers of the launched kernel")
def test_registers_tool_reads_the_register_cap():
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "registers.py"), "g16.c64.k64.w4.st2.r96"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r"registers\s+(\d+)\s+stack\s+(\d+) bytes", out.stdout)
    assert found, out.stdout
    assert 32 <= int(found.group(1)) <= 96  # the cap holds; a kernel this size needs more than a few


# Not a hidden failure: on a CUDA host, timeline.py runs its kernel for real (a GPU's timer).
@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="a CPU check: on a CUDA host benchmarks/timeline.py launches the kernel it compiles")
def test_timeline_tool_compiles_its_stamped_kernel_for_sm90():
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "timeline.py"), "--compile-only",
                          "--variants", "g16.c64.k64.w4.st2.r96.a3"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compiled g16.c64.k64.w4.st2.r96.a3 for sm_90" in out.stdout


def test_timeline_kernel_runs_the_fused_kernels_stages_in_its_order():
    """The stamped kernel is a copy of the kernel's body: it must call the same stages, in the same order."""
    import ast

    import fused_timeline
    from c2graph.compressor import fused_kernel

    names = {getattr(stage.kernel, "fn", stage.kernel).__name__ for stage in fused_kernel.STAGES}
    names.discard("fused_compress_kernel")

    def calls(source: str) -> list[str]:  # the stages it calls, in the order they are written
        found = [n for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]
        return [n.func.id for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]

    kernel = calls(fused_kernel.source(fused_kernel.fused_compress_kernel))
    assert kernel, "found no stage calls in the fused kernel"
    assert calls(fused_kernel.source(fused_timeline.timed_kernel)) == kernel


def test_blocks_are_named_as_the_sweep_spells_its_variants():
    """``KernelBlocks.name`` (pictures, NOTES) reads back through the sweep's parser as the same blocks."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sweep import parse_variant
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from c2graph.compressor.fused import KernelBlocks, kernel_blocks

    for blocks in (kernel_blocks(32, 16), kernel_blocks(512, 2048), kernel_blocks(512, 65536),
                   KernelBlocks(groups_per_block=32, chunk=16, block_k=32, num_warps=8, programs_per_sm=2, max_registers=96)):
        assert parse_variant(blocks.name) == blocks


def test_profile_tool_launches_on_a_gpu_and_says_so_on_a_cpu():
    """``benchmarks/profile_kernel.py`` (the launches Nsight Compute reads): on a GPU it launches the
    kernel and says how often; on a CPU it says it needs a GPU, with exit code 2."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_kernel.py"), "--rows", "256",
                          "--launches", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if torch.cuda.is_available():
        assert out.returncode == 0, out.stderr[-2000:]
        assert "2 launches of default at 256 rows" in out.stdout
    else:
        assert out.returncode == 2
        assert "launches on a GPU; this machine has none" in out.stderr
