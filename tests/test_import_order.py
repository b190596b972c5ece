"""Importing ``triton`` before ``c2graph`` on a machine without CUDA: Triton's own library is then
built for a GPU, so ``import c2graph`` stops with one line that says what to do, and with the
variable set before Python starts the same program runs the kernels in the interpreter (each case
in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

# Not a hidden failure: these cases check how the interpreter is chosen, which happens only where
# there is no CUDA; on a CUDA host Triton compiles and the same imports run in the GPU tests.
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is chosen on a machine without CUDA")

PROGRAM = """
import triton  # first, before c2graph
import torch
import c2graph as c2
print(c2.banner())
cfg = c2.Config.tiny()
layer = c2.SourceLayer(cfg, seed=1)
alloc = c2.ReqToTokenPool(cfg, 4, 64, seed=1)
batch = c2.ExtendBatch.build([(0, 3, 6), (2, 0, 5)], alloc, pad_to=16, device="cpu")
projected = c2.project_fused(layer, layer.random_hidden(batch.num_rows, 2))
torch_pools = c2.Pools(cfg, 4, alloc.kv_slots).poison(1234.0)
fused_pools = c2.Pools(cfg, 4, alloc.kv_slots).poison(1234.0)
c2.compress_torch(layer, *c2.split_projected(projected), batch, torch_pools)
c2.compress_fused(layer, projected, batch, fused_pools)
for a, b in ((torch_pools.kv_cache, fused_pools.kv_cache), (torch_pools.index_k, fused_pools.index_k)):
    torch.testing.assert_close(b[1:].float(), a[1:].float(), rtol=2**-6, atol=2**-6)  # slot 0: the torch path's spare stores
untouched = c2.Pools(cfg, 4, alloc.kv_slots).poison(1234.0).kv_cache
assert int((fused_pools.kv_cache != untouched).any(dim=1).sum()) == 5  # the 5 groups stored
print("fused == torch")
"""


def _run(code: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **env_extra}
    if "TRITON_INTERPRET" not in env_extra:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@CPU_ONLY
def test_triton_imported_first_stops_with_one_line():
    out = _run(PROGRAM)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: c2graph: Triton was imported before c2graph")
    assert "import c2graph before triton" in last and "TRITON_INTERPRET=1" in last
    assert out.stdout == ""  # it stopped at the import, before anything ran


@CPU_ONLY
def test_triton_imported_first_with_the_variable_set_runs_interpreted():
    out = _run(PROGRAM, TRITON_INTERPRET="1")
    assert out.returncode == 0, out.stderr
    assert "interpreted (TRITON_INTERPRET=1)" in out.stdout.splitlines()[0]
    assert out.stdout.strip().endswith("fused == torch")


@CPU_ONLY
def test_the_variable_set_to_0_keeps_triton_compiling_for_tools():
    """A tool that compiles the kernels for a GPU target (benchmarks/registers.py) sets it to 0."""
    out = _run("import triton\nimport c2graph as c2\nprint(c2.INTERPRET, c2.banner())", TRITON_INTERPRET="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False") and "compiled" in out.stdout
