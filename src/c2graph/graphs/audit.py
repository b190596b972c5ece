"""A capture audit: what did this graph freeze, and which of it came from the batch seen at capture?

Every silent graph bug of the prefill story is a value frozen at capture that should have been
read at replay. A capture freezes, per node, every argument that is not a tensor (a Python int,
float or bool, a list of sizes) and every tensor by its address. The audit records them while
the work is captured:

- :func:`audit_capture` captures ``fn()`` in a new :class:`~c2graph.graphs.graph.Graph` with two
  modes entered inside the capture: a ``TorchDispatchMode`` that sees every op the captured code
  issues (it sits above a CUDA graph and above the CPU emulation alike) and records its name, its
  non-tensor arguments by value, and its tensor arguments by address, read or written, labelled
  when they lie in one of the ``labels`` tensors (``"low_ratio_extend_offsets"``, ``"pos[:32]"``);
  and a ``TorchFunctionMode`` that names the call a refused capture died in.
- :func:`audit_twice` captures the same work twice, with two different batches loaded (the same
  static sizes), and compares: a value that differs between the two captures, or a tensor read at
  an address (or of a shape) that differs, was taken from the batch, not from static sizes. A
  value equal in both captures may still come from a batch; two batches that differ everywhere
  the work could look (starts, counts, live rows) make that unlikely.
- :func:`audit_runner` does this for a prefill graph runner's bucket: the dummy batch, then a
  ragged one (:func:`audit_batch`).

Tensors made during the capture (temporaries) are named by the op that made them, so their
addresses, which may differ between two captures, are not mistaken for batch contents.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from ..compressor.batch import ExtendBatch, Request
from ..compressor.extend_offsets import build_extend_offsets
from .graph import Graph, warmup

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP = (_TORCH_DIR, os.path.abspath(__file__), os.path.join(_PACKAGE_DIR, "graphs", "graph.py"), "contextlib")
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


@dataclass
class CaptureRecords:
    """Every op of one capture, in order; ``refused`` is the capture's error (first line, and the
    call it died in) when the capture was refused."""

    records: list[OpRecord]
    refused: str | None = None


@dataclass(frozen=True)
class Flag:
    """A frozen argument that differs between the two captures: it came from the batch."""

    index: int
    op: str
    arg: str
    what: str  # "value", "address", "shape" or "op"
    first: object
    second: object

    def difference(self) -> str:
        """How the two captures differ, in words."""
        if self.what == "address" and self.first == self.second:
            return "read at a different address in each capture"
        if self.what == "value":
            return f"{self.first!r} in capture 1, {self.second!r} in capture 2"
        return f"{self.what} {self.first} in capture 1, {self.second} in capture 2"

    def __str__(self) -> str:
        if self.what == "op":
            return f"op {self.index}: the captured work itself changed: {self.first} vs {self.second}"
        return f"op {self.index} {self.op}: {self.arg}: {self.difference()}"


@dataclass
class GraphAudit:
    """Two captures of the same work with two batches loaded, and the arguments that differ.

    ``ok``: the capture was not refused and nothing it froze came from the batch.
    """

    title: str
    batches: tuple[str, str]
    first: CaptureRecords
    second: CaptureRecords | None
    flags: list[Flag] = field(default_factory=list)

    @property
    def refused(self) -> str | None:
        return self.first.refused or (self.second.refused if self.second else None)

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.flags

    def nodes(self) -> list[OpRecord]:
        """The records of the first capture that launch work (one graph node each, or more on CUDA)."""
        return [r for r in self.first.records if r.launches]

    def flagged(self, op: str | None = None) -> set[str]:
        """Names of the flagged arguments (of one op, given its name or a part of it)."""
        return {f.arg for f in self.flags if op is None or op in f.op}

    def table(self, *, limit: int | None = 12) -> str:
        """The audit in words: per op that launches work, what it froze, read and wrote; flags marked ``<-- FROM THE BATCH``.

        Nodes with a flag are always shown; others up to ``limit`` (``None``: all).
        """
        lines = [self.title, f"  captured with (1) {self.batches[0]}", f"           and (2) {self.batches[1]}"]
        if self.refused:
            return "\n".join(lines + [f"capture refused: {self.refused}"])
        flagged = {f.index: [] for f in self.flags}
        for f in self.flags:
            flagged[f.index].append(f)
        shown, hidden = 0, 0
        for r in self.first.records:
            if not (r.launches or r.index in flagged):
                continue
            if r.index not in flagged and limit is not None and shown >= limit:
                hidden += 1
                continue
            shown += 1
            lines += _record_lines(r, flagged.get(r.index, []))
        if hidden:
            lines.append(f"... {hidden} more ops that launch work, none flagged")
        if self.flags:
            lines.append(f"verdict: {len(self.flags)} frozen argument(s) came from the batch seen at capture")
        else:
            lines.append("verdict: nothing frozen came from the batch: the values are static sizes and "
                         "every tensor is read at an address that does not change")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


def _record_lines(r: OpRecord, flags: list[Flag]) -> list[str]:
    by_arg = {f.arg: f for f in flags}
    head = f"op {r.index}  {r.op}" + ("" if r.launches else "  (launches nothing)")
    if flags:
        head += f"   [{r.where}]"
    out = [head]
    if r.scalars:
        out.append("    froze:  " + ", ".join(_mark(f"{n}={v!r}", by_arg.get(n)) for n, v in r.scalars))
    for written, word in ((False, "reads: "), (True, "writes:")):
        tensors = [t for t in r.tensors if t.written == written]
        plain = [str(t) for t in tensors if t.name not in by_arg]
        if plain:
            out.append(f"    {word} " + ", ".join(plain))
        out += [f"    {word} " + _mark(str(t), by_arg[t.name]) for t in tensors if t.name in by_arg]
    return out


def _mark(text: str, flag: Flag | None) -> str:
    if flag is None:
        return text
    return f"{text}  <-- FROM THE BATCH: {flag.difference()}"


# ---------------------------------------------------------------------------------------------
# Recording


class _Auditor(TorchDispatchMode):
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


class _CallWatch(TorchFunctionMode):
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


def audit_capture(fn: Callable[[], object], labels: dict[str, torch.Tensor], *, backend: str | None = None
                  ) -> CaptureRecords:
    """Capture ``fn()`` in a new :class:`Graph` (``backend`` as there) and record every op it issues.

    ``labels``: tensors to name by where an argument lies. A refused capture is reported in
    ``refused`` (its error's first line and the call it died in), never raised.
    """
    if not isinstance(labels, dict) or not all(isinstance(t, torch.Tensor) for t in labels.values()):
        raise ValueError("labels must be a dict of name -> tensor")
    auditor, watch = _Auditor(labels), _CallWatch()
    try:
        with Graph(backend).capture(), watch, auditor:
            fn()
    except Exception as e:  # a refused capture is the finding, not a failure of the audit
        at = watch.refused_at or auditor.error_op or "the end of the capture"
        return CaptureRecords(auditor.records, f"{str(e).splitlines()[0]} (in {at})")
    return CaptureRecords(auditor.records)


def audit_twice(fn, load_first, load_second, labels, *, title: str, batches: tuple[str, str],
                warmup_iters: int = 1) -> GraphAudit:
    """Capture ``fn()`` after ``load_first()`` and again after ``load_second()``; flag what differs.

    Each capture is preceded by ``warmup_iters`` eager calls (lazy set-up stays out of the capture).
    """
    captures = []
    for load in (load_first, load_second):
        load()
        warmup(fn, iters=warmup_iters)
        captures.append(audit_capture(fn, labels))
        if captures[-1].refused:
            return GraphAudit(title, batches, captures[0], captures[1] if len(captures) > 1 else None)
    return GraphAudit(title, batches, captures[0], captures[1], compare_captures(*captures))


def compare_captures(first: CaptureRecords, second: CaptureRecords) -> list[Flag]:
    """Every argument that differs between two captures of the same work."""
    flags = []
    for a, b in zip(first.records, second.records):
        if a.op != b.op:
            return flags + [Flag(a.index, a.op, "op", "op", a.op, b.op)]
        sb = dict(b.scalars)
        flags += [Flag(a.index, a.op, n, "value", v, sb.get(n)) for n, v in a.scalars if sb.get(n) != v]
        tb = {t.name: t for t in b.tensors}
        for t in a.tensors:
            u = tb.get(t.name)
            if u is None or u.key != t.key:
                same_place = u is not None and u.key[:3] == t.key[:3]
                what = "shape" if same_place else "address"
                flags.append(Flag(a.index, a.op, t.name, what, t.shape if same_place else t.label,
                                  (u.shape if same_place else u.label) if u else None))
    if len(first.records) != len(second.records):
        n = min(len(first.records), len(second.records))
        flags.append(Flag(n, "", "op", "op", f"{len(first.records)} ops", f"{len(second.records)} ops"))
    return flags


# ---------------------------------------------------------------------------------------------
# The prefill graph runner's audit


def audit_batch(runner, bucket: int) -> ExtendBatch:
    """A ragged batch of ``bucket`` rows for the second capture: up to 3 requests starting at
    positions 1, 0 and 3, about a quarter of the rows padding, every ``raw_out_loc`` 0 (so its
    warm-up writes nothing)."""
    n = min(3, runner.request_slots, min(p.pool_requests for p in runner.layer_pools))
    live = bucket - max(1, bucket // 4) if bucket > 1 else bucket
    lengths = [live // n + (1 if i < live % n else 0) for i in range(n)]
    requests = tuple(Request(i, (1, 0, 3)[i], m) for i, m in enumerate(lengths))
    pos, req = torch.zeros(bucket, dtype=torch.int64), torch.zeros(bucket, dtype=torch.int64)
    row = 0
    for r in requests:
        pos[row:row + r.extend_len] = torch.arange(r.prefix_len, r.prefix_len + r.extend_len)
        req[row:row + r.extend_len] = r.pool_index
        row += r.extend_len
    dev, zeros = runner.device, torch.zeros(bucket, dtype=torch.int64, device=runner.device)
    offsets = build_extend_offsets(lengths, runner.request_slots, device=dev)
    return ExtendBatch(requests, pos.to(dev), req.to(dev), zeros, zeros.clone(), offsets, kv_slots_needed=1)


def audit_runner(runner, bucket: int) -> GraphAudit:
    """Audit the graph of ``bucket`` of a prefill graph runner (or a broken variant of one).

    The work is the runner's captured step (``runner._compress(bucket)``); the first capture loads
    the batch its graphs are captured with, the second refreshes the buffers with
    :func:`audit_batch`, the way a replay does.
    """
    if bucket not in runner.buckets:
        raise ValueError(f"bucket = {bucket!r}; expected one of the runner's buckets {runner.buckets}")
    batch = audit_batch(runner, bucket)
    xs = [layer.random_hidden(batch.live_rows, seed=i) for i, layer in enumerate(runner.layers)]
    lengths = ", ".join(str(r.extend_len) for r in batch.requests)
    starts = ", ".join(str(r.prefix_len) for r in batch.requests)
    batches = (f"the dummy batch: one request covering all {bucket} rows",
               f"a ragged batch: {batch.batch_size} requests of {lengths} rows from positions {starts}, "
               f"then {bucket - batch.live_rows} padding rows")
    name = type(runner).__name__ + (f" ({runner.variant})" if hasattr(runner, "variant") else "")
    title = f"audit of {name}, bucket {bucket}, {len(runner.layers)} layer(s): {runner.path} path"
    return audit_twice(lambda: runner._compress(bucket), lambda: runner._load_capture_batch(bucket),
                       lambda: runner.refresh(batch, xs), runner.labels(), title=title, batches=batches)


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
