"""What a CUDA graph capture refuses, and how the emulation refuses the same things with the same texts.

Measured on an H200 with torch 2.11; the emulation's messages add a second line naming what was
refused (CUDA's name nothing).

- **Host syncs** fail with :data:`NOT_PERMITTED` (CUDA error code 900) and invalidate the
  capture: every later launch, and the end of the ``with`` block even when the first error was
  caught, fail with :data:`PREVIOUS_ERROR` (code 901). These are ``.item()``, ``int(t)``,
  ``bool(t)``, ``if t:``, printing a tensor, ``torch.equal``, ops with a data-dependent output
  shape (``nonzero``, ``unique``, ``masked_select``, ...), boolean-mask indexing, and
  boolean-mask assignment of a tensor. ``t[mask] = number`` is allowed: torch runs it as
  ``masked_fill_``.
- **Host copies** fail torch's own check, :data:`UNPINNED_COPY`, and the capture stays valid if
  the error is caught: ``.cpu()``, ``.to("cpu")``, ``.tolist()``, a tensor built from Python
  data (``torch.tensor(list)``, ``torch.as_tensor``, ``t.new_tensor``, indexing with a Python
  list), and ``t[index_tensor] = number`` or ``t[i] = number`` (the number is copied to the device;
  seen on an H200 for ``mask[row] = True`` inside a captured park rule). Each stages its
  data in pageable host memory (the caching host allocator's pinned buffers are not used), and
  torch's copy asks whether the stream is capturing (``cudaStreamIsCapturing``) before it makes
  any other CUDA call: refused there, it never reaches the copy, every time.
  ``.numpy()`` of a device tensor raises a ``TypeError``.

Inside a custom op's body and in a launch's grid callable the same refusals hold, with the same
texts: a launcher runs under the capture like any other Python. It may read what a launch needs
and no tensor value: pointers (``data_ptr()``, anywhere in the captured code), sizes, strides,
dtype, device, contiguity, and whether a capture is on (``torch.cuda.is_current_stream_capturing()``).

In the emulation every tensor stands for a device tensor, so these refuse CPU tensors, though
torch itself would not.

**One capture at a time**, on either backend, refused by :class:`~c2graph.graphs.graph.Graph`
before anything changes (the graph stays new, a capture in progress stays valid):

- a capture begun inside another capture of the same thread (:data:`NESTED_CAPTURE`);
- a capture begun while another thread captures (:data:`CONCURRENT_CAPTURE`). CUDA can capture
  on two streams at once (in ``thread_local`` mode), but torch cannot: it begins every capture by
  synchronizing the device, which invalidates a capture in progress in any thread, whatever its
  mode (NVIDIA/TensorRT#2888), and its own notes allow one capture at a time.

A capture's work stays in its thread: the ops and Triton launches of other threads are neither
recorded nor refused (on CUDA the capture is begun in ``thread_local`` mode, so another thread's
eager work, an allocation included, does not invalidate it).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
PREVIOUS_ERROR = "CUDA error: operation failed due to a previous error during capture"
UNPINNED_COPY = (
    "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor "
    "is pinned. Please use tensor.pin_memory() or allocate the tensor with pin_memory=True."
)
NESTED_CAPTURE = (
    "a capture inside another capture of this thread: a stream captures one graph at a time, and "
    "torch begins a capture by synchronizing the device, which the capture in progress refuses. End "
    "the first capture before beginning the next, or capture the inner work as part of the outer graph."
)
CONCURRENT_CAPTURE = (
    "a capture while another thread ({thread}) is capturing: torch captures one graph at a time in a "
    "process (it begins each capture by synchronizing the device, which would invalidate the other "
    "thread's capture). Capture in turn: begin this one after the other thread's capture ends."
)
NO_NUMPY = (
    "can't convert cuda:0 device type tensor to numpy. "
    "Use Tensor.cpu() to copy the tensor to host memory first."
)


class CaptureState:
    """Whether an emulated capture is still valid, and the last Python number indexing wrapped."""

    def __init__(self):
        self.failed = False  # a host sync happened: the capture is invalid (code 901 from now on)
        self.host_number: torch.Tensor | None = None

    def refuse_sync(self, what: str):
        """Raise code 900 and invalidate the capture; code 901 once it is invalid."""
        if self.failed:
            raise RuntimeError(PREVIOUS_ERROR)
        self.failed = True
        raise RuntimeError(f"{NOT_PERMITTED}\n(emulated capture: {what})")

    def check_still_valid(self) -> None:
        """CUDA refuses every launch into an invalid capture."""
        if self.failed:
            raise RuntimeError(PREVIOUS_ERROR)

    def check_op(self, func, args, kwargs) -> None:
        """Refuse ``func(*args, **kwargs)`` where a CUDA capture refuses it (dispatch level)."""
        self.check_still_valid()
        if torch.Tag.data_dependent_output in func.tags:
            self.refuse_sync(f"{func} reads a tensor's value on the host")
        if func in _INDEX_PUT:
            self._check_index_put(func, args, kwargs)
        elif func is aten.index.Tensor:
            if _bool_indices(args[1]):
                self.refuse_sync(f"{func} with a boolean mask has a data-dependent shape")
        elif torch.Tag.dynamic_output_shape in func.tags:
            self.refuse_sync(f"{func} has a data-dependent output shape")
        elif func is aten.lift_fresh.default and args[0].dim() > 0:
            raise host_copy_error("Python data becomes a device tensor, a host-to-device copy")
        elif func is aten.copy_.default and args[1] is self.host_number:
            # ``t[i] = number``: torch copies the number, a host tensor, into the selected element
            raise host_copy_error(f"{func} copies the Python number it writes to the device")

    def _check_index_put(self, func, args, kwargs) -> None:
        """``index_put_(self, indices, values, accumulate)``, as ``_index_put_impl_`` dispatches it."""
        indices, values = args[1], args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        defined = [i for i in indices if i is not None]
        number = values is self.host_number
        if number and not accumulate and len(defined) == 1 and _bool_indices(defined):
            return  # torch runs it as masked_fill_(mask, number): no sync, static shape
        if _bool_indices(indices):
            self.refuse_sync(f"{func} with a boolean mask needs the mask's nonzero positions")
        if number:
            raise host_copy_error(f"{func} copies the Python number it writes to the device")


_INDEX_PUT = frozenset({aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default})


def _bool_indices(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is a capture's own refusal (the texts above, CUDA's, torch's or this
    package's), not an error of the captured code."""
    texts = (NOT_PERMITTED, PREVIOUS_ERROR, UNPINNED_COPY, NO_NUMPY, NESTED_CAPTURE,
             CONCURRENT_CAPTURE.split("(")[0])  # its words before the thread's name
    return str(error).startswith(texts)


def host_copy_error(what: str) -> RuntimeError:
    """torch's own refusal of a pageable host copy during capture (the capture stays valid)."""
    return RuntimeError(f"{UNPINNED_COPY}\n(emulated capture: {what})")


class HostGuard(TorchFunctionMode):
    """The function half of an emulated capture: host reads and host-built tensors.

    ``.tolist()``, ``.cpu()``, ``print`` and ``.numpy()`` reach no ATen op (or not one that says
    what they do), so they are caught here, above dispatch. ``.data_ptr()`` is allowed, as under
    CUDA, and counted in ``pointer_reads`` (a custom op's body that reads pointers and records no
    work launched through them: :mod:`c2graph.graphs.emulation`).
    """

    def __init__(self, state: CaptureState):
        super().__init__()
        self.state = state
        self.pointer_reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._check(func, args, kwargs)
        return func(*args, **kwargs)

    def _check(self, func, args, kwargs) -> None:
        name = getattr(func, "__name__", str(func))
        if func in _FORMATS:
            self.state.refuse_sync(f"Tensor.{name} reads a tensor's values on the host to format them")
        elif func in _TO_NUMPY:
            raise TypeError(f"{NO_NUMPY}\n(emulated capture: Tensor.{name} of a device tensor)")
        elif func in _TO_HOST or (func is torch.Tensor.to and _targets_host(args, kwargs)):
            raise host_copy_error(f"Tensor.{name} copies a device tensor to the host")
        elif func is torch.Tensor.data_ptr:
            self.pointer_reads += 1
        elif func in _FROM_HOST:
            position = _FROM_HOST[func]
            if len(args) > position and not isinstance(args[position], torch.Tensor):
                raise host_copy_error(f"{name} builds a device tensor from Python data, a host-to-device copy")


def _targets_host(args, kwargs) -> bool:
    """``Tensor.to(...)`` names the CPU as its device."""
    devices = [kwargs.get("device"), *(a for a in args[1:] if isinstance(a, (str, torch.device)))]
    return any(d is not None and torch.device(d).type == "cpu" for d in devices)


_FORMATS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__})
_TO_NUMPY = frozenset({torch.Tensor.numpy, torch.Tensor.__array__})
_TO_HOST = frozenset({torch.Tensor.cpu, torch.Tensor.tolist})
# Functions that build a tensor from Python data, and the position of that data among their arguments.
_FROM_HOST = {torch.tensor: 0, torch.as_tensor: 0, torch.Tensor.new_tensor: 1}
