"""A ratio-2 source layer: seeded weights and the source projection (docs/design.md, step 1 of the math)."""

from __future__ import annotations

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import (_shape, as_device, as_int, check_fits_memory, check_no_overlap, check_plain, check_type,
                        same_device)
from .config import Config


def rope_inv_freq(cfg: Config, device=None) -> torch.Tensor:
    """``theta ** (-2i / rope_dim)`` for ``0 <= i < rope_dim / 2``: ``[rope_dim // 2]`` fp32."""
    i2 = torch.arange(0, cfg.rope_dim, 2, dtype=torch.float32, device=device)
    return torch.pow(torch.tensor(cfg.rope_theta, dtype=torch.float32, device=device), -i2 / cfg.rope_dim)


COMPRESSOR_WEIGHTS = ("norm_w", "wk", "k_norm_w", "inv_freq")
"""The layer's tensors both paths of the compressor read (the projection reads ``wkv``, ``wgate``
or ``wkv_gate``)."""


class SourceLayer:
    """Weights of one c2 source layer. No checkpoint: seeded random tensors.

    - ``wkv``, ``wgate``: ``[D, hidden]`` bf16 (kv and per-channel score projections)
    - ``wkv_gate``: ``[2D, hidden]`` bf16, ``cat(wkv, wgate)``, used when ``use_fused_gate``;
      derived, never set: read, it is derived again whenever ``wkv`` or ``wgate`` was rebound or
      written in place since (their version counters tell), so it never holds stale weights; a
      write into ``wkv_gate`` itself is refused when it is next read (write ``wkv`` and ``wgate``)
    - ``norm_w``: ``[D]`` bf16, the latent's RMSNorm weight
    - ``wk``: ``[index_dim, D]`` bf16, the index-key projection; ``k_norm_w``: ``[index_dim]`` bf16
    - ``inv_freq``: ``[rope_dim // 2]`` fp32, RoPE's frequencies (latent and index key)
    - ``use_fused_gate``: fixed when the layer is made (the buffers, pools and graphs built for a
      layer follow its path); setting it is refused: make another layer

    Its tensors may be rebound or written in place; every path checks them (:func:`check_layer`:
    shapes, dtypes, device, outside autograd) before it writes anything. A layer made under
    ``torch.inference_mode()`` holds normal tensors, usable outside it.
    """

    def __init__(self, cfg: Config, seed: int = 0, *, use_fused_gate: bool = True, device=None):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
        if use_fused_gate not in (True, False):
            raise ValueError(f"use_fused_gate = {use_fused_gate!r}; expected True or False")
        seed = as_int("seed", seed, least=-(2**63), below=2**64, below_is="2**64 (what torch.manual_seed takes)")
        device = as_device("device", device, DEFAULT_DEVICE)
        weights = 2 * (4 * cfg.D * cfg.hidden + cfg.index_dim * cfg.D + cfg.D + cfg.index_dim)
        sizes = f"cfg.D = {cfg.D} with cfg.hidden = {cfg.hidden} and cfg.index_dim = {cfg.index_dim}"
        check_fits_memory(sizes, weights, device, "the layer's bf16 weights")
        check_fits_memory(sizes, 4 * cfg.D * max(cfg.hidden, cfg.index_dim), torch.device("cpu"),
                          "a weight drawn in fp32 on the host")
        self.cfg = cfg
        self._use_fused_gate = bool(use_fused_gate)
        self.device = device
        g = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=g) / cols**0.5
            return w.to(torch.bfloat16).to(self.device)

        def norm_weight(n: int) -> torch.Tensor:
            w = 1.0 + 0.1 * torch.randn(n, generator=g)
            return w.to(torch.bfloat16).to(self.device)

        with torch.inference_mode(False):  # normal tensors, whatever the caller's mode
            self.wkv = weight(cfg.D, cfg.hidden)
            # Scores spread over a few units, so the gate's weights are far from 1/2.
            self.wgate = (weight(cfg.D, cfg.hidden).float() * 3.0).to(torch.bfloat16)
            self.norm_w = norm_weight(cfg.D)
            self.wk = weight(cfg.index_dim, cfg.D)
            self.k_norm_w = norm_weight(cfg.index_dim)
            self.inv_freq = rope_inv_freq(cfg, self.device)
        self._derived: tuple = ()  # (wkv, its version, wgate, its version, wkv_gate, its version)

    @property
    def use_fused_gate(self) -> bool:
        """Whether the layer projects with ``wkv_gate`` into one ``| kv | score |`` buffer and runs
        the fused path (fixed when the layer is made)."""
        return self._use_fused_gate

    @use_fused_gate.setter
    def use_fused_gate(self, value) -> None:
        raise ValueError(f"layer.use_fused_gate = {value!r} after the layer was made; expected it unchanged: "
                         "the buffers, pools and graphs built for a layer follow its path (make another "
                         "SourceLayer(cfg, seed, use_fused_gate=...))")

    @property
    def wkv_gate(self) -> torch.Tensor:
        """``cat(wkv, wgate)``: ``[2D, hidden]`` bf16, derived again when either changed since."""
        wkv, wgate = self.wkv, self.wgate
        d = self._derived
        versions = (_version(wkv), _version(wgate))
        if d and d[0] is wkv and d[2] is wgate and None not in versions and (d[1], d[3]) == versions:
            if _version(d[4]) != d[5]:
                raise ValueError("layer.wkv_gate was written in place; expected it unchanged: it is derived "
                                 "from layer.wkv and layer.wgate (write those instead)")
            return d[4]
        check_layer(self, ("wkv", "wgate"))
        with torch.inference_mode(False):
            fused = torch.cat([wkv, wgate], dim=0)
        self._derived = (wkv, _version(wkv), wgate, _version(wgate), fused, _version(fused))
        return fused

    @wkv_gate.setter
    def wkv_gate(self, value) -> None:
        raise ValueError("layer.wkv_gate is derived from layer.wkv and layer.wgate (cat along rows); expected "
                         "it unset: set or write layer.wkv and layer.wgate instead")

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"SourceLayer(hidden={c.hidden}, D={c.D}, index_dim={c.index_dim}, "
            f"use_fused_gate={self.use_fused_gate}, device={self.device.type})"
        )

    def random_hidden(self, rows: int, seed: int) -> torch.Tensor:
        """Random hidden states ``[rows, hidden]`` bf16 on the layer's device."""
        rows = as_int("rows", rows, least=0)
        check_fits_memory(f"rows = {rows}", 6 * rows * self.cfg.hidden, torch.device("cpu"), "the hidden states")
        seed = as_int("seed", seed, least=-(2**63), below=2**64, below_is="2**64 (what torch.manual_seed takes)")
        g = torch.Generator().manual_seed(seed)
        return torch.randn(rows, self.cfg.hidden, generator=g).to(torch.bfloat16).to(self.device)


PROJECTIONS = ("exact", "engine")
"""How the source projection's GEMM runs (:func:`project_rows`): ``"exact"``, float64, the same bits
for a row whatever the rows beside it (the notebooks and the tests compare with it); ``"engine"``,
a bf16 GEMM with fp32 output, as the serving engine runs it."""


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place write); ``None`` for an inference tensor,
    which keeps none (a layer holding one derives ``wkv_gate`` on every read)."""
    return None if t.is_inference() else t._version


def layer_tensors(layer: SourceLayer) -> dict[str, torch.Tensor]:
    """Every tensor the layer holds, by name: its weights, and ``wkv_gate`` once derived (no tensor
    is derived here)."""
    tensors = {name: getattr(layer, name) for name in ("wkv", "wgate", *COMPRESSOR_WEIGHTS)}
    if layer._derived:
        tensors["wkv_gate"] = layer._derived[4]
    return tensors


def layer_shapes(cfg: Config) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every tensor a :class:`SourceLayer` of ``cfg`` holds: name -> (shape, dtype)."""
    bf16 = torch.bfloat16
    return {
        "wkv": ((cfg.D, cfg.hidden), bf16), "wgate": ((cfg.D, cfg.hidden), bf16),
        "norm_w": ((cfg.D,), bf16), "wk": ((cfg.index_dim, cfg.D), bf16), "k_norm_w": ((cfg.index_dim,), bf16),
        "inv_freq": ((cfg.rope_dim // 2,), torch.float32),
    }


def check_layer(layer: SourceLayer, names=None) -> None:
    """The layer's tensors (``names``, default all but the derived ``wkv_gate``) are what its Config
    says: shape, dtype, on the layer's device, outside autograd. A tensor rebound or resized after
    the layer was made (``inv_freq`` of another length, weights on another device) is refused
    before any path reads it. Reads no tensor value."""
    check_type("layer", layer, SourceLayer, "a c2graph.SourceLayer")
    if not isinstance(layer.cfg, Config):
        raise ValueError(f"layer.cfg is a {type(layer.cfg).__name__}; expected a c2graph.Config")
    if not isinstance(layer.device, torch.device):
        raise ValueError(f"layer.device = {layer.device!r}; expected the torch.device the layer was made on")
    shapes = layer_shapes(layer.cfg)
    for name in names or shapes:
        shape, dtype = shapes[name]
        t = getattr(layer, name)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"layer.{name} has shape {_shape(t)}; expected {list(shape)} (from layer.cfg)")
        if t.dtype != dtype:
            raise ValueError(f"layer.{name} has dtype {t.dtype}; expected {dtype}")
        if not same_device(t.device, layer.device):
            raise ValueError(f"layer.{name} is on {t.device}; expected the layer's device ({layer.device})")
        check_plain(f"layer.{name}", t)


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
    if (type(x) is torch.Tensor and type(layer) is SourceLayer and x.dtype is torch.bfloat16 and x.dim() == 2
            and x.shape[1] == layer.cfg.hidden and x.device == layer.device and not x.requires_grad):
        return  # the common case, in few steps
    check_type("layer", layer, SourceLayer, "a c2graph.SourceLayer")
    cfg = layer.cfg
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != cfg.hidden:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x has shape {shape}; expected [T, hidden={cfg.hidden}]")
    check_on_layer("x", x, torch.bfloat16, layer)


def check_on_layer(name: str, t: torch.Tensor, dtype: torch.dtype, layer: SourceLayer, *,
                   written: bool = False) -> None:
    """``t`` (named ``name``) has ``dtype``, lives on the layer's device and is outside autograd;
    ``written`` (an output): dense too, and no inference tensor outside inference mode."""
    if t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; expected {dtype}")
    if not same_device(t.device, layer.device):
        raise ValueError(f"{name} is on {t.device}; expected the layer's device ({layer.device})")
    check_plain(name, t, written=written)
    if written and not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {t.stride()}); expected a dense row-major tensor "
                         "(it is written in place)")


def project(layer: SourceLayer, x: torch.Tensor, *, projection: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused source projection: ``kv = x @ wkv.T``, ``score = x @ wgate.T``.

    ``x``: ``[T, hidden]`` bf16 -> ``(kv, score)``: ``[T, D]`` fp32 each (two separate buffers).
    ``projection``: how the GEMMs run (:data:`PROJECTIONS`).
    """
    check_hidden(layer, x)
    check_layer(layer, ("wkv", "wgate"))
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
        check_on_layer("out", out, torch.float32, layer, written=True)
    if projection not in PROJECTIONS:
        raise ValueError(f"projection = {projection!r}; expected one of {PROJECTIONS}")
    weight = layer.wkv_gate  # checked when derived
    if out is not None:
        check_no_overlap({"out": out}, {"x": x, "layer.wkv_gate": weight})
    if out is None:
        return project_rows(x, weight, projection)
    project_rows(x, weight, projection, out=out[: x.shape[0]])
    return out


def split_projected(projected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the ``| kv | score |`` buffer: ``[T, 2D]`` -> ``(kv [T, D], score [T, D])``."""
    if not isinstance(projected, torch.Tensor) or projected.dim() != 2 or projected.shape[1] % 2:
        shape = tuple(projected.shape) if isinstance(projected, torch.Tensor) else type(projected).__name__
        raise ValueError(f"projected has shape {shape}; expected [T, 2D], an even number of columns | kv | score |")
    D = projected.shape[1] // 2
    return projected[:, :D], projected[:, D:]
