"""A ratio-2 source layer: seeded weights and the source projection (docs/design.md, step 1 of the math)."""

from __future__ import annotations

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import as_device, as_int, check_type
from .config import Config


def rope_inv_freq(cfg: Config, device=None) -> torch.Tensor:
    """``theta ** (-2i / rope_dim)`` for ``0 <= i < rope_dim / 2``: ``[rope_dim // 2]`` fp32."""
    i2 = torch.arange(0, cfg.rope_dim, 2, dtype=torch.float32, device=device)
    return torch.pow(torch.tensor(cfg.rope_theta, dtype=torch.float32, device=device), -i2 / cfg.rope_dim)


class SourceLayer:
    """Weights of one c2 source layer. No checkpoint: seeded random tensors.

    - ``wkv``, ``wgate``: ``[D, hidden]`` bf16 (kv and per-channel score projections)
    - ``wkv_gate``: ``[2D, hidden]`` bf16, ``cat(wkv, wgate)``, used when ``use_fused_gate``
    - ``norm_w``: ``[D]`` bf16, the latent's RMSNorm weight
    - ``wk``: ``[index_dim, D]`` bf16, the index-key projection; ``k_norm_w``: ``[index_dim]`` bf16
    - ``inv_freq``: ``[rope_dim // 2]`` fp32, RoPE's frequencies (latent and index key)
    """

    def __init__(self, cfg: Config, seed: int = 0, *, use_fused_gate: bool = True, device=None):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
        self.cfg = cfg
        self.use_fused_gate = bool(use_fused_gate)
        self.device = as_device("device", device, DEFAULT_DEVICE)
        g = torch.Generator().manual_seed(as_int("seed", seed))

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=g) / cols**0.5
            return w.to(torch.bfloat16).to(self.device)

        def norm_weight(n: int) -> torch.Tensor:
            w = 1.0 + 0.1 * torch.randn(n, generator=g)
            return w.to(torch.bfloat16).to(self.device)

        self.wkv = weight(cfg.D, cfg.hidden)
        # Scores spread over a few units, so the gate's weights are far from 1/2.
        self.wgate = (weight(cfg.D, cfg.hidden).float() * 3.0).to(torch.bfloat16)
        self.norm_w = norm_weight(cfg.D)
        self.wk = weight(cfg.index_dim, cfg.D)
        self.k_norm_w = norm_weight(cfg.index_dim)
        self.wkv_gate = torch.cat([self.wkv, self.wgate], dim=0)
        self.inv_freq = rope_inv_freq(cfg, self.device)

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"SourceLayer(hidden={c.hidden}, D={c.D}, index_dim={c.index_dim}, "
            f"use_fused_gate={self.use_fused_gate}, device={self.device.type})"
        )

    def random_hidden(self, rows: int, seed: int) -> torch.Tensor:
        """Random hidden states ``[rows, hidden]`` bf16 on the layer's device."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(rows, self.cfg.hidden, generator=g).to(torch.bfloat16).to(self.device)


PROJECTIONS = ("exact", "engine")
"""How the source projection's GEMM runs (:func:`project_rows`): ``"exact"``, float64, the same bits
for a row whatever the rows beside it (the notebooks and the tests compare with it); ``"engine"``,
a bf16 GEMM with fp32 output, as the serving engine runs it."""


def _matmul_bf16_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` with bf16 operands and an fp32 result (``[T, N]`` fp32).

    Accumulated in float64: each bf16 product is exact there (8 + 8 significant bits < 53), and
    a sum of ``hidden`` of them is exact while the products' exponents span at most
    ``53 - 16 - log2(hidden)`` bits (see :mod:`c2graph.compressor.torch_path` for where that
    holds). The result is rounded once to fp32, and it is computed row by row the same way
    whatever the number of rows, so a row's output does not depend on how many rows share the
    GEMM. (A bf16 GEMM with fp32 output, as the engine runs, picks its algorithm by the row count,
    and its last bits can change with it.)
    """
    return (x.double() @ w.double().T).float()


def _matmul_engine(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T`` as the engine runs it: one bf16 GEMM accumulating in fp32, its fp32 result
    written straight into ``out`` where given. On CUDA, cuBLAS through ``torch.mm(..., out_dtype=
    torch.float32)``; a CPU has no such GEMM, so there the bf16 values are widened to fp32 first
    (the same products, exact in fp32, summed in fp32)."""
    if x.is_cuda:
        return torch.mm(x, w.T, out_dtype=torch.float32, out=out)
    y = x.float() @ w.float().T
    return y if out is None else out.copy_(y)


def project_rows(x: torch.Tensor, w: torch.Tensor, projection: str = "exact",
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T`` (``[T, hidden]`` bf16 times ``[N, hidden]`` bf16 -> ``[T, N]`` fp32) the way
    ``projection`` names (:data:`PROJECTIONS`), into ``out`` (``[T, N]`` fp32, contiguous) where
    given. Checks nothing but ``projection``: :func:`project` and :func:`project_fused` check their
    arguments first."""
    if projection == "engine":
        return _matmul_engine(x, w, out)
    if projection != "exact":
        raise ValueError(f"projection = {projection!r}; expected one of {PROJECTIONS}")
    y = _matmul_bf16_fp32(x, w)
    return y if out is None else out.copy_(y)


def check_hidden(layer: SourceLayer, x: torch.Tensor) -> None:
    """``x`` is ``[T, hidden]`` bf16 on the layer's device (and ``layer`` a :class:`SourceLayer`)."""
    check_type("layer", layer, SourceLayer, "a c2graph.SourceLayer")
    cfg = layer.cfg
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != cfg.hidden:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x has shape {shape}; expected [T, hidden={cfg.hidden}]")
    check_on_layer("x", x, torch.bfloat16, layer)


def check_on_layer(name: str, t: torch.Tensor, dtype: torch.dtype, layer: SourceLayer) -> None:
    """``t`` (named ``name``) has ``dtype`` and lives on the layer's device."""
    if t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; expected {dtype}")
    if t.device.type != layer.device.type:
        raise ValueError(f"{name} is on {t.device}; expected the layer's device ({layer.device})")


def project(layer: SourceLayer, x: torch.Tensor, *, projection: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused source projection: ``kv = x @ wkv.T``, ``score = x @ wgate.T``.

    ``x``: ``[T, hidden]`` bf16 -> ``(kv, score)``: ``[T, D]`` fp32 each (two separate buffers).
    ``projection``: how the GEMMs run (:data:`PROJECTIONS`).
    """
    check_hidden(layer, x)
    return project_rows(x, layer.wkv, projection), project_rows(x, layer.wgate, projection)


def project_fused(layer: SourceLayer, x: torch.Tensor, out: torch.Tensor | None = None, *,
                  projection: str = "exact") -> torch.Tensor:
    """The fused-gate source projection: one GEMM with ``wkv_gate``.

    ``x``: ``[T, hidden]`` bf16 -> ``[T, 2D]`` fp32 whose halves are ``| kv | score |``.
    With ``out`` (``[>= T, 2D]`` fp32, on the layer's device) the rows are written into ``out[:T]``.
    ``projection``: how the GEMM runs (:data:`PROJECTIONS`).
    """
    check_hidden(layer, x)
    if out is not None:
        D2, T = 2 * layer.cfg.D, x.shape[0]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] < T or out.shape[1] != D2:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"out has shape {shape}; expected [>= {T}, 2D = {D2}] (at least x's {T} rows)")
        check_on_layer("out", out, torch.float32, layer)
    if projection not in PROJECTIONS:
        raise ValueError(f"projection = {projection!r}; expected one of {PROJECTIONS}")
    if out is None:
        return project_rows(x, layer.wkv_gate, projection)
    project_rows(x, layer.wkv_gate, projection, out=out[: x.shape[0]])
    return out


def split_projected(projected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the ``| kv | score |`` buffer: ``[T, 2D]`` -> ``(kv [T, D], score [T, D])``."""
    if not isinstance(projected, torch.Tensor) or projected.dim() != 2 or projected.shape[1] % 2:
        shape = tuple(projected.shape) if isinstance(projected, torch.Tensor) else type(projected).__name__
        raise ValueError(f"projected has shape {shape}; expected [T, 2D], an even number of columns | kv | score |")
    D = projected.shape[1] // 2
    return projected[:, :D], projected[:, D:]
