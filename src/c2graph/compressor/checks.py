"""The checks every path runs on its inputs: the layer, the batch and the pools belong together
(Config, device, tensor shapes and dtypes, every index inside the pools), and the projected
tensors fit the layer. Each raises ``ValueError`` naming the argument, its value and what was
expected, before anything is written; none reads a tensor value, so they run inside a capture too.
"""

from __future__ import annotations

import torch

from .arguments import check_tensor, same_device
from .batch import ROW_TENSORS, ExtendBatch, check_batch_fits
from .pools import Pools
from .source_layer import SourceLayer


def check_layer_pools(layer: SourceLayer, pools: Pools, where: str = "") -> None:
    """The pools were made for the layer's Config, on the layer's device."""
    if pools.cfg != layer.cfg:
        raise ValueError(f"{where}pools were made for another Config than the layer's")
    if not same_device(layer.device, pools.device):
        raise ValueError(f"{where}layer is on {layer.device}; expected {pools.device} (the pools' device)")


def check_layer_batch_pools(layer: SourceLayer, batch: ExtendBatch, pools: Pools) -> None:
    """The layer, the batch and the pools belong together: Config, device, tensor shapes and
    dtypes, and every index of the batch inside the pools (:func:`check_batch_fits`). Reads no
    tensor value (no host sync), so it also runs inside a graph capture."""
    check_layer_pools(layer, pools)
    dev = pools.device
    T = batch.num_rows
    for name in ROW_TENSORS:
        check_tensor(f"batch.{name}", getattr(batch, name), (T,), torch.int64, dev)
    check_tensor("batch.extend_offsets", batch.extend_offsets, (2, batch.request_slots), torch.int32, dev)
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
    check_tensor("projected", projected, (T, 2 * D), torch.float32, device)
    return projected[:, :D], projected[:, D:]
