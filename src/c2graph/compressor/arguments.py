"""Argument checks shared by every entry point. Each raises ``ValueError`` naming the argument, its
value and what was expected, before anything is written or allocated.

- :func:`as_int`, :func:`as_ints`: an int argument (a Python or numpy int, anything
  ``operator.index`` takes; never a ``bool``, a float or a string), within bounds; a list of them;
- :func:`as_positive_real`: a finite number > 0;
- :func:`as_device`: a device argument that this machine has;
- :func:`check_tensor`, :func:`check_layer_batch_pools`, :func:`check_projected`: the tensors of the
  torch and fused paths, against the layer, the batch and the pools.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .batch import ExtendBatch
    from .pools import Pools
    from .source_layer import SourceLayer


def as_int(name: str, value, *, least: int | None = None, below: int | None = None, least_is: str = "",
           below_is: str = "") -> int:
    """``value`` as a Python int, or ``ValueError`` naming ``name``: it must be an integer (what
    ``operator.index`` accepts: ``int``, ``np.int64``, a one-element int tensor; never ``bool``),
    ``>= least`` and ``< below`` where given. ``least_is`` and ``below_is`` say in words what the
    bounds are (``below_is="pool_requests (4)"``)."""
    expected = "an int" + (f" >= {least_is or least}" if least is not None else "")
    if below is not None:
        expected += f" and < {below_is or below}" if least is not None else f" < {below_is or below}"
    if isinstance(value, bool):
        raise ValueError(f"{name} = {value!r}; expected {expected} (a bool is not a count)")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {value!r}; expected {expected}") from None
    if (least is not None and number < least) or (below is not None and number >= below):
        raise ValueError(f"{name} = {number}; expected {expected}")
    return number


def as_ints(name: str, values, *, least: int | None = None) -> list[int]:
    """A list of int arguments (:func:`as_int` each, named ``name[i]``); ``ValueError`` unless
    ``values`` is a non-empty sequence."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) or not (values := list(values)):
        raise ValueError(f"{name} = {values!r}; expected a non-empty list of ints" + (f" >= {least}" if least else ""))
    return [as_int(f"{name}[{i}]", v, least=least) for i, v in enumerate(values)]


def as_positive_real(name: str, value) -> float:
    """``value`` as a finite float ``> 0`` (an int or float, numpy's too; never a ``bool``)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} = {value!r}; expected a finite number > 0")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {value!r}; expected a finite number > 0") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} = {value!r}; expected a finite number > 0")
    return number


def as_device(name: str, device, default: torch.device) -> torch.device:
    """``device`` (a ``torch.device``, a string such as ``"cpu"`` or ``"cuda:0"``, or ``None`` for
    ``default``) as a ``torch.device`` this machine has."""
    if device is None:
        return default
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} = {device!r}; expected a torch.device, 'cpu' or 'cuda[:index]'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} = {device!r}, but this machine has no CUDA device; expected 'cpu' or None")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} = {device!r}; expected a CUDA index < {torch.cuda.device_count()}")
    elif dev.type != "cpu":
        raise ValueError(f"{name} = {device!r}; expected 'cpu' or 'cuda[:index]'")
    return dev


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


def check_layer_pools(layer: SourceLayer, pools: Pools, where: str = "") -> None:
    """The pools were made for the layer's Config, on the layer's device."""
    if pools.cfg != layer.cfg:
        raise ValueError(f"{where}pools were made for another Config than the layer's")
    if not same_device(layer.device, pools.device):
        raise ValueError(f"{where}layer is on {layer.device}; expected {pools.device} (the pools' device)")


def check_batch_fits(batch: ExtendBatch, pools: Pools, where: str = "") -> None:
    """Every index the batch's rows hold lies inside the pools: pool indices (the ring's requests),
    c2 slots (both caches) and positions. The extents were counted on the host when the batch was
    made (:attr:`ExtendBatch.extents`), so this reads no tensor: it runs inside a capture too."""
    for r in batch.requests:
        as_int(f"{where}batch request pool_index", r.pool_index, least=0, below=pools.pool_requests,
               below_is=f"pools.pool_requests ({pools.pool_requests})")
    bounds = (  # tensor, what it holds, the first value past the pools, and which bound that is
        ("pos", "position", None, ""),
        ("req", "pool index", pools.pool_requests, f"pools.pool_requests ({pools.pool_requests})"),
        ("c2_slot", "c2 slot", pools.kv_slots, f"pools.kv_slots ({pools.kv_slots})"),
        ("raw_out_loc", "token slot", 2 * pools.kv_slots, f"2 * pools.kv_slots ({2 * pools.kv_slots})"),
    )
    for name, held, below, limit in bounds:
        lo, hi = batch.extents.get(name, (0, -1))
        if lo < 0:
            raise ValueError(f"{where}batch.{name} holds {held} {lo}; expected values >= 0")
        if below is not None and hi >= below:
            raise ValueError(f"{where}batch.{name} holds {held} {hi}, past the pools; expected < {limit}")


def check_layer_batch_pools(layer: SourceLayer, batch: ExtendBatch, pools: Pools) -> None:
    """The layer, the batch and the pools belong together: Config, device, tensor shapes and
    dtypes, and every index of the batch inside the pools (:func:`check_batch_fits`). Reads no
    tensor value (no host sync), so it also runs inside a graph capture."""
    from .batch import ROW_TENSORS  # here, not at the top: batch.py imports this module

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
