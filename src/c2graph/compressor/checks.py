"""The checks every path runs on its inputs: the layer, the batch and the pools belong together
(Config, device, tensor shapes and dtypes, every index inside the pools), the projected tensors
fit the layer, and no tensor a path writes shares memory with another. Each raises
``ValueError`` naming the argument, its value and what was expected, before anything is
written; none reads a tensor value, so they run inside a capture too.
"""

from __future__ import annotations

import torch

from .arguments import _shape, check_no_overlap, check_tensor, check_type, same_device
from .batch import ROW_TENSORS, ExtendBatch, check_batch_fits
from .pools import Pools
from .source_layer import COMPRESSOR_WEIGHTS, SourceLayer, check_layer, layer_tensors


def check_layer_pools(layer: SourceLayer, pools: Pools, where: str = "") -> None:
    """The pools were made for the layer's Config, on the layer's device."""
    if pools.cfg != layer.cfg:
        raise ValueError(f"{where}pools were made for another Config than the layer's")
    if not same_device(layer.device, pools.device):
        raise ValueError(f"{where}layer is on {layer.device}; expected {pools.device} (the pools' device)")


def check_pools(pools: Pools) -> None:
    """The pools' tensors are still what the pools say: ``kv_cache`` ``[kv_slots, D]`` bf16,
    ``index_k`` ``[kv_slots, index_dim]`` bf16, ``ring`` ``[pool_requests * ring_size + 1, 2D]``
    fp32, on one device, dense, outside autograd, sharing no memory (a tensor rebound to another
    dtype, size or device, or a view of another, is refused before anything is written). Reads no
    tensor value."""
    check_type("pools", pools, Pools, "a c2graph.Pools")
    cfg, dev = pools.cfg, pools.kv_cache.device if isinstance(pools.kv_cache, torch.Tensor) else None
    expected = {
        "kv_cache": ((pools.kv_slots, cfg.D), torch.bfloat16),
        "index_k": ((pools.kv_slots, cfg.index_dim), torch.bfloat16),
        "ring": ((pools.pool_requests * cfg.ring_size + 1, 2 * cfg.D), torch.float32),
    }
    for name, (shape, dtype) in expected.items():
        t = getattr(pools, name)
        check_tensor(f"pools.{name}", t, shape, dtype, dev, written=True)
    check_no_overlap({f"pools.{name}": t for name, t in pools.tensors().items()})


def check_layer_batch_pools(layer: SourceLayer, batch: ExtendBatch, pools: Pools) -> None:
    """The layer, the batch and the pools belong together: Config, device, tensor shapes and
    dtypes, and every index of the batch inside the pools (:func:`check_batch_fits`). Reads no
    tensor value (no host sync), so it also runs inside a graph capture."""
    check_type("layer", layer, SourceLayer, "a c2graph.SourceLayer")
    check_type("batch", batch, ExtendBatch, "a c2graph.ExtendBatch (ExtendBatch.build makes one)")
    check_pools(pools)
    check_layer_pools(layer, pools)
    check_layer(layer, COMPRESSOR_WEIGHTS)
    dev = pools.device
    offsets = batch.extend_offsets
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 2 or offsets.shape[0] != 2:
        raise ValueError(f"batch.extend_offsets has shape {_shape(offsets)}; expected [2, request_slots]")
    if not isinstance(batch.pos, torch.Tensor) or batch.pos.dim() != 1:
        raise ValueError(f"batch.pos has shape {_shape(batch.pos)}; expected [T] int64")
    T = batch.pos.shape[0]
    for name in ROW_TENSORS:
        check_tensor(f"batch.{name}", getattr(batch, name), (T,), torch.int64, dev)
    check_tensor("batch.extend_offsets", offsets, (2, batch.request_slots), torch.int32, dev)
    check_batch_fits(batch, pools)


def check_projected(layer: SourceLayer, projected, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept ``(kv, score)`` (``[T, D]`` fp32 each) or one ``[T, 2D]`` fp32 buffer; return views."""
    D = layer.cfg.D
    if isinstance(projected, (tuple, list)):
        if len(projected) != 2:
            raise ValueError(f"projected is a sequence of {len(projected)}; expected (kv, score)")
        kv, score = projected
        check_tensor("kv", kv, (T, D), torch.float32, device)
        check_tensor("score", score, (T, D), torch.float32, device)
        return kv, score
    check_tensor("projected", projected, (T, 2 * D), torch.float32, device, dense=True)
    return projected[:, :D], projected[:, D:]


def check_latent_out(latent_out, T: int, D: int, device: torch.device) -> None:
    """``latent_out`` (unless ``None``): ``[T, D]`` bf16 on the pools' device, dense, outside
    autograd (:func:`~c2graph.compressor.arguments.check_tensor` with ``written``)."""
    if latent_out is not None:
        check_tensor("latent_out", latent_out, (T, D), torch.bfloat16, device, written=True)


def check_outputs(layer: SourceLayer, pools: Pools, latent_out: torch.Tensor | None,
                  read: dict[str, torch.Tensor]) -> None:
    """No tensor a path writes (the caches, the ring, ``latent_out`` unless ``None``) shares memory
    with another, nor with one it reads (``read``: the projection; the batch's tensors and every
    weight of the layer are added here: a latent buffer over a weight would change the layer)."""
    written = {"latent_out": latent_out} if latent_out is not None else {}
    written.update({f"pools.{name}": t for name, t in pools.tensors().items()})
    read = dict(read)
    batch_tensors = read.pop("batch", None)
    if batch_tensors is not None:
        read.update({f"batch.{n}": getattr(batch_tensors, n) for n in (*ROW_TENSORS, "extend_offsets")})
    read.update({f"layer.{n}": t for n, t in layer_tensors(layer).items()})  # none is written over
    check_no_overlap(written, read)
