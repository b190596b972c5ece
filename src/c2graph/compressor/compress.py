"""One eager entry point: from hidden states to written caches, by the layer's own path.

:func:`compress` does what the engine does for one source layer in eager prefill: the source
projection of the live rows into a zero-padded buffer of the batch's rows, then the compressor.
A layer with the fused gate projects into one ``| kv | score |`` buffer and runs the fused path
(one launch); a layer without it projects into separate ``kv`` and ``score`` buffers and runs the
torch path.
"""

from __future__ import annotations

import torch

from .arguments import check_type
from .batch import ExtendBatch
from .checks import check_latent_out, check_layer_batch_pools
from .fused import compress_fused
from .pools import Pools
from .source_layer import SourceLayer, check_hidden, project, project_fused, split_projected
from .torch_path import compress_torch

PATHS = ("torch", "fused")


def layer_path(layer: SourceLayer) -> str:
    """``"fused"`` for a layer with the fused gate, ``"torch"`` for one without."""
    return "fused" if layer.use_fused_gate else "torch"


def project_padded(layer: SourceLayer, x: torch.Tensor, batch: ExtendBatch, *, fused: bool | None = None):
    """The source projection of the live rows, zero-padded to the batch's rows.

    ``x``: ``[live_rows, hidden]`` bf16. Returns one ``[T, 2D]`` fp32 ``| kv | score |`` buffer
    (``fused``, the default for a layer with the fused gate) or ``(kv, score)``, ``[T, D]`` fp32 each.
    """
    check_hidden(layer, x)
    check_type("batch", batch, ExtendBatch, "a c2graph.ExtendBatch (ExtendBatch.build makes one)")
    live, T, D = batch.live_rows, batch.num_rows, layer.cfg.D
    if x.shape[0] != live:
        raise ValueError(f"x has {x.shape[0]} rows; expected the batch's {live} live rows")
    fused = layer.use_fused_gate if fused is None else fused
    f32 = dict(dtype=torch.float32, device=batch.device)
    if fused:
        return project_fused(layer, x, out=torch.zeros(T, 2 * D, **f32))
    kv, score = torch.zeros(T, D, **f32), torch.zeros(T, D, **f32)
    kv[:live], score[:live] = project(layer, x)
    return kv, score


def compress(
    layer: SourceLayer,
    x: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    path: str | None = None,
    latent_out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Compress one extend batch from its hidden states: write ``pools.kv_cache``, ``pools.index_k``, ``pools.ring``.

    ``x``: ``[live_rows, hidden]`` bf16, the hidden states of the batch's live rows (padding rows
    get a zero projection). ``path``: ``"torch"`` or ``"fused"``; by default the layer's own
    (:func:`layer_path`). The fused path needs a layer with the fused gate; the torch path runs
    on any layer. Returns the pre-RoPE latents ``[T, D]`` bf16, written on group rows only.
    ``validate``: check the batch against itself and the pools on the host first (a sync;
    :meth:`ExtendBatch.check`), as both paths do by default.
    """
    check_type("layer", layer, SourceLayer, "a c2graph.SourceLayer")
    check_type("batch", batch, ExtendBatch, "a c2graph.ExtendBatch (ExtendBatch.build makes one)")
    check_type("pools", pools, Pools, "a c2graph.Pools")
    check_layer_batch_pools(layer, batch, pools)  # before the projection: what the paths check again
    check_latent_out(latent_out, batch.num_rows, layer.cfg.D, pools.device)
    path = layer_path(layer) if path is None else path
    if not isinstance(path, str) or path not in PATHS:
        raise ValueError(f"path = {path!r}; expected 'torch', 'fused' or None (the layer's own)")
    if path == "fused":
        if not layer.use_fused_gate:
            raise ValueError(
                "path = 'fused' but layer.use_fused_gate is False; the fused path reads the one "
                "| kv | score | buffer of the fused-gate projection"
            )
        return compress_fused(layer, project_padded(layer, x, batch), batch, pools, latent_out=latent_out,
                              validate=validate)
    projected = project_padded(layer, x, batch)
    kv, score = split_projected(projected) if isinstance(projected, torch.Tensor) else projected
    return compress_torch(layer, kv, score, batch, pools, latent_out=latent_out, validate=validate)
