"""One call after every step: ``compare(got, want)`` says pass, or which rows or slots differ.

Used by the notebooks and the tests alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Comparison:
    """The outcome of :func:`compare`: ``ok``, and the first-dim indices (rows, slots) that differ.

    ``skipped`` says which rows were left out of the comparison and why (printed with the result).
    """

    name: str
    ok: bool
    bad: list[int] = field(default_factory=list)
    total: int = 0
    max_abs_err: float = 0.0
    tolerance: str = "bitwise"
    skipped: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        skipped = f"; {self.skipped}" if self.skipped else ""
        if self.ok:
            return f"{self.name}: pass ({self.total} {self._unit()} {self.tolerance}{skipped})"
        shown = ", ".join(map(str, self.bad[:12])) + (", ..." if len(self.bad) > 12 else "")
        return (
            f"{self.name}: FAIL, {len(self.bad)} of {self.total} {self._unit()} differ "
            f"({self.tolerance}; max |err| {self.max_abs_err:.3g}{skipped}): [{shown}]"
        )

    __repr__ = __str__

    def _unit(self) -> str:
        return "slots" if "cache" in self.name or "index_k" in self.name else "rows"


def compare(
    got: torch.Tensor,
    want: torch.Tensor,
    name: str = "tensor",
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    rows: torch.Tensor | slice | None = None,
    skipped: str = "",
) -> Comparison:
    """Compare two tensors row by row (first dim). Bitwise when ``rtol == atol == 0``.

    ``got``, ``want``: ``[N, ...]`` of one shape, any dtype (the bits of their own dtype are
    compared bitwise; values in float64 within a tolerance).

    NaN equals NaN in the same place (an untouched row stays NaN in both). ``rows`` restricts
    the comparison to some rows (a bool mask, an index tensor, or a slice); ``skipped`` says, for
    the printed result, which rows that leaves out and why.
    """
    if got.shape != want.shape:
        raise ValueError(f"{name}: shapes differ, {tuple(got.shape)} vs {tuple(want.shape)}")
    g, w = got.detach().cpu(), want.detach().cpu()
    index = torch.arange(g.shape[0])
    if rows is not None:
        g, w, index = g[rows], w[rows], index[rows]
    if rtol == 0 and atol == 0:
        # bitwise: compare the bytes, so -0.0 vs 0.0 and NaN payloads count too
        gb, wb = bits_of(g), bits_of(w)
        row_bad = _any_per_row(gb != wb)
        tol = "bitwise"
    else:
        gf, wf = g.double(), w.double()
        both_nan = gf.isnan() & wf.isnan()
        close = ((gf - wf).abs() <= atol + rtol * wf.abs()) | both_nan
        row_bad = _any_per_row(~close)
        tol = f"rtol={rtol:g}, atol={atol:g}"
    diff = (g.double() - w.double()).abs()
    diff = diff[~diff.isnan()]
    err = float(diff.max()) if diff.numel() else 0.0
    bad = index[row_bad].tolist()
    return Comparison(name, not bad, bad, int(index.numel()), err, tol, skipped)


def _any_per_row(mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: whether any element of each first-dim row is set (also for empty selections)."""
    if mask.numel() == 0:
        return torch.zeros(mask.shape[0] if mask.dim() else 0, dtype=torch.bool)
    return mask.reshape(mask.shape[0], -1).any(dim=1)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of its width (float32 -> int32, bf16 -> int16, ...)."""
    if t.dtype in (torch.float32, torch.int32):
        return t.contiguous().view(torch.int32)
    if t.dtype in (torch.bfloat16, torch.float16, torch.int16):
        return t.contiguous().view(torch.int16)
    if t.dtype in (torch.float64, torch.int64):
        return t.contiguous().view(torch.int64)
    return t


SLOT0_SKIPPED = "c2 slot 0 skipped: the torch path's dump slot"


def compare_pools(got, want, *, rtol: float = 0.0, atol: float = 0.0, skip_slot0: bool = True) -> list[Comparison]:
    """Compare the caches (within ``rtol``/``atol``) and the ring (always bitwise) of two :class:`Pools`:
    ``kv_cache`` ``[kv_slots, D]`` bf16 and ``index_k`` ``[kv_slots, I]`` bf16 slot by slot, ``ring``
    ``[pool_requests * ring_size + 1, 2D]`` fp32 row by row.

    c2 slot 0 is skipped by default, and the printed result says so: it belongs to the reserved
    page, and the torch path sends its unwanted stores there.
    """
    rows = slice(1, None) if skip_slot0 else None
    skipped = SLOT0_SKIPPED if skip_slot0 else ""
    return [
        compare(got.kv_cache, want.kv_cache, "kv_cache", rtol=rtol, atol=atol, rows=rows, skipped=skipped),
        compare(got.index_k, want.index_k, "index_k", rtol=rtol, atol=atol, rows=rows, skipped=skipped),
        compare(got.ring, want.ring, "ring"),
    ]
