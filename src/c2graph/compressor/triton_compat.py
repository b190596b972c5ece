"""Three operations that Triton's CPU interpreter gets wrong, each chosen once, at import.

On a machine without CUDA, :mod:`c2graph._runtime` sets ``TRITON_INTERPRET=1`` before Triton is
imported, and every kernel runs in Triton's interpreter (numpy, one program after another). The
interpreter differs from the compiled kernel in three places, so this module defines each of
them twice and keeps the version that is exact where the kernel runs:

- :func:`to_bf16`: the interpreter's ``x.to(tl.bfloat16)`` truncates; torch and the GPU round to
  nearest even. The interpreted version rounds the bits first, so the cast is exact.
- :func:`dot`: the interpreter's ``tl.dot`` on bf16 operands is wrong. There the operands are
  widened to fp32 (exact: every bf16 is an fp32) and multiplied in full fp32 (``"ieee"``: an
  fp32 ``tl.dot`` would otherwise use tf32). On the GPU the bf16 operands go to the tensor cores
  as they are: exact products, fp32 accumulation.
- :func:`cos`, :func:`sin`: on the GPU, ``libdevice``'s versions, whose range reduction is exact
  for the thousands of radians RoPE reaches; ``tl.cos`` may use a fast approximation there. The
  interpreter has no ``libdevice``: ``tl.cos`` is numpy's, which is exact.

The kernel calls ``to_bf16``, ``dot``, ``cos`` and ``sin`` and never asks which machine it is on.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._runtime import INTERPRET

if INTERPRET:

    @triton.jit
    def to_bf16(x):
        """fp32 -> bf16, round to nearest even, written out (the interpreter's cast truncates)."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # carry into bit 16 when the low half rounds up
        rounded = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(x == x, rounded, x).to(tl.bfloat16)  # NaN stays NaN

    @triton.jit
    def dot(a, b, acc):
        """``acc + a @ b``: bf16 operands widened to fp32, multiplied and summed in fp32."""
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")

    @triton.jit
    def cos(x):
        return tl.cos(x)

    @triton.jit
    def sin(x):
        return tl.sin(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def to_bf16(x):
        """fp32 -> bf16, round to nearest even (the GPU's own conversion)."""
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne")

    @triton.jit
    def dot(a, b, acc):
        """``acc + a @ b``: bf16 operands on the tensor cores, fp32 accumulation."""
        return tl.dot(a, b, acc)

    @triton.jit
    def cos(x):
        return libdevice.cos(x)

    @triton.jit
    def sin(x):
        return libdevice.sin(x)
