"""One op of a captured piece of work, as the capture audit records it, and the modes that record it.

A capture freezes, per node, every argument that is not a tensor (a Python int, float or bool, a
list of sizes) and every tensor by its address. :class:`Recorder` is a ``TorchDispatchMode``
entered inside a capture (innermost, so it sees every op the captured code issues first, above a
CUDA graph and above the CPU emulation alike); it records each op as an :class:`OpRecord`: its
name, its non-tensor arguments by value, its tensor arguments (:class:`TensorArg`) by address,
read or written, named when they lie in one of the labelled tensors (``"pos[:16]"``,
``"low_ratio_extend_offsets[1, 0]"``), in a tensor an earlier op made during the capture, or in a
Python number lifted into a tensor. :class:`CallWatch`, a ``TorchFunctionMode``, names the torch
call a refused capture died in (``Tensor.tolist``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames that never name where an op came from: torch, the audit itself, the graph emulation.
_SKIP = (_TORCH_DIR, "contextlib",
         *(os.path.join(_PACKAGE_DIR, "graphs", name) for name in ("op_record.py", "audit.py", "graph.py", "emulation.py", "refusals.py",
                                                               "triton_launches.py", "cuda_nodes.py")))
# Ops that launch nothing: bare allocations, and the lift of a Python number into a tensor.
_NO_NODE = frozenset({"aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
                      "aten.new_empty.default", "aten.new_empty_strided.default", "aten.lift_fresh.default"})


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument of a captured op, as the capture holds it: by address.

    ``label``: where it lies (a labelled buffer, a view of one, a temporary made by an earlier
    op, a Python number, or an unlabelled tensor); ``key``: what identifies it across two captures.
    """

    name: str
    written: bool
    label: str
    key: tuple
    shape: tuple[int, ...]
    address: int

    def __str__(self) -> str:
        base = self.label.split("[")[0].split(" ")[0]
        return self.label if base == self.name else f"{self.name}: {self.label}"


@dataclass(frozen=True)
class OpRecord:
    """One op of a capture: its name, the values it froze, the tensors it reads and writes.

    ``launches`` is false for views and bare allocations (no node of their own: their ints become
    the addresses and shapes of the tensors later nodes read). ``where``: the line that issued it.
    """

    index: int
    op: str
    launches: bool
    scalars: tuple[tuple[str, object], ...]
    tensors: tuple[TensorArg, ...]
    where: str


# ---------------------------------------------------------------------------------------------
# The modes


class Recorder(TorchDispatchMode):
    """Records every op dispatched inside the capture (entered innermost, so it sees them first)."""

    def __init__(self, labels: dict[str, torch.Tensor]):
        super().__init__()
        self.records: list[OpRecord] = []
        self.error_op: str | None = None
        self._made: dict[int, str] = {}  # storage address -> "temporary of op i"
        self._numbers: dict[int, object] = {}  # storage address -> the Python number it holds
        self._labels = [(name, t, _storage(t), _byte_range(t)) for name, t in labels.items()]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = len(self.records)
        if func is torch.ops.aten.lift_fresh.default:
            self._note_number(args[0])
        with torch._C.DisableTorchFunction():
            record = self._record(index, func, args, kwargs)
        self.records.append(record)
        try:
            out = func(*args, **kwargs)
        except Exception:
            self.error_op = self.error_op or str(func)
            raise
        with torch._C.DisableTorchFunction():
            inputs = {_storage(t) for t in _tensors((args, kwargs))}
            for k, t in enumerate(_tensors(out)):
                if _storage(t) not in inputs and _storage(t):
                    self._made[_storage(t)] = f"temporary of op {index}" + (f" (output {k})" if k else "")
        return out

    def _note_number(self, t: torch.Tensor) -> None:
        """A tensor made from Python data (a number written with ``t[i] = 0.0``): keep its value,
        read on the host with every mode out of the way (it is a host tensor, not yet copied)."""
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            if t.device.type == "cpu" and t.numel() <= 8:
                self._numbers[_storage(t)] = t.tolist()

    def _record(self, index, func, args, kwargs) -> OpRecord:
        scalars, tensors = [], []
        for i, arg in enumerate(func._schema.arguments):
            if i < len(args):
                value = args[i]
            elif arg.name in kwargs:
                value = kwargs[arg.name]
            else:
                continue
            written = arg.alias_info is not None and arg.alias_info.is_write
            leaves = _tensors(value)
            if leaves:
                many = len(leaves) > 1 or isinstance(value, (list, tuple))
                tensors += [self._tensor(f"{arg.name}[{k}]" if many else arg.name, t, written)
                            for k, t in enumerate(leaves)]
            elif _is_number(value):
                scalars.append((arg.name, list(value) if isinstance(value, (list, tuple)) else value))
        name = str(func)
        launches = not (func.is_view or torch.Tag.inplace_view in func.tags or name in _NO_NODE)
        return OpRecord(index, name, launches, tuple(scalars), tuple(tensors), _where())

    def _tensor(self, name: str, t: torch.Tensor, written: bool) -> TensorArg:
        storage, (b0, b1) = _storage(t), _byte_range(t)
        shape, stride = tuple(t.shape), tuple(t.stride())
        if storage in self._numbers:
            value = self._numbers[storage]
            return TensorArg(name, written, f"the Python number {value!r}", ("number", value), shape, storage + b0)
        best = None
        for label, lt, ls, (l0, l1) in self._labels:
            if ls == storage and l0 <= b0 and b1 <= l1 and (best is None or l1 - l0 < best[3][1] - best[3][0]):
                best = (label, lt, ls, (l0, l1))
        if best is not None:
            label, lt, _, (l0, _) = best
            text = _view_text(label, lt, (b0 - l0) // t.element_size(), shape, stride)
            key = ("label", label, b0 - l0, shape, stride)
        elif storage in self._made:
            text = self._made[storage]
            key = ("made", text, b0, shape, stride)
        else:
            text = f"an unlabelled tensor {list(shape)}"
            key = ("unlabelled", storage + b0, shape, stride)
        return TensorArg(name, written, text, key, shape, storage + b0)


class CallWatch(TorchFunctionMode):
    """Names the torch call (``Tensor.tolist``, ``tensor``) that a refused capture died in."""

    def __init__(self):
        super().__init__()
        self.refused_at: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            if self.refused_at is None:
                owner = "Tensor." if getattr(func, "__objclass__", None) is torch._C.TensorBase else ""
                self.refused_at = f"{owner}{getattr(func, '__name__', str(func))} [{_where()}]"
            raise


# ---------------------------------------------------------------------------------------------
# Helpers


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return start, start
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return start, start + span * t.element_size()


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def _is_number(value) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_is_number(v) for v in value)
    return isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat))


def _view_text(name: str, base: torch.Tensor, offset: int, shape: tuple, stride: tuple) -> str:
    """The view as an index of the labelled tensor: ``name``, ``name[:16]``, ``name[0, 3]``,
    ``name[:16, 32:64]``; the view's shape and offset where it is no such index."""
    generic = f"{name} (view {list(shape)} at element {offset})"
    if base.dim() == 0 or not base.is_contiguous():
        return name if offset == 0 and tuple(shape) == tuple(base.shape) else generic
    index, rest = [], offset
    for s in base.stride():
        index.append(rest // s)
        rest %= s
    moving = {st: n for n, st in zip(shape, stride) if n > 1}  # strides of the view's dims that move
    if len(moving) != sum(1 for n in shape if n > 1):
        return generic
    parts = []
    for i, s, size in zip(index, base.stride(), base.shape):
        if size > 1 and s in moving:
            m = moving.pop(s)
            if i + m > size:
                return generic
            parts.append(":" if (i == 0 and m == size) else f"{i if i else ''}:{i + m}")
        else:
            parts.append(str(i))
    if moving:
        return generic
    while parts and parts[-1] == ":":
        parts.pop()
    return f"{name}[{', '.join(parts)}]" if parts else name


def _where() -> str:
    """The innermost line outside torch, this module and the graph emulation: ``file.py: function``."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not any(skip in path for skip in _SKIP):
            if path.startswith(_PACKAGE_DIR):
                return f"{path[len(_PACKAGE_DIR):]}: {frame.f_code.co_name}"
            return f"your code: {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"
