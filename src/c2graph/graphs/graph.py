"""Capture and replay: one graph API over CUDA graphs, and a faithful CPU emulation of them.

::

    g = Graph()
    with g.capture():
        out = f(static_in)      # the Python runs once; its work is recorded, not launched
    static_in.copy_(new_rows)   # refresh the captured inputs in place ...
    g.replay()                  # ... relaunch the recorded work: `out` holds the new result
    g.nodes()                   # the recorded work, one name per node

On a CUDA machine :class:`Graph` wraps ``torch.cuda.CUDAGraph``, captured on a side stream
through ``torch.cuda.graph``. Without CUDA it *emulates* one (``backend="emulate"``), so the
notebooks show on a laptop what a capture freezes and what it refuses (SPEC §6).

What the emulation reproduces
-----------------------------
- **Recording.** Every op inside ``capture()`` is recorded at the dispatch level: its tensor
  arguments by identity (the same objects, kept alive), everything else by value. A Python int,
  a slice's int bounds, a list of sizes: all frozen at their capture-time values.
- **A capture launches nothing.** Each op does run once, so that tensors made inside the block
  exist (like a graph's private outputs) and the ops' own checks run; but every tensor that
  existed before the capture and was written inside it gets its bytes back when the block ends,
  so the capture leaves the caller's tensors as they were, as a CUDA capture does. Tensors made
  inside the block hold capture-time values, where a CUDA graph's hold garbage until the first
  replay: read outputs after a replay.
- **Replay** re-runs the recorded ops in order, and no Python of the caller. In-place and
  ``out=`` ops, and custom ops whose schema marks an argument as written (``Tensor(a!)``), write
  the same tensors again; an out-of-place op recomputes and copies into the tensor it returned
  at capture, so outputs are the same objects, overwritten by every replay. Views are not
  re-run: they alias storage that the other ops refresh. Only ``copy_`` into a captured tensor
  reaches a replay; rebinding a Python name does not. Bytes that no recorded op writes (the tail
  of a padded buffer, memory from ``torch.empty``) keep what they held: stale data persists.
The refusals below are what CUDA does, measured on an H200 with torch 2.11 (the emulation's
messages add a second line naming what was refused; CUDA's name nothing):

- **Host syncs** raise at once with CUDA's text, ``CUDA error: operation not permitted when
  stream is capturing`` (code 900), and invalidate the capture: every later op, and the end of
  the ``with`` block (even when the first error was caught), raise ``CUDA error: operation failed
  due to a previous error during capture`` (code 901). These are ``.item()``, ``int(t)``,
  ``bool(t)``, ``if t:``, printing a tensor, ``torch.equal``, ops with a data-dependent output
  shape (``nonzero``, ``unique``, ``masked_select``, ...), and boolean-mask indexing, or
  boolean-mask assignment of a tensor. ``t[mask] = number`` is allowed, as torch turns it into
  ``masked_fill_``.
- **Host copies** raise torch's own check, ``Cannot copy between CPU and CUDA tensors during
  CUDA graph capture unless the CPU tensor is pinned...``, *before* any CUDA call, so the capture
  stays valid if the error is caught: ``.cpu()``, ``.to("cpu")``, ``.tolist()``, a tensor built
  from Python data (``torch.tensor(list)``, ``torch.as_tensor``, ``t.new_tensor``, indexing with
  a Python list), and ``t[index_tensor] = number`` (the number is copied to the device).
  ``.numpy()`` raises CUDA's ``TypeError`` for a device tensor. In the emulation every tensor
  stands for a device tensor, so these refuse CPU tensors, though torch itself would not.
- **Random ops** (tag ``nondeterministic_seeded``) draw from the graph's own generator state,
  forked from torch's default CPU generator when capture begins: each replay draws fresh
  numbers, as a CUDA graph does, and replays leave the caller's random stream untouched.
- Capture runs in the caller's grad mode; replay runs under ``torch.inference_mode()``, so it
  can write tensors made in inference mode as well as ordinary ones.

What it does not reproduce
--------------------------
- Memory pools (``pool=`` is accepted and ignored), streams and kernel-level concurrency,
  launch cost and timing. Replay allocates temporaries for out-of-place ops, where a CUDA
  graph allocates nothing; the tensors a caller can see keep their objects and storage.
- Work it cannot see: it records torch ops only. A Triton kernel must be a registered custom op
  (``torch.library.custom_op`` with ``mutates_args`` naming what it writes) to appear as one
  node. Launched directly, its launcher reads ``Tensor.data_ptr()``, which an emulated capture
  refuses (a CUDA capture records such a launch), so the kernel is never silently skipped.
- CUDA checks nothing on replay: a tensor resized after capture is read through its old
  pointer. The emulation raises ``a dynamic shape got through`` instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
PREVIOUS_ERROR = "CUDA error: operation failed due to a previous error during capture"
UNPINNED_COPY = (
    "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor "
    "is pinned. Please use tensor.pin_memory() or allocate the tensor with pin_memory=True."
)
NO_NUMPY = (
    "can't convert cuda:0 device type tensor to numpy. "
    "Use Tensor.cpu() to copy the tensor to host memory first."
)
BACKENDS = ("cuda", "emulate")


def default_backend() -> str:
    """``"cuda"`` where ``torch.cuda.is_available()``, else ``"emulate"``."""
    return "cuda" if torch.cuda.is_available() else "emulate"


def warmup(fn: Callable[[], Any], iters: int = 2) -> None:
    """Run ``fn()`` ``iters`` times eagerly before a capture, so lazy set-up happens outside it.

    cuBLAS handles, Triton's JIT and autotuning, and first-call caches must not run inside a
    capture (torch's CUDA-graph notes; SGLang warms up twice). On CUDA the calls run on a side
    stream that waits for the current one, and the current stream then waits for them.
    """
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters = {iters!r}; expected an int >= 0")
    if not torch.cuda.is_available():
        for _ in range(iters):
            fn()
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(iters):
            fn()
    torch.cuda.current_stream().wait_stream(side)


class Graph:
    """A captured piece of work that :meth:`replay` relaunches on the same tensors.

    ``backend``: ``"cuda"`` (a ``torch.cuda.CUDAGraph``), ``"emulate"`` (the CPU emulation
    described in this module's docstring) or ``None`` for :func:`default_backend`.
    ``pool``: CUDA only, a memory-pool handle (``other.pool()`` of an earlier graph, or
    ``torch.cuda.graph_pool_handle()``) to share with graphs that replay in capture order and
    never at the same time; the emulation models no memory pools and ignores it.

    A graph is captured once. :meth:`replay`, :meth:`nodes` and :meth:`pool` need a capture that
    succeeded.
    """

    def __init__(self, backend: str | None = None, *, pool=None):
        backend = default_backend() if backend is None else backend
        if backend not in BACKENDS:
            raise ValueError(
                f"backend = {backend!r}; expected 'cuda', 'emulate' or None (CUDA when available)"
            )
        if backend == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "backend = 'cuda' but torch.cuda.is_available() is False; expected 'emulate' or None"
            )
        self.backend = backend
        self._impl = _CudaGraph(pool) if backend == "cuda" else _EmulatedGraph()
        self._state = "new"

    def __repr__(self) -> str:
        return f"Graph(backend={self.backend!r}, state={self._state!r})"

    @contextlib.contextmanager
    def capture(self):
        """Record the work of the ``with`` block without launching it. Raises on a second capture.

        If anything escapes the block, the graph is marked failed and cannot be replayed.
        """
        if self._state != "new":
            raise RuntimeError(f"this Graph is {self._state}; a Graph is captured once: make a new Graph")
        self._state = "capturing"
        try:
            with self._impl.capturing():
                yield
        except BaseException:
            self._state = "failed"
            raise
        self._state = "captured"

    def capture_fn(self, fn: Callable[[], Any], warmup_iters: int = 2) -> Any:
        """:func:`warmup` ``fn``, then capture one call of it.

        Returns what the captured call returned: the static outputs that each replay overwrites.
        """
        warmup(fn, warmup_iters)
        with self.capture():
            out = fn()
        return out

    def replay(self) -> None:
        """Relaunch the recorded work on the captured tensors; its outputs are overwritten in place."""
        self._require_captured("replay")
        self._impl.replay()

    def nodes(self) -> list[str]:
        """The recorded work, in launch order, one readable name per node.

        Emulation: the recorded ops (``"aten.mul.Tensor"``, ``"c2graph.fused_compress.default"``);
        views are not nodes. CUDA: the device activities (kernels, and the copies and fills done
        as graph nodes) of one replay, read with ``torch.profiler``. The first call on CUDA
        replays the graph once to read them, so it overwrites the outputs as any replay does.
        """
        self._require_captured("nodes")
        return self._impl.nodes()

    @property
    def num_nodes(self) -> int:
        """``len(self.nodes())``."""
        return len(self.nodes())

    def pool(self):
        """This graph's memory-pool handle, for ``Graph(pool=...)`` (CUDA); ``None`` in the emulation."""
        self._require_captured("pool")
        return self._impl.pool()

    def _require_captured(self, what: str) -> None:
        if self._state == "captured":
            return
        if self._state == "failed":
            raise RuntimeError(
                f"{what}() of a graph whose capture failed: there is nothing valid to replay; capture a new Graph"
            )
        if self._state == "capturing":
            raise RuntimeError(f"{what}() inside this graph's own capture: the capture has not ended")
        raise RuntimeError(f"{what}() before capture: record the work first with `with g.capture(): ...`")


class _CudaGraph:
    """``torch.cuda.CUDAGraph`` captured on its own side stream, as ``torch.cuda.graph`` does."""

    def __init__(self, pool):
        self._graph = torch.cuda.CUDAGraph()
        self._pool = pool
        # A stream per graph: a failed capture leaves nothing behind on the stream of the next one.
        self._stream = torch.cuda.Stream()
        self._nodes: list[str] | None = None

    @contextlib.contextmanager
    def capturing(self):
        # torch warns "The CUDA Graph is empty ... wrong device or stream" when a capture ends with
        # no node. Here the stream is always the graph's own, so that hint never applies: a graph
        # is empty because its capture recorded nothing (mostly one that failed first, and its
        # error already says why), and the emulation is silent there too.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
            with torch.cuda.graph(self._graph, pool=self._pool, stream=self._stream):
                yield

    def replay(self) -> None:
        self._graph.replay()

    def nodes(self) -> list[str]:
        if self._nodes is None:
            self._nodes = _device_activities_of_one_replay(self._graph)
        return list(self._nodes)

    def pool(self):
        return self._graph.pool()


def _device_activities_of_one_replay(graph: torch.cuda.CUDAGraph) -> list[str]:
    """Names of the device activities launched by one ``cudaGraphLaunch``, in start order.

    Activities are matched to the launch by correlation id, which leaves out the kernels that
    ``CUDAGraph.replay`` launches before the graph (it refreshes the RNG seed and offset of a
    graph that draws random numbers).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
    events = prof.profiler.kineto_results.events()
    launches = {e.correlation_id() for e in events if e.name() == "cudaGraphLaunch"}
    device = [e for e in events if e.device_type() == DeviceType.CUDA and e.correlation_id() in launches]
    return [e.name() for e in sorted(device, key=lambda e: e.start_ns())]


class _EmulatedGraph:
    """The recorded ops of one emulated capture, and their replay."""

    def __init__(self):
        self._nodes: list[_Node] = []

    @contextlib.contextmanager
    def capturing(self):
        recorder = _Recorder()
        try:
            with _HostGuard(recorder), recorder:
                yield
        finally:
            recorder.restore_written()
            if recorder.failed:
                raise RuntimeError(PREVIOUS_ERROR)
        self._nodes = recorder.nodes

    def replay(self) -> None:
        with torch.inference_mode():
            for node in self._nodes:
                node.run()

    def nodes(self) -> list[str]:
        return [str(node) for node in self._nodes]

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

    def run(self, func, args, kwargs):
        caller = torch.default_generator.get_state()
        torch.default_generator.set_state(self._state)
        try:
            return func(*args, **kwargs)
        finally:
            self._state = torch.default_generator.get_state()
            torch.default_generator.set_state(caller)


# Ops that only allocate: no kernel in a CUDA graph, so nothing to re-run (their bytes stay stale).
_ALLOCATIONS = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_like.default,
        aten.empty_strided.default,
        aten.empty_permuted.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)
_INDEX_PUT = frozenset({aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default})


def _freeze(tree):
    """A copy of every list, tuple and dict in ``tree``; tensors and other leaves are kept as they are."""
    return tree_map(lambda leaf: leaf, tree)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes: its arguments marked ``Tensor(a!)`` (``self`` of ``add_``, ``out=``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += _tensors(args[i] if i < len(args) else kwargs.get(arg.name))
    return written


@dataclass(frozen=True)
class _Node:
    """One recorded op: its arguments as captured, and the outputs a replay copies into.

    ``refresh`` has one entry per output leaf: the tensor returned at capture where the op made
    a fresh one, ``None`` where the output aliases an argument (in-place, ``out=``) or is not a
    tensor.
    """

    func: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    refresh: tuple
    rng: _GraphRng | None

    @staticmethod
    def record(func, args, kwargs, fresh: tuple, rng: _GraphRng | None) -> _Node | None:
        """The node for ``func(*args, **kwargs)``, or ``None`` when it launches no kernel.

        ``fresh``: per output leaf, the tensor if the op made it (its storage is no argument's).
        """
        if func.is_view or torch.Tag.inplace_view in func.tags or func in _ALLOCATIONS:
            return None
        if not func._schema.is_mutable and all(t is None for t in fresh):
            return None  # it writes nothing: it returns aliases (``_unsafe_view``) or host values
        return _Node(func, _freeze(args), _freeze(kwargs), fresh, rng)

    def __str__(self) -> str:
        return str(self.func)

    def run(self) -> None:
        if self.rng is not None:
            out = self.rng.run(self.func, self.args, self.kwargs)
        else:
            out = self.func(*self.args, **self.kwargs)
        pairs = [(t, v) for t, v in zip(self.refresh, tree_flatten(out)[0]) if t is not None]
        for target, value in pairs:
            if value.shape != target.shape:
                raise RuntimeError(
                    f"a dynamic shape got through: {self.func} gives shape {list(value.shape)} on replay "
                    f"but gave {list(target.shape)} at capture (was a captured tensor resized?)"
                )
        for target, value in pairs:
            target.copy_(value)


def _host_copy_error(what: str) -> RuntimeError:
    """torch's own refusal of a pageable host copy during capture (the capture stays valid)."""
    return RuntimeError(f"{UNPINNED_COPY}\n(emulated capture: {what})")


def _bool_indices(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


class _Recorder(TorchDispatchMode):
    """The dispatch half of an emulated capture: refuses what CUDA refuses, runs and records the rest."""

    def __init__(self):
        super().__init__()
        self.nodes: list[_Node] = []
        self.failed = False  # a host sync happened: the capture is invalid (code 901 from now on)
        self.in_op = False  # inside an op (a custom op's Python body): the host guard stands aside
        self._rng = _GraphRng()
        self._host_number: torch.Tensor | None = None  # the last Python number indexing wrapped
        self._made: set[int] = set()  # storages of the tensors made during the capture
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    def restore_written(self) -> None:
        """Give every storage from before the capture that an op wrote its bytes back."""
        for storage, saved in self._saved.values():
            storage.copy_(saved)
        self._saved.clear()

    def _save_before_write(self, func, args, kwargs) -> None:
        for t in _written(func, args, kwargs):
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() and key not in self._made and key not in self._saved:
                self._saved[key] = (storage, storage.clone())

    def refuse_sync(self, what: str):
        """Raise code 900 and invalidate the capture; code 901 once it is invalid."""
        if self.failed:
            raise RuntimeError(PREVIOUS_ERROR)
        self.failed = True
        raise RuntimeError(f"{NOT_PERMITTED}\n(emulated capture: {what})")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.in_op = True
        try:
            self._check(func, args, kwargs)
            if func._schema.is_mutable:
                self._save_before_write(func, args, kwargs)
            seeded = torch.Tag.nondeterministic_seeded in func.tags
            out = self._rng.run(func, args, kwargs) if seeded else func(*args, **kwargs)
            if func is aten.lift_fresh.default:
                self._host_number = out
            inputs = {_storage(t) for t in _tensors((args, kwargs))}
            fresh = tuple(
                leaf if isinstance(leaf, torch.Tensor) and _storage(leaf) not in inputs else None
                for leaf in tree_flatten(out)[0]
            )
            self._made.update(_storage(t) for t in fresh if t is not None)
            node = _Node.record(func, args, kwargs, fresh, self._rng if seeded else None)
            if node is not None:
                self.nodes.append(node)
            return out
        finally:
            self.in_op = False

    def _check(self, func, args, kwargs) -> None:
        if self.failed:
            raise RuntimeError(PREVIOUS_ERROR)  # CUDA refuses every launch into an invalid capture
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
            raise _host_copy_error("Python data becomes a device tensor, a host-to-device copy")

    def _check_index_put(self, func, args, kwargs) -> None:
        """``index_put_(self, indices, values, accumulate)``, as ``_index_put_impl_`` dispatches it."""
        indices, values = args[1], args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        defined = [i for i in indices if i is not None]
        number = values is self._host_number
        if number and not accumulate and len(defined) == 1 and _bool_indices(defined):
            return  # torch runs it as masked_fill_(mask, number): no sync, static shape
        if _bool_indices(indices):
            self.refuse_sync(f"{func} with a boolean mask needs the mask's nonzero positions")
        if number:
            raise _host_copy_error(f"{func} copies the Python number it writes to the device")


class _HostGuard(TorchFunctionMode):
    """The function half of an emulated capture: host reads, host-built tensors, raw pointers.

    ``.tolist()``, ``.cpu()``, ``print``, ``.numpy()`` and ``.data_ptr()`` reach no ATen op (or
    not one that says what they do), so they are caught here, above dispatch.
    """

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recorder.in_op:
            self._check(func, args, kwargs)
        return func(*args, **kwargs)

    def _check(self, func, args, kwargs) -> None:
        name = getattr(func, "__name__", str(func))
        if func in _FORMATS:
            self.recorder.refuse_sync(f"Tensor.{name} reads a tensor's values on the host to format them")
        elif func in _TO_NUMPY:
            raise TypeError(f"{NO_NUMPY}\n(emulated capture: Tensor.{name} of a device tensor)")
        elif func in _TO_HOST or (func is torch.Tensor.to and _targets_host(args, kwargs)):
            raise _host_copy_error(f"Tensor.{name} copies a device tensor to the host")
        elif func is torch.Tensor.data_ptr:
            raise RuntimeError(
                "Tensor.data_ptr() inside an emulated capture: memory reached through a raw pointer (a "
                "Triton kernel launched directly, say) is invisible to the emulation, and replay would skip "
                "that work. Register the kernel as a custom op (torch.library.custom_op, with mutates_args "
                "naming what it writes) so the capture records it as one node."
            )
        elif func in _FROM_HOST:
            position = _FROM_HOST[func]
            if len(args) > position and not isinstance(args[position], torch.Tensor):
                raise _host_copy_error(f"{name} builds a device tensor from Python data, a host-to-device copy")


def _targets_host(args, kwargs) -> bool:
    """``Tensor.to(...)`` names the CPU as its device."""
    devices = [kwargs.get("device"), *(a for a in args[1:] if isinstance(a, (str, torch.device)))]
    return any(d is not None and torch.device(d).type == "cpu" for d in devices)


_FORMATS = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__})
_TO_NUMPY = frozenset({torch.Tensor.numpy, torch.Tensor.__array__})
_TO_HOST = frozenset({torch.Tensor.cpu, torch.Tensor.tolist})
# Functions that build a tensor from Python data, and the position of that data among their arguments.
_FROM_HOST = {torch.tensor: 0, torch.as_tensor: 0, torch.Tensor.new_tensor: 1}
