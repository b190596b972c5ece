"""Argument checks shared by every entry point. Each raises ``ValueError`` naming the argument, its
value and what was expected, before anything is written or allocated.

- :func:`as_int`, :func:`as_ints`: an int argument (a Python or numpy int, anything
  ``operator.index`` takes; never a ``bool``, a float or a string), within bounds; a list of them;
- :func:`as_float32_real`: a finite number > 0 that float32 holds (``eps``, RoPE's base);
- :func:`as_device`: a device argument that this machine has;
- :func:`check_type`: an argument of one of the package's classes (a batch, pools, a layer, a Config);
- :func:`allocate`: an allocation whose failure is said in the package's words, naming the argument;
- :func:`check_tensor`: a tensor's shape, dtype and device;
- :func:`overlaps`, :func:`check_no_overlap`: no tensor a path writes shares memory with another
  tensor of the call (a latent buffer over a cache would overwrite cache rows).

The checks of the layer, the batch and the pools together are in :mod:`.checks`; this module
imports nothing else of the package.
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


def as_float32_real(name: str, value, *, least: float | None = None, what: str = "") -> float:
    """``value`` as a finite float ``> 0`` (``>= least`` where given) that stays finite and normal in
    float32, the precision the kernels compute in (``1e-300`` rounds to 0 there; ``1e300`` to inf).
    ``what`` says in words why the bound (``"(RoPE's base)"``)."""
    low = FLOAT32_TINY if least is None else least
    expected = f"a finite number >= {low:.3g} and <= {FLOAT32_MAX:.3g} (float32 holds it){what}"
    if isinstance(value, bool):
        raise ValueError(f"{name} = {value!r}; expected {expected}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {value!r}; expected {expected}") from None
    if not math.isfinite(number) or not low <= number <= FLOAT32_MAX:
        raise ValueError(f"{name} = {value!r}; expected {expected}")
    return number


FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
"""The smallest normal float32 (about 1.2e-38): a smaller ``eps`` is 0, or a denormal, in the kernels."""
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_type(name: str, value, cls: type, what: str) -> None:
    """``ValueError`` unless ``value`` is a ``cls`` (``what``: how the error names it, e.g.
    ``"an ExtendBatch (ExtendBatch.build)"``)."""
    if not isinstance(value, cls):
        raise ValueError(f"{name} is a {type(value).__name__}; expected {what}")


def allocate(name: str, value, make):
    """``make()``, an allocation sized by the argument ``name`` (``value``); when the device cannot
    allocate it, ``ValueError`` naming the argument instead of the allocator's words."""
    try:
        return make()
    except (RuntimeError, MemoryError) as e:
        if "alloc" not in str(e).lower() and "out of memory" not in str(e).lower():
            raise
        raise ValueError(f"{name} = {value!r} needs more memory than this device can allocate; "
                         "expected a size that fits") from None


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

def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` share some memory: the same storage, and byte ranges (from the first element
    to one past the last) that intersect. Reads no tensor value (it runs inside a capture)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        first = t.storage_offset() * t.element_size()
        last = first + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) * t.element_size()
        return first, last + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_no_overlap(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor] | None = None) -> None:
    """``ValueError`` naming both tensors where one tensor a call writes (``written``: name -> tensor)
    shares memory with another written tensor, or with one it reads (``read``)."""
    names = list(written)
    for i, name in enumerate(names):
        others = [(o, written[o]) for o in names[i + 1:]] + list((read or {}).items())
        for other, t in others:
            if isinstance(t, torch.Tensor) and overlaps(written[name], t):
                raise ValueError(f"{name} shares memory with {other}; expected separate tensors (a write to "
                                 f"{name} would change {other})")
