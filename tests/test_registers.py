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
def test_registers_tool_reads_the_register_cap_and_the_design_pages_count():
    """A capped variant keeps under its cap; the library's large-bucket blocks, uncapped, take the
    registers ``docs/design.md`` states, and as many programs share an SM as it says."""
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "registers.py"), "g16.c64.k64.w4.st2.r96",
                          "default", "--rows", "65536"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.findall(r"registers\s+(\d+)\s+stack\s+\d+ bytes\s+\((\d+) programs an SM", out.stdout)
    assert len(found) == 2, out.stdout
    (capped, _), (default, per_sm) = [(int(r), int(p)) for r, p in found]
    assert 32 <= capped <= 96  # the cap holds; a kernel this size needs more than a few
    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    stated = re.search(r"program of (\d+) warps \(large buckets\) to at most (\d+) registers with no cap set "
                       r"\(([^)]*)\), so (\w+) share", design)
    assert stated, "docs/design.md no longer states the large buckets' registers"
    words = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8}
    from c2graph.compressor.fused import kernel_blocks

    assert int(stated.group(1)) == kernel_blocks(512, 65536).num_warps
    assert default <= int(stated.group(2)) and per_sm == words[stated.group(4)], out.stdout
    by_version = {version: int(regs) for regs, version in re.findall(r"(\d+) with Triton (\d+\.\d+)", stated.group(3))}
    import triton

    running = ".".join(triton.__version__.split(".")[:2])
    assert by_version.get(running, default) == default, f"design.md says {by_version[running]} with Triton {running}"


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

    from kernel_stages import stages

    names = {stage.function_name for stage in stages()}
    names.discard("compress_fused_kernel")

    def calls(source: str) -> list[str]:  # the stages it calls, in the order they are written
        found = [n for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]
        return [n.func.id for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]

    kernel = calls(fused_kernel.source(fused_kernel.compress_fused_kernel))
    assert kernel, "found no stage calls in the fused kernel"
    assert calls(fused_kernel.source(fused_timeline.timed_kernel)) == kernel


def test_variants_are_named_as_the_sweep_spells_them():
    """``KernelBlocks.name`` (pictures, NOTES) and a benchmark ``Variant``'s name read back through
    the sweep's parser as the same blocks and options; a misspelt variant is refused by its part."""
    from c2graph.compressor.fused import KernelBlocks, kernel_blocks
    from variants import Variant, parse_variant

    for blocks in (kernel_blocks(32, 16), kernel_blocks(512, 2048), kernel_blocks(512, 65536)):
        assert parse_variant(blocks.name) == Variant(blocks)
    persistent = Variant(KernelBlocks(groups_per_block=32, chunk=16, block_k=32, num_warps=8), programs_per_sm=2,
                         max_registers=96)
    assert persistent.name == "g32.c16.k32.w8.st1.p2.r96.a1"
    assert parse_variant(persistent.name) == persistent
    assert parse_variant("default") is None
    with pytest.raises(ValueError, match=r"'x3' is not one of"):
        parse_variant("g16.c64.k64.w4.x3")
    with pytest.raises(ValueError, match=r"Variant.programs_per_sm = 0; expected an int >= 1, or None"):
        Variant(kernel_blocks(32, 16), programs_per_sm=0)


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
