"""One of two modules that each define a Triton kernel named ``_fwd_kernel`` (tests/test_audit_programs.py)."""

import c2graph  # noqa: F401  (first: decides TRITON_INTERPRET before Triton is imported)
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """``out = x * 2`` on the first ``n`` elements."""
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)
