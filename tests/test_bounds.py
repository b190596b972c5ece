"""``benchmarks/bounds.py``: the simpler kernels timed beside the fused one compute what they claim.

Each is launched on fresh random rows and compared with torch by the script's own check (under
Triton's interpreter on a CPU, compiled on a GPU); the check must also catch one wrong value.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import c2graph  # noqa: F401  (sets up Triton's interpreter on a machine without a GPU)

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
KINDS = ["stream.g8.c64.w4.st2", "stream.g4.c128.w4.st3", "sketch.default", "sketch.g16.c64.k64.w4.st3.a3.h1",
         "sketchA.default", "sketchAB.default", "split2.default", "split8.g8.c64.k64.w8.st3.a4",
         "super4.default", "super2.g8.c64.k64.w8.st3.a4"]


@pytest.fixture(scope="module")
def bounds():
    sys.path.insert(0, BENCHMARKS)
    try:
        import bounds
        import sweep
    finally:
        sys.path.remove(BENCHMARKS)
    return bounds, sweep


@pytest.fixture(scope="module")
def case(bounds):
    _, sweep = bounds
    device = "cuda" if torch.cuda.is_available() else "cpu"
    saved, sweep.L2_BYTES = sweep.L2_BYTES, 2**16  # a few buffers: the timing's rotation is not tested here
    try:
        return sweep.Case(64, seed=7, device=device)
    finally:
        sweep.L2_BYTES = saved


@pytest.mark.parametrize("variant", KINDS)
def test_kernel_matches_torch_and_the_check_catches_a_wrong_value(bounds, case, variant):
    bounds_module, _ = bounds
    kind, _, spec = variant.partition(".")
    projected = torch.randn(case.rows, 2 * case.cfg.D, device=case.device) * 2
    out = bounds_module.Outputs(case)
    bounds_module.launch(case, kind, spec, projected, out)
    assert bounds_module.check(case, kind, projected, out) == []
    assert (out.latent[1::2].float() != bounds_module.POISON).all()  # every group row written
    out.latent[2 * 5 + 1, 17] += 1.0
    assert any("latent" in problem for problem in bounds_module.check(case, kind, projected, out))


def test_split_columns_give_the_sketchs_bits(bounds, case):
    """Spreading pass A over programs, the last to arrive finishing the block, changes no bit, and
    leaves every block's arrival count a multiple of the slices (so the next launch counts right)."""
    bounds_module, _ = bounds
    projected = torch.randn(case.rows, 2 * case.cfg.D, device=case.device)
    want = bounds_module.Outputs(case)
    bounds_module.launch(case, "sketch", "default", projected, want)
    for slices in (2, 4, 8):
        got = bounds_module.Outputs(case)
        for _ in range(2):
            bounds_module.launch(case, f"split{slices}", "default", projected, got)
        for name in ("latent", "kv_cache", "index_k"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (slices, name)
        assert (got.arrivals % slices == 0).all() and got.arrivals.sum() > 0


@pytest.mark.parametrize("blocks", ["default", "g8.c64.k64.w8.st3.a4"])
def test_super_blocks_count_their_arrivals_and_run_again(bounds, case, blocks):
    """Each super-block's last block to arrive computes its index keys, a short last super-block
    included (here 2 or 4 blocks in a super-block of 8), launch after launch: the counter of a
    super-block of ``n`` blocks grows by ``n`` a launch, and the second launch's caches are right."""
    bounds_module, _ = bounds
    pairs = case.rows // 2
    from variants import Variant, parse_variant

    groups = (parse_variant(blocks) or Variant.default(case.cfg.D, case.rows)).blocks.groups_per_block
    out = bounds_module.Outputs(case)
    for _ in range(2):
        projected = torch.randn(case.rows, 2 * case.cfg.D, device=case.device)
        out.index_k.fill_(bounds_module.POISON)
        bounds_module.launch(case, "super8", blocks, projected, out)
        assert bounds_module.check(case, "super8", projected, out) == []
    assert out.arrivals[0] == 2 * (pairs // groups) and out.arrivals[1:].sum() == 0
