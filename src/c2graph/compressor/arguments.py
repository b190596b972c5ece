"""Argument checks shared by the torch and fused paths. Each raises ``ValueError`` naming the
argument, its value and what was expected, before anything is written."""

from __future__ import annotations

import torch

from .batch import ExtendBatch
from .pools import Pools
from .source_layer import SourceLayer


def _shape(t) -> object:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def check_tensor(name: str, t, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {_shape(t)}; expected {list(shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; expected {dtype}")
    if not same_device(t.device, device):
        raise ValueError(f"{name} is on {t.device}; expected {device} (the pools' device)")


def same_device(a: torch.device, b: torch.device) -> bool:
    """Same device type, and the same index where both name one (``cuda`` matches ``cuda:0``)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def check_layer_batch_pools(layer: SourceLayer, batch: ExtendBatch, pools: Pools) -> None:
    cfg = layer.cfg
    if pools.cfg != cfg:
        raise ValueError("pools were made for another Config than the layer's")
    dev = pools.device
    if not same_device(layer.device, dev):
        raise ValueError(f"layer is on {layer.device}; expected {dev} (the pools' device)")
    T = batch.num_rows
    for name in ("pos", "req", "raw_out_loc", "c2_slot"):
        check_tensor(f"batch.{name}", getattr(batch, name), (T,), torch.int64, dev)
    check_tensor("batch.extend_offsets", batch.extend_offsets, (2, batch.request_slots), torch.int32, dev)
    for r in batch.requests:
        if not 0 <= r.pool_index < pools.pool_requests:
            raise ValueError(
                f"batch request pool_index = {r.pool_index}; expected < pools.pool_requests "
                f"({pools.pool_requests})"
            )
    # ``kv_slots_needed`` was counted on the host when the batch was built: no sync here,
    # so the check also runs inside a graph capture.
    if batch.kv_slots_needed > pools.kv_slots:
        raise ValueError(
            f"batch writes c2 slots up to {batch.kv_slots_needed - 1}; expected < "
            f"pools.kv_slots ({pools.kv_slots})"
        )


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
