"""The CPU emulation of a CUDA graph: record a capture's launches, replay them without any Python.

What it reproduces
------------------
- **Recording.** The capture's record (:mod:`c2graph.graphs.op_record`, which the capture audit
  reads too): every torch op at the dispatch level and every Triton launch where Triton's
  launcher is entered, every argument that is not a tensor frozen at its capture-time value (a
  Python int, a slice's bounds, a list of sizes, a grid).
- **Tensors by their memory.** A record holds each tensor as a view of the memory and shape it
  had at capture, as a CUDA graph holds a pointer: a tensor given other memory afterwards
  (``x.data = y``, ``x.set_(y)``) or a smaller shape (``x.resize_(n)``) is still read and
  written where and as it was. Only ``copy_`` into the captured memory reaches a replay.
- **Custom ops are one node, replayed as launches.** The body of a custom op
  (``torch.library.custom_op``) runs once at capture under the same refusals as the caller's
  code (:mod:`c2graph.graphs.refusals`); a replay relaunches the torch ops and Triton launches it
  made, with the arguments they got, never the body's Python. So a launcher that sizes its grid
  from host state, or reads a count with ``.item()``, behaves as under CUDA: frozen, or refused.
  A grid callable is evaluated in the captured code: a host read in it
  (``k[lambda meta: (int(n.item()),)]``) is refused too.
- **A capture launches nothing.** Each op does run once, so that tensors made inside the block
  exist (like a graph's private outputs) and the ops' own checks run; but every tensor that
  existed before the capture and was written inside it gets its bytes back when the block ends,
  as a CUDA capture leaves them. Tensors made inside the block hold capture-time values, where a
  CUDA graph's hold garbage until the first replay: read outputs after a replay.
- **Replay** relaunches the records in order: in-place and ``out=`` ops, and ops whose schema
  marks an argument as written (``Tensor(a!)``), write the same memory again; an out-of-place op
  recomputes and copies into the tensor it returned at capture, so outputs are the same objects,
  overwritten by every replay. Views are not relaunched. Bytes that no launch writes (the tail
  of a padded buffer, memory from ``torch.empty``) keep what they held: stale data persists.
- **Random ops** (tag ``nondeterministic_seeded``) draw from the graph's own generator state,
  forked from torch's default CPU generator when capture begins: each replay draws fresh
  numbers, as a CUDA graph does.
- **Asking whether a capture is on.** ``torch.cuda.is_current_stream_capturing()`` is ``True``
  in the thread of an emulated capture, as in a CUDA capture (a guard on it works), and nowhere
  else. For the extent of the capture (and, on a machine without CUDA, of
  :func:`~c2graph.graphs.graph.warmup` and of :func:`c2graph.audit`'s eager calls of the step)
  ``torch.cuda.is_current_stream_capturing`` and
  ``torch.cuda.graphs.is_current_stream_capturing`` are this module's function, which answers
  ``True`` in the capturing thread only and, in any other thread, torch's answer (``False`` on a
  machine without CUDA, where torch's own raises); when the capture ends, on every exit, they are
  torch's own objects again. Code that took the function by name before the capture
  (``from torch.cuda import is_current_stream_capturing``) holds torch's own, which on a machine
  without CUDA raises.
- **Pointers.** Reading ``data_ptr()`` is allowed, as under CUDA (it is no host sync): a plan
  cache keyed by addresses works.
- **Threads.** A capture records and refuses the work of its own thread: ops through a dispatch
  mode and a function mode (torch keeps both per thread), Triton launches through the launcher
  (:mod:`c2graph.graphs.triton_launches`); another thread's work runs eagerly, as it would
  without the capture, and its writes stay.
- Capture runs in the caller's grad mode; replay runs under ``torch.inference_mode()``, so it
  can write tensors made in inference mode as well as ordinary ones.

What it does not reproduce
--------------------------
- Memory pools, streams and kernel-level concurrency, launch cost and timing. Replay allocates
  temporaries for out-of-place ops, where a CUDA graph allocates nothing.
- Work it cannot see: it records torch ops and Triton launches. A kernel launched through raw
  pointers (``data_ptr()`` handed to a C++ extension or ``ctypes``) is invisible, and replay
  skips it; a custom op whose body reads pointers and records no work at all is refused, as that
  is the shape of such a launch. An op from a C++ extension is recorded by the torch ops it
  dispatches, not its own kernels.
- A tensor that the capture writes and another thread writes during it: the capture gives it
  its bytes from before the capture when it ends, the other thread's write included. The random
  stream of a graph is swapped into torch's default CPU generator around each random op, so
  another thread drawing at that very moment draws from it.
- Host tensors beside device ones: every tensor here stands for a device tensor. A CPU scalar
  tensor in a CUDA op (``x * torch.tensor(2.0)``) is read by CUDA at capture and frozen as a
  number; the emulation reads it afresh at every replay.
- A captured tensor grown by ``resize_`` past its memory: torch moves its storage, and CUDA
  replays into the freed memory; the emulation follows the moved storage.
- The caller's random stream across replays: a CUDA replay advances the CUDA generator's offset
  by what the graph draws, so an eager draw after a replay differs from one without it; the
  emulation's replays leave torch's default generator where it was.
- Freeing a CUDA graph that finished its capture, in the middle of another capture, invalidates
  that capture (the destruction is a CUDA call it refuses); an emulated graph owns no CUDA
  objects, and freeing one refuses nothing.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .ops import tensors_in
from .op_record import OpRecord, Recording
from .refusals import PREVIOUS_ERROR, CaptureState, HostGuard
from .triton_launches import python_modes_off


_THIS_THREAD = threading.local()  # .capturing: whether this thread is in an emulated capture
_ANSWERING = {"calls": 0, "torch": None}  # emulated captures and warm-ups in progress; torch's own function
_ANSWERING_LOCK = threading.Lock()


def is_current_stream_capturing() -> bool:
    """``True`` in the thread of an emulated capture; elsewhere torch's answer (``False`` without CUDA)."""
    if getattr(_THIS_THREAD, "capturing", False):
        return True
    return torch.cuda.is_available() and _ANSWERING["torch"]()


@contextlib.contextmanager
def answering_is_current_stream_capturing():
    """:func:`is_current_stream_capturing` in place of torch's (``torch.cuda`` and ``torch.cuda.graphs``)
    for the ``with`` block: torch's own again when the last such block of the process ends, on every exit."""
    with _ANSWERING_LOCK:
        if _ANSWERING["calls"] == 0:
            _ANSWERING["torch"] = torch.cuda.graphs.is_current_stream_capturing
            torch.cuda.is_current_stream_capturing = torch.cuda.graphs.is_current_stream_capturing = \
                is_current_stream_capturing
        _ANSWERING["calls"] += 1
    try:
        yield
    finally:
        with _ANSWERING_LOCK:
            _ANSWERING["calls"] -= 1
            if _ANSWERING["calls"] == 0:
                torch.cuda.is_current_stream_capturing = torch.cuda.graphs.is_current_stream_capturing = \
                    _ANSWERING["torch"]


class EmulatedGraph:
    """The record of one emulated capture, and its replay."""

    def __init__(self):
        self._records: list[OpRecord] = []

    @contextlib.contextmanager
    def capturing(self, labels: dict[str, torch.Tensor] | None, stop):
        """Record the ``with`` block (``labels`` and ``stop`` as in :class:`Recording`); yields the record."""
        capture = _Capture(labels or {}, stop)
        try:
            with answering_is_current_stream_capturing():
                _THIS_THREAD.capturing = True
                try:
                    with HostGuard(capture.state), capture.active() as record:
                        yield record
                finally:
                    _THIS_THREAD.capturing = False
        finally:
            capture.restore_written()
            if capture.state.failed:
                raise RuntimeError(PREVIOUS_ERROR)
        self._records = record.records

    def replay(self) -> None:
        with torch.inference_mode():
            for record in self._records:
                record.run()

    def nodes(self) -> list[str]:
        return [r.op for r in self._records if r.launches]

    def pool(self):
        return None


class _GraphRng:
    """An emulated graph's own random stream.

    Forked from torch's default CPU generator when capture begins and advanced by every draw of
    the capture and of each replay, so each replay draws fresh numbers while the caller's
    generator is left where it was.
    """

    def __init__(self):
        self._state = torch.default_generator.get_state()

    def run(self, func, *args, **kwargs):
        caller = torch.default_generator.get_state()
        torch.default_generator.set_state(self._state)
        try:
            return func(*args, **kwargs)
        finally:
            self._state = torch.default_generator.get_state()
            torch.default_generator.set_state(caller)


class _Capture(Recording):
    """One emulated capture: its record, and what a CUDA capture does by itself: refuse host
    reads (:mod:`c2graph.graphs.refusals`), leave the memory it writes as it was, draw from the
    graph's own random stream, and hold each tensor by the memory it had."""

    def __init__(self, labels: dict[str, torch.Tensor], stop):
        super().__init__(labels, stop)
        self.state = CaptureState()
        self.rng = _GraphRng()
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    def check(self, func, args, kwargs) -> None:
        self.state.check_op(func, args, kwargs)

    def call(self, func, args, kwargs):
        if func._schema.is_mutable:
            self.save_before_write(_written(func, args, kwargs))
        out = self.rng.run(func, *args, **kwargs) if _seeded(func) else func(*args, **kwargs)
        if func is torch.ops.aten.lift_fresh.default:
            self.state.host_number = out
        return out

    @contextlib.contextmanager
    def body_guard(self, func, args, kwargs, body: list):
        self.save_before_write(_written(func, args, kwargs))
        guard = HostGuard(self.state)
        with guard:
            yield
        if guard.pointer_reads and not any(r.launches for record in body for r in record.flat()):
            raise RuntimeError(
                f"{func} read raw pointers (data_ptr()) inside an emulated capture and recorded no work: "
                "a kernel launched through raw pointers is invisible to the emulation, and replay would "
                "skip it. Launch the kernel with Triton inside the custom op."
            )

    def before_launch(self, tensors: list[torch.Tensor]) -> None:
        self.state.check_still_valid()
        self.save_before_write(tensors)  # the kernel may write any tensor it is given

    def replay(self, func, args, kwargs, refresh: tuple = ()):
        if isinstance(func, torch._ops.OpOverload) and _seeded(func):
            func = functools.partial(self.rng.run, func)
        with python_modes_off():  # the views that hold the memory are no part of the recorded work
            return _Replay(func, *tree_map(_held, (args, kwargs, refresh)))

    def save_before_write(self, tensors) -> None:
        """Keep the bytes of each storage from before the capture that a launch may write."""
        for t in tensors:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() and key not in self._made and key not in self._saved:
                self._saved[key] = (storage, storage.clone())

    def restore_written(self) -> None:
        """Give every storage from before the capture that a launch wrote its bytes back."""
        for storage, saved in self._saved.values():
            storage.copy_(saved)
        self._saved.clear()


@dataclass(frozen=True)
class _Replay:
    """A record's relaunch: ``func`` on the captured arguments; an op's fresh outputs copied into
    the tensors it returned at capture (``refresh``: one per output, ``None`` where an output
    aliases an argument or is no tensor)."""

    func: Callable
    args: tuple
    kwargs: dict
    refresh: tuple

    def __call__(self) -> None:
        out = self.func(*self.args, **self.kwargs)
        for target, value in zip(self.refresh, tree_leaves(out)):
            if target is not None:
                target.copy_(value)


def _held(leaf):
    """A tensor as a record holds it: a view of the memory and shape it has now (other leaves as they are)."""
    return leaf.detach() if isinstance(leaf, torch.Tensor) else leaf


def _seeded(func) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes: its arguments marked ``Tensor(a!)`` (``self`` of ``add_``, ``out=``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += tensors_in(args[i] if i < len(args) else kwargs.get(arg.name))
    return written
