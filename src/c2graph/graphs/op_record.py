"""The record of a capture: every op and every Triton launch, as the capture froze them.

One record, read twice: the CPU emulation replays it (:mod:`c2graph.graphs.emulation`) and the
capture audit reads it (:mod:`c2graph.graphs.audit`). :class:`Recording` makes it on either
backend: a ``TorchDispatchMode`` entered inside the capture sees every op of the captured code,
and of a custom op's Python body (run below the mode, with the mode entered again); Triton's
launcher, wrapped for the capture (:mod:`c2graph.graphs.triton_launches`), sees every
``kernel[grid](...)``, which never passes through torch's dispatcher.

Each :class:`OpRecord` holds the op's or kernel's name (a Triton kernel also by its code,
:class:`KernelCode`); every argument that is not a tensor, by value (a Python int, a list of
sizes, a string such as a ``rounding_mode``, a dtype, a device, a constexpr, a launch's grid, a
random generator by its seed and whether it was just seeded, :mod:`.frozen_values`); every tensor
argument by address and shape (:class:`TensorArg`), named after the ``labels`` it lies in
(``"pos[:16]"``), the earlier op that made it (``"temporary of op 3"``) or the number lifted into
it; the records of a custom op's body; and ``where``, the lines of the captured code that issued
it, from the launch outward (``"model.py:42 in forward, called from serve.py:7 in step"``).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from .frozen_values import BY_VALUE, GeneratorArg, KernelCode, generator_arg, kernel_code
from .lines import locate, ran_eagerly_lines
from .ops import launches_kernel, tensors_in
from .refusals import PREVIOUS_ERROR, is_refusal
from .triton_launches import grid_meta, kernel_name, launches_seen_by, python_modes_off

_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims"})  # any other namespace is a custom op's
LAUNCH = "Triton launch"


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument, by address and shape. ``written``: whether the op writes it (``None``:
    a pointer handed to a Triton kernel); ``label``: where it lies; ``key``: ``(kind, place,
    offset, shape, stride)``, what identifies it across captures; ``storage``: its storage's address.
    """

    name: str
    written: bool | None
    label: str
    key: tuple
    shape: tuple[int, ...]
    address: int
    storage: int = field(default=0, compare=False)

    def __str__(self) -> str:
        base = self.label.split("[")[0].split(" ")[0]
        return self.label if base == self.name else f"{self.name}: {self.label}"


@dataclass(frozen=True)
class OpRecord:
    """One op, custom op or Triton launch of a capture. ``launches``: whether it is work of the
    graph (not a view, an allocation, or a custom op whose body launched nothing); ``body``: a
    custom op's records; ``replay``: the emulation's relaunch of it (``None`` on CUDA); ``where``:
    every line of the captured code that issued it, innermost first (``stack``: each one's
    ``(where, code)``), ``code``: the innermost line's source."""

    index: int
    op: str
    kind: str  # "op", "custom op" or LAUNCH
    launches: bool
    scalars: tuple[tuple[str, object], ...]
    tensors: tuple[TensorArg, ...]
    where: str
    code: str
    stack: tuple[tuple[str, str], ...]
    body: tuple[OpRecord, ...] = ()
    replay: Callable[[], object] | None = field(default=None, repr=False, compare=False)
    kernel: KernelCode | None = None  # a Triton launch's kernel, by its code

    def run(self) -> None:
        """Relaunch it as an emulated replay does: its own launch, then its body's."""
        if self.replay is not None:
            self.replay()
        for record in self.body:
            record.run()

    @property
    def label(self) -> str:
        """``"op 3"`` or ``"launch 4"``: what it is, and its place in the capture."""
        return f"{'launch' if self.kind == LAUNCH else 'op'} {self.index}"

    def flat(self) -> list[OpRecord]:
        """This record, then its body's, in capture order."""
        return [self, *(r for record in self.body for r in record.flat())]


@dataclass
class CaptureRecord:
    """Everything one capture recorded, in order. Where the capture failed, ``refused``: the
    capture's own refusal (its first line, in CUDA's or torch's words), or an error the captured
    code raised, by its type (``"ValueError: ..."``, with ``raised`` True); ``refused_where`` and
    ``refused_code``: the lines of the captured code it came from (``refused_stack``: each one's
    ``(where, code)``); ``ran_eagerly``: its compiled functions, run op by op (:func:`.lines.locate`)."""

    records: list[OpRecord]
    refused: str | None = None
    refused_where: str = ""
    refused_code: str = ""
    refused_stack: tuple[tuple[str, str], ...] = ()
    raised: bool = False
    ran_eagerly: list[str] = field(default_factory=list)
    held: dict[int, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    """Every tensor from before the capture that a record names, by storage address (one view of it)."""

    def flat(self) -> list[OpRecord]:
        """Every record, bodies included, in capture order."""
        return [r for record in self.records for r in record.flat()]

    def nodes(self) -> list[OpRecord]:
        """The records that are work of the graph: a node each in the emulation, a kernel or more on CUDA."""
        return [r for r in self.records if r.launches]

    def refuse(self, error: BaseException, stop) -> None:
        """Note why the capture failed and where: ``error``, or the error the end of the capture
        reports (:data:`PREVIOUS_ERROR`) was raised during; ``stop``: the frame that entered the capture."""
        if str(error).startswith(PREVIOUS_ERROR) and error.__context__ is not None:
            error = error.__context__
        frames = reversed(list(traceback.walk_tb(error.__traceback__)))
        self.refused_where, self.refused_code, self.refused_stack = locate(frames, stop)
        self.raised = not is_refusal(error)
        text = (str(error).splitlines() or [""])[0]
        name = type(error).__name__
        self.refused = (f"{name}: {text}" if text else name) if self.raised else text
        self.refused_where = self.refused_where or "the end of the capture"

    def table(self, *, limit: int | None = 12) -> str:
        """Per record that is work of the graph: what it froze, read and wrote (``limit``: how many; ``None``: all)."""
        check_limit(limit)
        if self.refused:
            how = "failed: the captured code raised" if self.raised else "refused"
            return f"capture {how} at {self.refused_where}: {self.refused}\n    {self.refused_code}"
        nodes = self.nodes()
        lines = ran_eagerly_lines(self.ran_eagerly) + [line for r in nodes[:limit] for line in record_lines(r, {})]
        if limit is not None and len(nodes) > limit:
            lines.append(f"... {len(nodes) - limit} more records of work")
        return "\n".join(lines)

    __str__ = __repr__ = table


def record_lines(r: OpRecord, marks: dict[str, str]) -> list[str]:
    """A record in words; ``marks``: text to add after an argument, by name."""
    head = f"{r.label}  {r.op}" + ("" if r.launches else "  (no work)")
    out = [head + (f"   [{r.where}]" if marks else "")]
    mark = {name: f"  <-- FROM THE BATCH: {text}" for name, text in marks.items()}
    if r.scalars:
        out.append("    froze:  " + ", ".join(f"{n}={v!r}{mark.get(n, '')}" for n, v in r.scalars))
    for written, word in ((False, "reads: "), (True, "writes:"), (None, "passes:")):
        tensors = [t for t in r.tensors if t.written is written]
        if tensors:
            out.append(f"    {word} " + ", ".join(f"{t}{mark.get(t.name, '')}" for t in tensors))
    return out


def check_limit(limit) -> None:
    """How many records a table shows: an int >= 0, or ``None`` for all (``ValueError`` otherwise)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit = {limit!r}; expected an int >= 0 (how many records to show), or None for all")


def check_labels(labels) -> dict[str, torch.Tensor]:
    """``labels`` as a dict of name -> tensor (``None``: no labels); ``ValueError`` otherwise."""
    if labels is None or isinstance(labels, dict) and all(isinstance(k, str) and isinstance(t, torch.Tensor)
                                                          for k, t in labels.items()):
        return labels or {}
    raise ValueError(f"labels = {labels!r}; expected a dict of name -> tensor, or None")


# ---------------------------------------------------------------------------------------------
# Making the record


class RecordMode(TorchDispatchMode):
    """The dispatch half of a :class:`Recording`: every op issued in the ``with`` block goes to it."""

    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.recording.op(func, args, kwargs or {})


class Recording:
    """The record of one capture, being made (``labels``: tensors to name; ``stop``: the frame that
    entered the capture, where the captured code ends). The hooks are what a CUDA capture does by
    itself; the CPU emulation's capture overrides them."""

    def __init__(self, labels: dict[str, torch.Tensor], stop=None):
        self.record = CaptureRecord([])
        self.stop = stop
        self._sinks = [self.record.records]  # where records go: the innermost custom op's body
        self._count = 0
        self._made: dict[int, tuple[int, int]] = {}  # storage address -> (index of the op that made it, output)
        self._numbers: dict[int, object] = {}  # storage address -> the Python number it holds
        self._labels = [(name, t, _storage(t), _byte_range(t)) for name, t in labels.items()]

    @contextlib.contextmanager
    def active(self):
        """Record the ``with`` block; yields the :class:`CaptureRecord`, filled as the block runs."""
        with RecordMode(self), launches_seen_by(self):
            yield self.record

    def check(self, func, args, kwargs) -> None:  # refuse an op where a capture refuses it
        pass

    def call(self, func, args, kwargs):  # run an op of the captured code
        return func(*args, **kwargs)

    def body_guard(self, func, args, kwargs, body: list):  # what a custom op's body runs in
        return contextlib.nullcontext()

    def before_launch(self, tensors: list[torch.Tensor]) -> None:  # just before a Triton launch
        pass

    def replay(self, func, args, kwargs, refresh: tuple = ()):  # a record's relaunch (CUDA: the graph's)
        return None

    def op(self, func, args, kwargs):
        """Record one dispatched op and run it (refusals, custom ops and composite ops included)."""
        self.check(func, args, kwargs)
        if func.namespace not in _TORCH_NAMESPACES:
            return self._custom_op(func, args, kwargs)
        if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            # Only below autograd (in a custom op's body) does an op made of others get here: take
            # it apart as autograd would have, so its parts are refused and recorded one by one.
            with RecordMode(self):
                return func.decompose(*args, **kwargs)
        index, where = self._start()
        if func is torch.ops.aten.lift_fresh.default:
            self._note_number(args[0])
        scalars, tensors = self._op_arguments(func, args, kwargs)
        out = self.call(func, args, kwargs)
        with torch._C.DisableTorchFunction():
            inputs = {_storage(t) for t in tensors_in((args, kwargs))}
            fresh = tuple(t if isinstance(t, torch.Tensor) and _storage(t) not in inputs else None
                          for t in tree_leaves(out))
            for k, t in enumerate(fresh):
                if t is not None and _storage(t):
                    self._made[_storage(t)] = (index, k)
        launches = launches_kernel(func) and (func._schema.is_mutable or any(t is not None for t in fresh))
        replay = self.replay(func, args, kwargs, fresh) if launches else None
        self._sinks[-1].append(OpRecord(index, str(func), "op", launches, scalars, tensors, *where, replay=replay))
        return out

    def _custom_op(self, func, args, kwargs):
        """Run a custom op's body under this recording; its records go under the op's."""
        index, where = self._start()
        scalars, tensors = self._op_arguments(func, args, kwargs)
        body: list[OpRecord] = []
        self._sinks.append(body)
        try:
            with self.body_guard(func, args, kwargs, body), RecordMode(self):
                # Straight to the op's kernel (its body), below this mode: the body's own ops come
                # back through the mode entered above, its launches through the wrapped launcher.
                return func.redispatch(_kernel_keys(args, kwargs), *args, **kwargs)
        finally:
            self._sinks.pop()
            # What the body launched is in the graph even if it raised afterwards (as on CUDA).
            self._sinks[-1].append(OpRecord(index, str(func), "custom op", any(r.launches for r in body), scalars,
                                            tensors, *where, tuple(body)))

    def launch(self, launcher: Callable, kernel, grid, args: tuple, kwargs: dict):
        """Record one Triton launch of the captured code and run it (``launcher``: Triton's own ``run``)."""
        index, where = self._start()
        if callable(grid):  # evaluated here, in the captured code: a host read in it is refused
            grid = grid(grid_meta(kernel, args, kwargs))
        grid = tuple(int(size) for size in grid)  # a tensor here is read on the host: refused too
        with torch._C.DisableTorchFunction():
            named = [*zip(kernel.arg_names, args), *kwargs.items()]
            scalars = (("grid", grid), *((n, v) for n, v in named if not isinstance(v, torch.Tensor)))
            tensors = tuple(self._tensor(n, v, None) for n, v in named if isinstance(v, torch.Tensor))
        with python_modes_off():  # Triton's own tensor work is the launch, not the captured code
            self.before_launch(tensors_in((args, kwargs)))
            out = launcher(kernel, *args, grid=grid, warmup=False, **kwargs)
        replay = self.replay(lambda *a, **k: launcher(kernel, *a, grid=grid, warmup=False, **k), args, kwargs)
        self._sinks[-1].append(OpRecord(index, kernel_name(kernel), LAUNCH, True, scalars, tensors, *where,
                                        replay=replay, kernel=kernel_code(kernel)))
        return out

    def _start(self) -> tuple[int, tuple[str, str, tuple]]:
        self._count += 1
        frame, frames = sys._getframe(1), []
        while frame is not None:
            frames.append((frame, frame.f_lineno))
            frame = frame.f_back
        return self._count - 1, locate(frames, self.stop, self.record.ran_eagerly)

    def _note_number(self, t: torch.Tensor) -> None:
        """A tensor made from Python data (a number written with ``t[i] = 0.0``): keep its value,
        read on the host with every mode out of the way (a host tensor, not yet copied)."""
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            if t.device.type == "cpu" and t.numel() <= 8:
                self._numbers[_storage(t)] = t.tolist()

    def _op_arguments(self, func, args, kwargs) -> tuple[tuple, tuple]:
        scalars, tensors = [], []
        with torch._C.DisableTorchFunction():
            for i, arg in enumerate(func._schema.arguments):
                if i >= len(args) and arg.name not in kwargs:
                    continue
                value = args[i] if i < len(args) else kwargs[arg.name]
                written = arg.alias_info is not None and arg.alias_info.is_write
                leaves = tensors_in(value)
                if leaves:
                    many = len(leaves) > 1 or isinstance(value, (list, tuple))
                    tensors += [self._tensor(f"{arg.name}[{k}]" if many else arg.name, t, written)
                                for k, t in enumerate(leaves)]
                elif _is_number(value):
                    scalars.append((arg.name, list(value) if isinstance(value, (list, tuple)) else value))
                elif isinstance(value, torch.Generator):
                    scalars.append((arg.name, generator_arg(value)))
                elif isinstance(value, BY_VALUE):
                    scalars.append((arg.name, value))
        return tuple(scalars), tuple(tensors)

    def _tensor(self, name: str, t: torch.Tensor, written: bool | None) -> TensorArg:
        storage, (b0, b1) = _storage(t), _byte_range(t)
        shape, stride = tuple(t.shape), tuple(t.stride())
        labelled = [(l1 - l0, label, lt, l0) for label, lt, ls, (l0, l1) in self._labels
                    if ls == storage and l0 <= b0 and b1 <= l1]
        if storage in self._numbers:
            value = self._numbers[storage]
            text, key = f"the Python number {value!r}", ("number", value, 0)
        elif labelled:  # the smallest labelled tensor that holds it
            _, label, lt, l0 = min(labelled, key=lambda x: x[0])
            text, key = _view_text(label, lt, (b0 - l0) // t.element_size(), shape, stride), ("label", label, b0 - l0)
        elif storage in self._made:  # told apart across captures by the place of the op that made it
            op, k = self._made[storage]
            text, key = f"temporary of op {op}" + (f" (output {k})" if k else ""), ("made", op, k, b0)
        else:
            text, key = f"an unlabelled tensor {list(shape)}", ("unlabelled", storage, b0)
        if key[0] != "made":
            held = self.record.held.get(storage)
            if held is None or held.numel() < t.numel():
                self.record.held[storage] = t
        return TensorArg(name, written, text, (*key, shape, stride), shape, storage + b0, storage)


# ---------------------------------------------------------------------------------------------
# Helpers


def _kernel_keys(args, kwargs) -> torch._C.DispatchKeySet:
    """The dispatch keys that reach an op's backend kernel for these arguments (CPU without tensors)."""
    tensors = tensors_in((args, kwargs))
    return (torch._C._dispatch_keys(tensors[0]) & torch._C._after_ADInplaceOrView_keyset if tensors
            else torch._C.DispatchKeySet(torch._C.DispatchKey.CPU))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return start, start
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return start, start + span * t.element_size()


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
    moving = {st: n for n, st in zip(shape, stride) if n > 1}  # strides of the view's dims that move
    if len(moving) != sum(1 for n in shape if n > 1):
        return generic
    parts = []
    for s, size in zip(base.stride(), base.shape):
        i, offset = divmod(offset, s)
        m = moving.pop(s, None) if size > 1 else None
        if m is not None and i + m > size:
            return generic
        parts.append(str(i) if m is None else ":" if (i == 0 and m == size) else f"{i or ''}:{i + m}")
    while parts and parts[-1] == ":":
        parts.pop()
    return generic if moving else f"{name}[{', '.join(parts)}]" if parts else name
