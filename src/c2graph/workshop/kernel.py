"""The checks behind notebook 02's exercise: one stage of the fused kernel, written by the reader.

:func:`check_gate` takes the reader's gate, a ``@triton.jit`` function
``gate(kv_prev, score_prev, kv, score) -> pooled`` on ``[rows, D]`` fp32 tiles, runs it inside a
one-program kernel (Triton's interpreter on a CPU, compiled on a GPU), and compares what it
returns with the torch path's :func:`~c2graph.compressor.torch_path.gate`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from matplotlib.figure import Figure

from .._runtime import DEFAULT_DEVICE
from ..compressor.pools import POISON
from ..compressor.torch_path import gate as torch_gate
from .check import CheckResult, run_check

ROWS, D = 16, 32
"""The tile the check runs: 16 rows (``tl.dot``'s smallest, as in the kernel) of 32 channels."""
TOLERANCE = 1e-5
"""Relative and absolute: ``exp`` and division may differ in the last bits between numpy, the GPU and torch."""


@triton.jit
def _gate_harness(kv_prev_ptr, score_prev_ptr, kv_ptr, score_ptr, out_ptr,
                  ROWS: tl.constexpr, D: tl.constexpr, GATE: tl.constexpr):
    # One program: load four [ROWS, D] fp32 tiles (row-major), call the reader's gate, store its tile.
    offs = tl.arange(0, ROWS)[:, None] * D + tl.arange(0, D)[None, :]
    pooled = GATE(tl.load(kv_prev_ptr + offs), tl.load(score_prev_ptr + offs),
                  tl.load(kv_ptr + offs), tl.load(score_ptr + offs))
    tl.store(out_ptr + offs, pooled)


def _run(fn, kv_prev, score_prev, kv, score) -> torch.Tensor:
    out = torch.full_like(kv, POISON)
    try:
        _gate_harness[(1,)](kv_prev, score_prev, kv, score, out, ROWS=ROWS, D=D, GATE=fn)
    except Exception as e:  # the interpreter and the compiler wrap the reader's own exception
        cause = e
        while cause is not None and not isinstance(cause, NotImplementedError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None or "NotImplementedError" in str(e):  # compiled: only its text is left
            raise NotImplementedError(*(cause.args if cause is not None else ())) from e
        raise
    return out


def _cases(seed: int) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
    """``(what, (kv_prev, score_prev, kv, score))``: fresh random tiles on the default device."""
    g = torch.Generator().manual_seed(seed)

    def rand(scale=1.0):
        return (scale * torch.randn(ROWS, D, generator=g)).to(DEFAULT_DEVICE)

    big = 80.0 + 40.0 * torch.rand(ROWS, D, generator=g)
    sign = torch.where(torch.rand(ROWS, D, generator=g) < 0.5, -1.0, 1.0)
    return [
        ("scores a few units apart", (rand(), rand(3.0), rand(), rand(3.0))),
        ("scores of +-80 to 120 (exp overflows fp32 unless the larger score is subtracted first)",
         (rand(), (sign * big).to(DEFAULT_DEVICE), rand(), (-sign * big + rand(2.0).cpu()).to(DEFAULT_DEVICE))),
        ("the partner is the ring's sentinel (kv 0, score -inf): pooled must be kv itself",
         (torch.zeros(ROWS, D, device=DEFAULT_DEVICE), torch.full((ROWS, D), float("-inf"), device=DEFAULT_DEVICE),
          rand(), rand(3.0))),
    ]


def _differences(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``[ROWS, D]`` bool: where ``got`` is not within ``TOLERANCE`` of ``want`` (NaN never is)."""
    got, want = got.cpu().double(), want.cpu().double()
    return ~((got - want).abs() <= TOLERANCE * (1 + want.abs()))


def _picture(bad: torch.Tensor, what: str) -> Figure:
    fig = Figure(figsize=(6.4, 2.6), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(bad.numpy(), cmap="Reds", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("channel")
    ax.set_ylabel("row")
    ax.set_title(f"red: values that differ from the torch path's gate\n({what})", fontsize=10)
    return fig


def check_gate(fn, seed: int = 0) -> CheckResult:
    """Check the reader's ``@triton.jit`` gate against the torch path's, on three kinds of tiles.

    Says pass, or which case failed, how many of the ``16 x 32`` values differ and the first of
    them; a picture marks every differing value of the first failed case. Never raises for a
    wrong or unfinished ``fn``.
    """
    failed: list[tuple[torch.Tensor, str]] = []

    def cases():
        if not isinstance(fn, triton.runtime.jit.KernelInterface):
            return [(False, f"{getattr(fn, '__name__', fn)!s} is not a Triton function: decorate it with @triton.jit")]
        if "raise NotImplementedError" in getattr(fn, "src", ""):
            # a student copy's stub: the compiler would only report that it cannot compile a raise
            raise NotImplementedError("the gate still raises NotImplementedError")
        results = []
        for what, tiles in _cases(seed):
            got, want = _run(fn, *tiles), torch_gate(*tiles)
            bad = _differences(got, want)
            if not bad.any():
                results.append((True, f"{what}: all {bad.numel()} values match"))
                continue
            r, c = (int(i) for i in bad.nonzero()[0])
            results.append((False, f"{what}: {int(bad.sum())} of {bad.numel()} values differ; first at row {r}, "
                                   f"channel {c}: got {float(got[r, c]):.6g}, expected {float(want[r, c]):.6g}"))
            failed.append((bad, what))
        return results

    return run_check("gate (a @triton.jit stage)", cases, figure=lambda: _picture(*failed[0]) if failed else None)
