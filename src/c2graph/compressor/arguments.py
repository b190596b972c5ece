"""Argument checks shared by every entry point. Each raises ``ValueError`` naming the argument, its
value and what was expected, before anything is written or allocated.

- :func:`as_int`, :func:`as_ints`: an int argument (a Python or numpy int, anything
  ``operator.index`` takes; never a ``bool``, a float or a string), within bounds; a list of them;
- :func:`as_positive_real`: a finite number > 0;
- :func:`as_device`: a device argument that this machine has;
- :func:`check_tensor`: a tensor's shape, dtype and device.

The checks of the layer, the batch and the pools together are in :mod:`.checks`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import torch


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
