"""The audit's judge: a graph captured on one load, replayed after another, against an eager call.

:func:`c2graph.audit` asks this module what a step really does. Per load it runs the step
eagerly, observed (:class:`Observer`: the record of a capture, made of an eager call, with the
bytes of every tensor from before the call kept before its first write), and compares what the
step writes there with what a replay of the graph captured on the load before writes, from the
same state. Everything either of them writes is given its bytes back afterwards, so the runs never
see each other's writes, and the caller finds every tensor as the loads left it.

- What is compared: every tensor from before the step that a record names (read or written, by
  the eager calls and the captures), every labelled tensor, every tensor another thread wrote
  during an eager call (found by its version counter: work handed to a worker thread, which no
  record of this thread sees), and the step's return value against the graph's.
- Random by design: the step is called eagerly twice from the same state. A tensor that differs
  between the two although both calls froze the same values (a random draw, an atomic sum) is not
  compared, and the verdict says so; one whose calls froze different values (a call counter) is.
- Compiled code: ``torch.compile``'d functions run their Python eagerly during the audit (in the
  eager calls, the captures and the replays alike), so the record sees inside them and the two
  runs do the same arithmetic; nothing is compiled or recompiled, and compiled code stays compiled.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .emulation import answering_is_current_stream_capturing
from .graph import compiled_code_run_eagerly
from .op_record import CaptureRecord, Recording


class Saved:
    """Bytes of storages from before the step, each kept once (the first time it is asked for)."""

    def __init__(self):
        self.kept: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    def keep(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in self.kept:
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                self.kept[key] = (storage, storage.clone())

    def restore(self) -> None:
        """Give every kept storage its bytes back."""
        with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.inference_mode(False):
            for storage, saved in self.kept.values():
                storage.copy_(saved)


class Observer(Recording):
    """The record of an eager call of the step (no capture, nothing refused), keeping in ``saved``
    the bytes of every tensor from before the call before the call first writes it."""

    def __init__(self, labels: dict[str, torch.Tensor], stop, saved: Saved):
        super().__init__(labels, stop)
        self.saved = saved

    def call(self, func, args, kwargs):
        if func._schema.is_mutable:
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(arg.name)
                    for t in tree_leaves(value):
                        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._made:
                            self.saved.keep(t)
        return func(*args, **kwargs)

    def before_launch(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:  # a Triton kernel may write any tensor it is given
            if t.untyped_storage().data_ptr() not in self._made:
                self.saved.keep(t)


@dataclass
class EagerCall:
    """One observed eager call: its record, its return value, the tensors from before it that
    another thread wrote during it (by storage address), and the threads it started."""

    record: CaptureRecord
    returned: list[torch.Tensor]
    elsewhere: dict[int, torch.Tensor]
    threads: tuple[tuple[str, str], ...] = ()  # where each thread started during it began its work


def call_eagerly(step: Callable[[], object], labels: dict[str, torch.Tensor], saved: Saved) -> EagerCall:
    """Call ``step()`` once, observed, as :func:`~c2graph.graphs.graph.warmup` calls it: on CUDA on a
    side stream; without CUDA with ``torch.cuda.is_current_stream_capturing()`` answering ``False``
    (torch's own again after, on every exit)."""
    versions, started = _versions(), []
    observer = Observer(labels, sys._getframe(), saved)
    stream = torch.cuda.Stream() if torch.cuda.is_available() else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
    side = torch.cuda.stream(stream) if stream is not None else answering_is_current_stream_capturing()
    with side, observer.active() as record, _threads_seen(started):
        returned = step()
    if stream is not None:
        torch.cuda.current_stream().wait_stream(stream)
    writes: dict[int, int] = {}  # storage -> how many records of this thread write it (each bumps its version once)
    for r in record.flat():
        for key in {t.storage for t in r.tensors if t.written and t.key[0] != "made"}:
            writes[key] = writes.get(key, 0) + 1
    elsewhere = {}
    for t, version in versions:
        now = _version(t)
        if now is not None and now != version:
            key = t.untyped_storage().data_ptr()
            if now - version > writes.get(key, 0):
                elsewhere.setdefault(key, t)
    returned = [t for t in tree_leaves(returned) if isinstance(t, torch.Tensor)]
    return EagerCall(record, returned, elsewhere, tuple(started))


_STDLIB = sysconfig.get_paths()["stdlib"]


@contextlib.contextmanager
def _threads_seen(started: list):
    """Note, in ``started``, where each thread started in the block begins to run code outside the
    standard library (its work, as ``(where, code)``): a hook of ``threading.setprofile`` for the
    block only, each thread's own profiler switched off once it has been seen."""

    def hook(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and not path.startswith(_STDLIB) and not path.startswith("<frozen"):
            sys.setprofile(None)
            line = frame.f_code.co_firstlineno
            started.append((f"{os.path.basename(path)}:{line} in {frame.f_code.co_name}",
                            linecache.getline(path, line).strip()))

    before = threading.getprofile()
    threading.setprofile(hook)
    try:
        yield
    finally:
        threading.setprofile(before)


def _versions() -> list[tuple[torch.Tensor, int]]:
    """Every tensor alive in the process with its version counter (bumped by each in-place op on it)."""
    out = []
    for obj in gc.get_objects():
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and not obj.is_meta:  # no fake or functional tensor
            version = _version(obj)
            if version is not None:
                out.append((obj, version))
    return out


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


def clone_all(tensors: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """A copy of each tensor, with every mode out of the way."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.inference_mode(False):
        return {key: t.clone() for key, t in tensors.items()}


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """The rows (indices of the first dimension; ``[0]`` for a scalar) where ``a`` and ``b``
    differ, bit for bit apart from NaN, which equals NaN."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.inference_mode(False):
        if a.shape != b.shape:
            return list(range(max(1, a.shape[0] if a.dim() else 1)))
        same = a == b
        if a.is_floating_point() or a.is_complex():
            same |= a.isnan() & b.isnan()
        differ = ~same
        if a.dim() == 0:
            return [0] if bool(differ) else []
        return differ.reshape(a.shape[0], -1).any(dim=1).nonzero().flatten().tolist()


def rows_text(rows: list[int], t: torch.Tensor) -> str:
    """``"rows 3-7, 12"`` (of ``t``'s first dimension); ``"its value"`` for a scalar."""
    if t.dim() == 0:
        return "its value"
    spans, start = [], rows[0]
    for prev, row in zip(rows, rows[1:] + [None]):
        if row != prev + 1:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = row
    return f"row{'s' if len(rows) > 1 else ''} {', '.join(spans)} of {t.shape[0]}"


def first_difference(a: torch.Tensor, b: torch.Tensor, row: int) -> tuple[str, str]:
    """The first differing value of ``row`` in ``a`` and in ``b``, as text."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.inference_mode(False):
        x, y = (a[row] if a.dim() else a).flatten(), (b[row] if b.dim() else b).flatten()
        if x.shape != y.shape:
            return f"shape {list(a.shape)}", f"shape {list(b.shape)}"
        same = x == y
        if x.is_floating_point() or x.is_complex():
            same |= x.isnan() & y.isnan()
        k = int((~same).nonzero()[0]) if bool((~same).any()) else 0
        return repr(x[k].item()), repr(y[k].item())


# ---------------------------------------------------------------------------------------------
# One audit's runs: per load, two eager calls, a capture, and a replay of the load before's graph


@dataclass(frozen=True)
class Mismatch:
    """A tensor that a replay wrote otherwise than the eager call after the same load: ``rows``
    in words, and the first differing value of each (``eager``, ``replay``); ``key``: its storage."""

    tensor: str
    rows: str
    eager: str
    replay: str
    key: int = 0


@dataclass(frozen=True)
class Replayed:
    """Load ``load`` (past the first): the graph captured on load ``replayed``, replayed from the
    same state as an eager call after it. ``compared``: the tensors compared; ``differed_in``:
    what the step reads that the two loads held differently; ``mismatches``; ``random``: tensors
    not compared, two eager calls having written them differently with the same values frozen;
    ``elsewhere``: tensors another thread wrote during the eager call."""

    load: int
    replayed: int
    compared: tuple[str, ...]
    differed_in: tuple[str, ...]
    mismatches: tuple[Mismatch, ...]
    random: tuple[str, ...]
    elsewhere: tuple[str, ...]
    eager: CaptureRecord
    threads: tuple[tuple[str, str], ...] = ()


def judge(step: Callable[[], object], loads, labels: dict[str, torch.Tensor], capture,
          unordered: dict[int, set[int]] | None = None) -> tuple[list, list, list]:
    """Per load: ``load()``, an eager call (observed: its record, kept before it writes), and for
    a load past the first a second one; ``capture()`` (returns ``(graph, record, returned)``); and
    for a load past the first a replay of the graph of the load before, compared with the first
    eager call. Returns the captures' records, the eager calls' records and the :class:`Replayed`.
    Every tensor written is given back the bytes the load left it. ``unordered``: rows not
    compared, by tensor (its storage's address)."""
    tensors = {_key(t): t for t in labels.values()}
    names = {_key(t): name for name, t in labels.items()}
    captures, eagers, judged, inputs, graphs, graphs_records = [], [], [], {}, [], []
    with compiled_code_run_eagerly():
        for i, load in enumerate(loads):
            load()
            saved = Saved()
            for t in tensors.values():
                saved.keep(t)
            first = call_eagerly(step, labels, saved)
            eagers.append(first.record)
            _name_all(first.record, tensors, names)
            for key, t in first.elsewhere.items():
                tensors.setdefault(key, t)
                names.setdefault(key, f"a tensor {list(t.shape)} another thread wrote")
            after = clone_all(tensors)
            returned = [t.detach().clone() for t in first.returned]
            saved.restore()
            written = _writes(first.record) | {k for k, t in after.items()
                                                 if k in saved.kept and not _equal(t, saved.kept[k][1], tensors[k])}
            varied: set = set()
            if i:
                second = call_eagerly(step, labels, saved)
                again = clone_all(tensors)
                saved.restore()
                if _same_frozen(first.record, second.record):
                    varied = {k for k in written if differing_rows(after[k], again[k])}
                    varied |= {("returned", k) for k, (a, b) in enumerate(zip(returned, second.returned))
                               if differing_rows(a, b)}
            now = {k: t for k, t in clone_all(tensors).items() if k not in written and k not in first.elsewhere}
            graph, record, captured_out = capture()
            captures.append(record)
            saved.restore()
            if record.refused:
                break
            if i:
                previous, previous_out = graphs[-1]
                previous.replay()
                replayed = clone_all(tensors)
                outs = [t.detach().clone() for t in previous_out]
                saved.restore()
                written |= _writes(graphs_records[-1])
                written |= {k for k, t in replayed.items()
                            if k in saved.kept and not _equal(t, saved.kept[k][1], tensors[k])}
                differed = [names.get(k, "?") for k in now if k in inputs and differing_rows(now[k], inputs[k])]
                judged.append(_compare(i, after, replayed, returned, outs, written, names, varied, differed, first,
                                       unordered or {}))
            inputs = now
            graphs.append((graph, captured_out))
            graphs_records.append(record)
            for key, t in record.held.items():
                tensors.setdefault(key, t)
                names.setdefault(key, _label_of(record, key) or f"a tensor {list(t.shape)} the capture touched")
    return captures, eagers, judged


def _compare(i, eager, replay, eager_out, replay_out, written, names, varied, differed_in, first,
             unordered) -> Replayed:
    """Every tensor, compared; ``compared`` names those the eager call or the replay wrote."""
    mismatches, compared = [], []
    for key, e in eager.items():
        if key in varied or key not in replay:
            continue
        if key in written:
            compared.append(names.get(key, "?"))
        rows = [r for r in differing_rows(e, replay[key]) if r not in unordered.get(key, ())]
        if rows:
            mismatches.append(Mismatch(names.get(key, "?"), rows_text(rows, e),
                                       *first_difference(e, replay[key], rows[0]), key))
    for k, (e, r) in enumerate(zip(eager_out, replay_out)):
        if ("returned", k) in varied:
            continue
        compared.append(f"the step's return value [{k}]")
        rows = differing_rows(e, r)
        if rows:
            mismatches.append(Mismatch(f"the step's return value [{k}]", rows_text(rows, e),
                                       *first_difference(e, r, rows[0])))
    return Replayed(i, i - 1, tuple(compared), tuple(differed_in), tuple(mismatches),
                    tuple(f"the step's return value [{k[1]}]" if isinstance(k, tuple) else names.get(k, "?")
                          for k in varied),
                    tuple(names[k] for k in first.elsewhere), first.record,
                    first.threads)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _equal(a: torch.Tensor, saved_storage: torch.UntypedStorage, t: torch.Tensor) -> bool:
    """Whether ``a`` (a copy of ``t`` after a call) equals ``t`` as kept in ``saved_storage``."""
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.inference_mode(False):
        before = torch.empty(0, dtype=t.dtype, device=t.device).set_(saved_storage, t.storage_offset(), t.shape,
                                                                       t.stride())
        return not differing_rows(a, before)


def _writes(record: CaptureRecord) -> set[int]:
    """The storages from before the step that a record's torch ops write (a Triton kernel's pointers
    count where their bytes change: a pointer does not say whether the kernel writes it)."""
    return {t.storage for r in record.flat() for t in r.tensors if t.written and t.key[0] != "made"}


def _same_frozen(a: CaptureRecord, b: CaptureRecord) -> bool:
    """Whether two records froze the same ops with the same values (tensors aside)."""
    flat_a, flat_b = a.flat(), b.flat()
    return len(flat_a) == len(flat_b) and all(
        (x.op, x.where, repr(x.scalars), x.kernel) == (y.op, y.where, repr(y.scalars), y.kernel)
        for x, y in zip(flat_a, flat_b))


def _name_all(record: CaptureRecord, tensors: dict, names: dict) -> None:
    for key, t in record.held.items():
        tensors.setdefault(key, t)
        names.setdefault(key, _label_of(record, key) or f"a tensor {list(t.shape)}")


def _label_of(record: CaptureRecord, key: int) -> str:
    """How the record names the tensor of storage ``key``: its label, else the first op argument it is, and where."""
    for r in record.flat():
        for arg in r.tensors:
            if arg.storage == key and arg.key[0] != "made":
                if arg.key[0] == "label":
                    return arg.key[1]
                held = record.held[key]
                how = "written" if arg.written else "passed" if arg.written is None else "read"
                return (f"the {str(held.dtype).replace('torch.', '')} tensor {list(held.shape)} {how} as {arg.name} "
                        f"by {r.op} at {r.stack[0][0] if r.stack else r.where}")
    return ""
