"""Argument checks shared by every entry point. Each raises ``ValueError`` naming the argument, its
value and what was expected, before anything is written or allocated.

- :func:`as_int`, :func:`as_ints`: an int argument (a Python or numpy int, anything
  ``operator.index`` takes; never a ``bool``, a float or a string), within bounds; a list of them;
- :func:`as_float32_real`: a finite number > 0 that float32 holds (``eps``, RoPE's base);
- :func:`as_device`: a device argument that this machine has;
- :func:`check_type`: an argument of one of the package's classes (a batch, pools, a layer, a Config);
- :func:`allocate`: an allocation whose failure is said in the package's words, naming the argument;
- :func:`check_tensor`: a tensor's shape, dtype and device, outside autograd, dense where written
  (:func:`check_plain`);
- :func:`overlaps`, :func:`check_no_overlap`: no tensor a path writes shares memory with another
  tensor of the call (a latent buffer over a cache would overwrite cache rows), by address, so
  views count;
- :func:`check_fits_memory`: a size refused before it is allocated when the device cannot hold it.

The checks of the layer, the batch and the pools together are in :mod:`.checks`; this module
imports nothing else of the package.
"""

from __future__ import annotations

import threading

import math
import operator
import os
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


def check_tensor(name: str, t, shape: tuple, dtype: torch.dtype, device: torch.device, *,
                 written: bool = False, dense: bool = False) -> None:
    """``t`` (named ``name``) is a tensor of ``shape``, ``dtype``, on ``device``, outside autograd
    (:func:`check_plain`); one the call ``written`` in place is also dense (row-major, every
    element its own memory: an expanded tensor would take one value for many elements) and not an
    inference tensor outside inference mode; ``dense`` asks density of a tensor only read (a
    kernel's pointer). Reads no tensor value."""
    if (isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype and t.device == device
            and not t.requires_grad and (not (written or dense) or t.is_contiguous())
            and not (written and t.is_inference())):
        return  # the common case, in few calls: every check passes
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {_shape(t)}; expected {list(shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; expected {dtype}")
    if not same_device(t.device, device):
        raise ValueError(f"{name} is on {t.device}; expected {device} (the pools' device)")
    check_plain(name, t, written=written)
    if (written or dense) and not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {t.stride()}); expected a dense row-major tensor"
                         + (" (it is written in place)" if written else ""))


def check_plain(name: str, t: torch.Tensor, *, written: bool = False) -> None:
    """``t`` is outside autograd: the compressor serves inference, and a tensor that requires grad
    (a leaf, or one computed from one) would either refuse the in-place writes or pull the caches
    into an autograd graph. A tensor written in place is not an inference tensor outside inference
    mode either (torch refuses to write one there)."""
    if t.requires_grad:
        raise ValueError(f"{name} requires grad; expected a tensor outside autograd (the compressor serves "
                         f"inference: pass {name}.detach(), or make it under torch.no_grad())")
    if written and t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name} is an inference tensor (made under torch.inference_mode()) and is written in "
                         "place outside inference mode, which torch refuses; expected a normal tensor (clone it "
                         "outside inference mode), or call inside torch.inference_mode()")


def same_device(a: torch.device, b: torch.device) -> bool:
    """Same device type, and the same index where both name one (``cuda`` matches ``cuda:0``)."""
    return a == b or a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` may touch: ``[address of its first element, one past its last)``, by address,
    so that two views of one memory compare whatever storage objects hold them. ``(0, 0)`` for an
    empty tensor. Reads no tensor value."""
    n = t.numel()
    if n == 0:
        return 0, 0
    start, size = t.data_ptr(), t.element_size()
    if t.is_contiguous():
        return start, start + n * size
    return start, start + (sum((k - 1) * s for k, s in zip(t.shape, t.stride())) + 1) * size


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` share some memory: on one device, byte ranges (from the first element to one
    past the last, by address: views of one storage included) that intersect. Reads no tensor
    value (it runs inside a capture)."""
    if not same_device(a.device, b.device):
        return False
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


def check_no_overlap(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor] | None = None) -> None:
    """``ValueError`` naming both tensors where one tensor a call writes (``written``: name -> tensor)
    shares memory with another written tensor, or with one it reads (``read``; tensors read may
    share memory with each other). One sort of the byte ranges (:func:`span`): ``O(n log n)`` in the
    number of tensors, no tensor value read."""
    ranges = [(*span(t), True) for t in written.values() if isinstance(t, torch.Tensor)]
    ranges += [(*span(t), False) for t in (read or {}).values() if isinstance(t, torch.Tensor)]
    ranges.sort()
    open_: list[tuple] = []  # ranges that may still intersect a later one
    for r in ranges:
        if r[0] == r[1]:
            continue  # empty
        open_ = [o for o in open_ if o[1] > r[0]]
        if open_ and (r[2] or any(o[2] for o in open_)):
            _say_overlap(written, read or {})
        open_.append(r)


def _say_overlap(written: dict, read: dict) -> None:
    """Name the first pair that shares memory, in the order the tensors were given (a written
    tensor first); :func:`check_no_overlap` found one."""
    names = list(written)
    for i, name in enumerate(names):
        for other, t in [(o, written[o]) for o in names[i + 1:]] + list(read.items()):
            if isinstance(t, torch.Tensor) and overlaps(written[name], t):
                raise ValueError(f"{name} shares memory with {other}; expected separate tensors (a write to "
                                 f"{name} would change {other})")


def device_bytes(device: torch.device) -> int:
    """The memory of ``device`` in bytes: a CUDA device's total memory, or this machine's RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index if device.index is not None
                                                else torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_memory(what: str, nbytes: int, device: torch.device, held: str = "") -> None:
    """``ValueError`` before anything is allocated when ``nbytes`` (for ``held``, in words) exceed the
    memory of ``device``, or a tensor's element count (``2**63``). ``what`` names the arguments that
    ask for them, with their values (``"kv_slots = 4096"``)."""
    have = device_bytes(device)
    if nbytes > have or nbytes >= 2**63:
        raise ValueError(f"{what} needs more memory than this device can allocate ({held + ': ' if held else ''}"
                         f"{nbytes:.3g} bytes; {device.type} has {have:.3g}); expected a size that fits")


_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


def fingerprint(tensors) -> tuple | None:
    """What the argument checks read of each tensor (a ``None`` stays ``None``): its address, shape,
    strides, dtype and device, whether it requires grad and whether it is an inference tensor.
    ``None`` when one is no plain tensor (a fake, functional or other subclass, or anything else):
    such a call is checked in full every time. Reads no tensor value."""
    if not all(t is None or type(t) in _PLAIN_TENSORS for t in tensors):
        return None
    try:
        return tuple([None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t.requires_grad,
                                              t.is_inference()) for t in tensors])
    except RuntimeError:  # no address (a sparse tensor): checked in full
        return None


class Passed:
    """Calls whose arguments passed their checks, the last ``size`` of them, each with what the call
    worked out from them: ``key -> value``. A key holds everything the checks read (the tensors'
    :func:`fingerprint`, the sizes, the objects' fields), so a call with a key found here would be
    checked again on the same facts, with the same verdict: it skips the checks. A refused call
    leaves no key. Safe under threads."""

    def __init__(self, size: int = 256):
        self._values: dict = {}
        self._size = size
        self._lock = threading.Lock()

    def get(self, key):
        """The value kept for ``key``; ``None`` for a key not kept (or ``None``: no key)."""
        return None if key is None else self._values.get(key)

    def add(self, key, value=True) -> None:
        """Keep ``key`` (unless ``None``) with ``value``, forgetting the oldest past ``size``."""
        if key is None:
            return
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                del self._values[next(iter(self._values))]

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

