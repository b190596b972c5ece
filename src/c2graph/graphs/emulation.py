"""The CPU emulation of a CUDA graph: record a capture's launches, replay them without any Python.

What it reproduces
------------------
- **Recording.** Every torch op inside ``capture()`` is recorded at the dispatch level, and every
  Triton launch (``kernel[grid](...)``) where Triton's launcher is entered: tensor arguments by
  identity (the same objects, kept alive), everything else by value. A Python int, a slice's
  bounds, a list of sizes, a grid: all frozen at their capture-time values.
- **Custom ops are one node, replayed as launches.** The body of a custom op
  (``torch.library.custom_op``) runs once at capture under the same refusals as the caller's
  code (see :mod:`c2graph.graphs.refusals`); the torch ops and Triton launches it makes are
  recorded with the arguments they got, and a replay relaunches those, never the body's Python.
  So a launcher that sizes its grid from host state, or reads a count with ``.item()``, behaves
  as under CUDA: frozen, or refused. The node list shows one node per custom op, by its name.
- **A capture launches nothing.** Each op does run once, so that tensors made inside the block
  exist (like a graph's private outputs) and the ops' own checks run; but every tensor that
  existed before the capture and was written inside it gets its bytes back when the block ends,
  as a CUDA capture leaves them. Tensors made inside the block hold capture-time values, where a
  CUDA graph's hold garbage until the first replay: read outputs after a replay.
- **Replay** relaunches the recorded work in order. In-place and ``out=`` ops, and ops whose
  schema marks an argument as written (``Tensor(a!)``), write the same tensors again; an
  out-of-place op recomputes and copies into the tensor it returned at capture, so outputs are
  the same objects, overwritten by every replay. Views are not relaunched: they alias storage
  that the other ops refresh. Only ``copy_`` into a captured tensor reaches a replay; rebinding
  a Python name does not. Bytes that no recorded launch writes (the tail of a padded buffer,
  memory from ``torch.empty``) keep what they held: stale data persists.
- **Random ops** (tag ``nondeterministic_seeded``) draw from the graph's own generator state,
  forked from torch's default CPU generator when capture begins: each replay draws fresh
  numbers, as a CUDA graph does, and replays leave the caller's random stream untouched.
- Capture runs in the caller's grad mode; replay runs under ``torch.inference_mode()``, so it
  can write tensors made in inference mode as well as ordinary ones.

What it does not reproduce
--------------------------
- Memory pools, streams and kernel-level concurrency, launch cost and timing. Replay allocates
  temporaries for out-of-place ops, where a CUDA graph allocates nothing; the tensors a caller
  can see keep their objects and storage.
- Work it cannot see: it records torch ops and Triton launches. Reading ``data_ptr()`` outside a
  custom op is refused, and so is a custom op whose body reads pointers but makes no Triton
  launch: memory reached through a raw pointer is invisible, and replay would skip that work.
  An op from a C++ extension is recorded by the torch ops it dispatches, not its own kernels.
- CUDA checks nothing on replay: a tensor resized after capture is read through its old
  pointer. The emulation raises ``a dynamic shape got through`` instead.
- Freeing a CUDA graph that finished its capture, in the middle of another capture, invalidates
  that capture (the destruction is a CUDA call it refuses); an emulated graph owns no CUDA
  objects, and freeing one refuses nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .refusals import PREVIOUS_ERROR, CaptureState, HostGuard
from .triton_launches import Launch, python_modes_off, recording_triton_launches, run_and_record

aten = torch.ops.aten

# Namespaces of torch's own ops; an op from any other is a custom op, whose body is recorded.
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims"})
# Ops that only allocate: no kernel in a CUDA graph, so nothing to relaunch (their bytes stay stale).
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


class EmulatedGraph:
    """The recorded launches of one emulated capture, and their replay."""

    def __init__(self):
        self._nodes: list = []

    @contextlib.contextmanager
    def capturing(self):
        capture = _Capture()
        try:
            with HostGuard(capture.state), _Recorder(capture, capture.nodes), recording_triton_launches(capture):
                yield
        finally:
            capture.restore_written()
            if capture.state.failed:
                raise RuntimeError(PREVIOUS_ERROR)
        self._nodes = capture.nodes

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


class _Capture:
    """One emulated capture: its validity, its nodes, and the bytes it must give back."""

    def __init__(self):
        self.state = CaptureState()
        self.rng = _GraphRng()
        self.nodes: list = []
        self.sinks: list[list] = [self.nodes]  # where launches go: the innermost op body being recorded
        self._made: set[int] = set()  # storages of the tensors made during the capture
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    def note_made(self, tensors) -> None:
        self._made.update(_storage(t) for t in tensors)

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

    def launch(self, launcher, kernel, grid, args: tuple, kwargs: dict):
        """Run one Triton launch of the capture and record it where the capture is (an op's body, or the graph)."""
        self.state.check_launch()
        args, kwargs = freeze(args), freeze(kwargs)
        with python_modes_off():  # the saving and the launch are no part of the recorded work
            self.save_before_write(tensors_in((args, kwargs)))  # the kernel may write any tensor it is given
            launch, out = run_and_record(launcher, kernel, grid, args, kwargs, self.state.refuse_sync)
        self.sinks[-1].append(launch)
        return out


def freeze(tree):
    """A copy of every list, tuple and dict in ``tree``; tensors and other leaves are kept as they are."""
    return tree_map(lambda leaf: leaf, tree)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def tensors_in(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes: its arguments marked ``Tensor(a!)`` (``self`` of ``add_``, ``out=``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += tensors_in(args[i] if i < len(args) else kwargs.get(arg.name))
    return written


@dataclass(frozen=True)
class _Node:
    """One recorded torch op: its arguments as captured, and the outputs a replay copies into.

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
        return _Node(func, freeze(args), freeze(kwargs), fresh, rng)

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


@dataclass(frozen=True)
class _OpNode:
    """One custom op: the launches its body made at capture, relaunched without its Python."""

    func: torch._ops.OpOverload
    launches: tuple

    def __str__(self) -> str:
        return str(self.func)

    def run(self) -> None:
        for launch in self.launches:
            launch.run()


class _Recorder(TorchDispatchMode):
    """The dispatch half of an emulated capture: refuses what CUDA refuses, runs and records the rest.

    ``nodes``: the list it records into (the graph's, or the body of the custom op being recorded).
    """

    def __init__(self, capture: _Capture, nodes: list):
        super().__init__()
        self.capture = capture
        self.nodes = nodes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        capture.state.check_op(func, args, kwargs)
        if func.namespace not in _TORCH_NAMESPACES:
            return self._record_body(func, args, kwargs)
        if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            # Only below autograd (in a custom op's body) does an op made of others get here: take
            # it apart as autograd would have, so its parts are refused and recorded one by one.
            with _Recorder(capture, self.nodes):
                return func.decompose(*args, **kwargs)
        if func._schema.is_mutable:
            capture.save_before_write(_written(func, args, kwargs))
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        out = capture.rng.run(func, args, kwargs) if seeded else func(*args, **kwargs)
        if func is aten.lift_fresh.default:
            capture.state.host_number = out
        inputs = {_storage(t) for t in tensors_in((args, kwargs))}
        fresh = tuple(
            leaf if isinstance(leaf, torch.Tensor) and _storage(leaf) not in inputs else None
            for leaf in tree_flatten(out)[0]
        )
        capture.note_made(t for t in fresh if t is not None)
        node = _Node.record(func, args, kwargs, fresh, capture.rng if seeded else None)
        if node is not None:
            self.nodes.append(node)
        return out

    def _record_body(self, func, args, kwargs):
        """Run a custom op's body under the capture's refusals, recording what it launches as one node."""
        capture = self.capture
        capture.save_before_write(_written(func, args, kwargs))
        body: list = []
        guard = HostGuard(capture.state, in_op=True)
        capture.sinks.append(body)
        try:
            with guard, _Recorder(capture, body):
                # Straight to the op's kernel (its body), below this mode: the body's own ops
                # then come back through the guard and the recorder pushed above.
                out = func.redispatch(_kernel_keys(args, kwargs), *args, **kwargs)
        finally:
            capture.sinks.pop()
            # What the body launched is in the graph, even if it raised afterwards (as on CUDA);
            # a body that launched nothing is no node.
            if body:
                self.nodes.append(_OpNode(func, tuple(body)))
        if guard.pointer_reads and not any(isinstance(node, Launch) for node in body):
            raise RuntimeError(
                f"{func} read raw pointers (data_ptr()) inside an emulated capture but made no Triton "
                "launch: work launched through raw pointers is invisible to the emulation, and replay "
                "would skip it. Launch the kernel with Triton inside the custom op."
            )
        return out


def _kernel_keys(args, kwargs) -> torch._C.DispatchKeySet:
    """The dispatch keys that reach an op's backend kernel for these arguments (CPU without tensors)."""
    tensors = tensors_in((args, kwargs))
    if not tensors:
        return torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    return torch._C._dispatch_keys(tensors[0]) & torch._C._after_ADInplaceOrView_keyset
