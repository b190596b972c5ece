"""Capture and replay: one graph API over CUDA graphs, and a faithful CPU emulation of them.

::

    g = Graph()
    with g.capture():
        out = f(static_in)      # the Python runs once; its work is recorded, not launched
    static_in.copy_(new_rows)   # refresh the captured inputs in place ...
    g.replay()                  # ... relaunch the recorded work: `out` holds the new result
    g.nodes()                   # the recorded work, one name per node (nothing is launched)

On a CUDA machine :class:`Graph` wraps ``torch.cuda.CUDAGraph``, captured on a side stream of
its own through ``torch.cuda.graph``. Without CUDA it *emulates* one (``backend="emulate"``), so
the notebooks show on a laptop what a capture freezes and what it refuses.

- What a capture refuses, on CUDA and in the emulation, with the same texts
  (:data:`NOT_PERMITTED`, :data:`PREVIOUS_ERROR`, :data:`UNPINNED_COPY`): :mod:`c2graph.graphs.refusals`.
- Threads: a capture records the work of its own thread only; another thread's ops and Triton
  launches run eagerly, neither recorded nor refused (on CUDA the capture is begun in
  ``capture_error_mode="thread_local"``). One capture at a time: a capture inside another, or
  while another thread captures, is refused before anything changes (:mod:`c2graph.graphs.refusals`
  says why).
- What the emulation reproduces and what it does not: :mod:`c2graph.graphs.emulation`.
- What a capture recorded (:meth:`Graph.audit`; the emulation replays the same record):
  :mod:`c2graph.graphs.op_record`; what differs between captures of one step: :func:`c2graph.audit`.
- How :meth:`Graph.nodes` reads a CUDA graph without launching it: :mod:`c2graph.graphs.cuda_nodes`.

The process as it was: a capture, a replay, a refusal and :func:`c2graph.audit` change nothing of
torch, Triton or Python beyond their own extent, on every exit. Compiled code runs compiled
afterwards (:func:`compiled_code_run_eagerly`); ``torch.cuda.is_current_stream_capturing`` is
torch's own object outside an emulated capture, and :func:`warmup` and the audit's eager calls on
a machine without CUDA (:mod:`c2graph.graphs.emulation`); Triton's
launcher is its own outside a capture (:mod:`c2graph.graphs.triton_launches`); the garbage
collector is on or off as it was.

Python's cyclic garbage collector does not run during a capture (on either backend). Measured on
an H200: destroying a CUDA graph that finished its capture (a ``torch.cuda.CUDAGraph`` kept in a
reference cycle, by a caught exception's traceback, say) is a CUDA call that a capture refuses,
so when the collector happened to free such a graph in the middle of another graph's capture,
that capture was invalidated and ended with :data:`PREVIOUS_ERROR`, at whichever capture the
collector happened to run. Cycles are collected after the capture instead.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .cuda_nodes import graph_nodes
from .emulation import EmulatedGraph, answering_is_current_stream_capturing
from .lines import entering_frame
from .op_record import CaptureRecord, Recording, check_labels
from .refusals import CONCURRENT_CAPTURE, NESTED_CAPTURE, NOT_PERMITTED, PREVIOUS_ERROR, UNPINNED_COPY

__all__ = ["BACKENDS", "Graph", "NOT_PERMITTED", "PREVIOUS_ERROR", "UNPINNED_COPY", "default_backend", "warmup"]

BACKENDS = ("cuda", "emulate")


def default_backend() -> str:
    """``"cuda"`` where ``torch.cuda.is_available()``, else ``"emulate"``."""
    return "cuda" if torch.cuda.is_available() else "emulate"


def warmup(fn: Callable[[], Any], iters: int = 2) -> None:
    """Run ``fn()`` ``iters`` times eagerly before a capture, so lazy set-up happens outside it.

    cuBLAS handles, Triton's JIT and autotuning, and first-call caches must not run inside a
    capture (torch's CUDA-graph notes; SGLang warms up twice). On CUDA the calls run on a side
    stream that waits for the current one, and the current stream then waits for them. Without
    CUDA, ``torch.cuda.is_current_stream_capturing()`` answers ``False`` in them, as on a CUDA
    machine, where torch's own would raise (:mod:`c2graph.graphs.emulation`; torch's own again after).
    """
    check_step(fn, "fn")
    check_iters(iters, "iters")
    if not torch.cuda.is_available():
        with answering_is_current_stream_capturing():
            for _ in range(iters):
                fn()
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(iters):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def check_step(fn, name: str) -> None:
    """``TypeError`` unless ``fn`` (given as the argument ``name``) is callable."""
    if not callable(fn):
        raise TypeError(f"{name} is a {type(fn).__name__}; expected a callable with no arguments")


def check_iters(value, name: str) -> None:
    """A number of warm-up calls: an int >= 0 (``TypeError`` for a bool or another type,
    ``ValueError`` for a negative int), ``name`` being the argument it was given as."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} = {value!r}; expected an int >= 0, a number of eager calls (a bool is not one)")
    if value < 0:
        raise ValueError(f"{name} = {value!r}; expected an int >= 0, a number of eager calls")


_CAPTURING: dict[int, str] = {}  # the thread capturing now (its ident -> its name): one at a time
_CAPTURING_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_capture_at_a_time():
    """Hold the process's one capture for the ``with`` block; refused inside another capture of
    this thread (:data:`NESTED_CAPTURE`) or while another thread captures (:data:`CONCURRENT_CAPTURE`)."""
    me = threading.get_ident()
    with _CAPTURING_LOCK:
        if me in _CAPTURING:
            raise RuntimeError(NESTED_CAPTURE)
        if _CAPTURING:
            raise RuntimeError(CONCURRENT_CAPTURE.format(thread=next(iter(_CAPTURING.values()))))
        _CAPTURING[me] = threading.current_thread().name
    try:
        yield
    finally:
        with _CAPTURING_LOCK:
            del _CAPTURING[me]


class Graph:
    """A captured piece of work that :meth:`replay` relaunches on the same tensors.

    ``backend``: ``"cuda"`` (a ``torch.cuda.CUDAGraph``), ``"emulate"`` (the CPU emulation of
    :mod:`c2graph.graphs.emulation`) or ``None`` for :func:`default_backend`.
    ``pool``: CUDA only, a memory-pool handle (``other.pool()`` of an earlier graph, or
    ``torch.cuda.graph_pool_handle()``) to share with graphs that replay in capture order and
    never at the same time, as a serving engine's bucket graphs do; the emulation models no
    memory pools and ignores it.

    A graph is captured once. :meth:`replay`, :meth:`nodes` and :meth:`pool` need a capture that
    succeeded.
    """

    def __init__(self, backend: str | None = None, *, pool=None):
        backend = default_backend() if backend is None else backend
        if backend not in BACKENDS:
            raise ValueError(f"backend = {backend!r}; expected 'cuda', 'emulate' or None (CUDA when available)")
        if backend == "cuda" and not torch.cuda.is_available():
            raise ValueError("backend = 'cuda' but torch.cuda.is_available() is False; expected 'emulate' or None")
        if pool is not None and not (isinstance(pool, tuple) and len(pool) == 2
                                     and all(isinstance(p, int) and not isinstance(p, bool) for p in pool)):
            raise ValueError(f"pool = {pool!r}; expected None or a memory-pool handle: other.pool() of an earlier "
                             "graph, or torch.cuda.graph_pool_handle()")
        self.backend = backend
        self._impl = _CudaGraph(pool) if backend == "cuda" else EmulatedGraph()
        self._state = "new"
        self._record: CaptureRecord | None = None

    def __repr__(self) -> str:
        return f"Graph(backend={self.backend!r}, state={self._state!r})"

    @contextlib.contextmanager
    def capture(self, labels: dict[str, torch.Tensor] | None = None, *, record: bool = True):
        """Record the work of the ``with`` block without launching it. Raises on a second capture,
        inside another capture, and while another thread captures (one capture at a time).

        If anything escapes the block, the graph is marked failed and cannot be replayed. What the
        block issues (ops, Triton launches) is recorded for :meth:`audit`; ``labels`` names
        tensors (``{"pos": static_pos, ...}``) so the audit can say which one an argument lies in.
        A bad ``labels`` is refused (``ValueError``) before the graph changes state.

        Compiled code (``torch.compile``): a capture that makes a record runs it op by op, eagerly,
        so that the record sees each op (the emulation replays them); the record names each such
        function (``ran_eagerly`` of :meth:`audit`'s record), and on CUDA the graph then holds those
        ops' kernels, not the compiled ones. After the capture, on every exit, compiled code runs
        compiled again (:func:`compiled_code_run_eagerly` says how).
        ``record=False`` keeps no record (no :meth:`audit`), and on CUDA makes none: compiled code
        runs compiled in the capture, as in production. (The emulation replays its record, so it
        makes one all the same.)
        """
        labels = check_labels(labels)
        if not isinstance(record, bool):
            raise TypeError(f"record = {record!r}; expected True (keep the capture's record) or False")
        if self._state != "new":
            raise RuntimeError(f"this Graph is {self._state}; a Graph is captured once: make a new Graph")
        with _one_capture_at_a_time():
            self._state = "capturing"
            stop = entering_frame()
            recorded = record or self.backend == "emulate"  # the emulation replays its record: it makes one always
            try:
                with (_no_automatic_garbage_collection(),
                      compiled_code_run_eagerly() if recorded else contextlib.nullcontext(),
                      self._impl.capturing(labels if record else None, stop) as made):
                    self._record = made if record else None
                    yield
            except BaseException as error:
                self._state = "failed"
                if self._record is not None:
                    self._record.refuse(error, stop)
                raise
            self._state = "captured"

    def capture_fn(self, fn: Callable[[], Any], warmup_iters: int = 2, *, record: bool = True) -> Any:
        """:func:`warmup` ``fn``, then capture one call of it (``record`` as in :meth:`capture`).

        Returns what the captured call returned: the static outputs that each replay overwrites.
        """
        check_step(fn, "fn")
        check_iters(warmup_iters, "warmup_iters")
        warmup(fn, warmup_iters)
        with self.capture(record=record):
            out = fn()
        return out

    def replay(self) -> None:
        """Relaunch the recorded work on the captured tensors; its outputs are overwritten in place."""
        self._require_captured("replay")
        self._impl.replay()

    def nodes(self) -> list[str]:
        """The recorded work, in capture order, one readable name per node. Launches nothing.

        Emulation: the recorded ops (``"aten.mul.Tensor"``), one node per custom op
        (``"c2graph.compress_fused.default"``) and per Triton launch (the kernel's name); views
        and allocations are not nodes. CUDA: the graph's kernels (``"at::native::
        vectorized_elementwise_kernel"``, a Triton kernel by its name), copies (``"Memcpy"``)
        and fills (``"Memset"``), read from the captured graph.
        """
        self._require_captured("nodes")
        return self._impl.nodes()

    @property
    def num_nodes(self) -> int:
        """``len(self.nodes())``."""
        return len(self.nodes())

    def audit(self) -> CaptureRecord:
        """What this capture froze, op by op and launch by launch: each one's scalar arguments
        (frozen at their capture values) and the tensors it reads or writes by address, named by
        the capture's ``labels``, with the line that issued it (:class:`~c2graph.graphs.op_record.
        CaptureRecord`); after a refused capture, why and where. Launches nothing. To compare
        captures of the same step with different batches loaded: :func:`c2graph.audit`."""
        if self._state in ("new", "capturing"):
            self._require_captured("audit")
        if self._record is None:
            raise RuntimeError("audit() of a graph captured with record=False: capture it with record=True")
        return self._record

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


@contextlib.contextmanager
def _no_automatic_garbage_collection():
    """Keep Python's cyclic garbage collector from running in the ``with`` block (this module's docstring says why)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@contextlib.contextmanager
def compiled_code_run_eagerly():
    """``torch.compile``'d code runs its ops one by one, eagerly, in the ``with`` block (entered by a
    capture that makes a record, before it begins, and by :func:`c2graph.audit` around its loads,
    eager calls and captures), so the record sees each op and the emulation replays them; after it,
    on every exit, compiled code runs compiled again.

    Why: a torch dispatch mode that is on (the record's) fails a guard of every compiled function;
    dynamo then runs the function op by op, as its mode rules say, but also marks the function's
    code skipped for good, so every later call ran op by op, long after the capture. Here dynamo is
    set aside for the block instead: its own stance ``"force_eager"`` (process-wide for the block,
    as the garbage collector's switch is: another thread's compiled code runs eagerly during a
    capture), and this thread's frame hook off (a capture begun inside compiled code). Dynamo
    never sees the mode, and marks nothing. Where ``torch._dynamo`` is not imported, no compiled
    function exists (``torch.compile`` imports it) and nothing is done: importing it would set a
    variable in ``os.environ`` (``TORCHINDUCTOR_CACHE_DIR``).
    """
    if "torch._dynamo" not in sys.modules:
        yield
        return
    from torch._C._dynamo.eval_frame import set_eval_frame

    prior = set_eval_frame(None)
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        set_eval_frame(prior)


def _end_generator_capture() -> None:
    """After a capture that failed: a capture CUDA invalidated (a sync inside it, say) ends without
    torch's epilogue for the device's default generator, which then still says it is capturing,
    and its next eager random op fails ("Offset increment outside graph capture encountered
    unexpectedly"). An empty capture that ends well runs that epilogue; the generator's seed and
    offset stay as they were (a capture moves only its in-graph offset)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
            pass


class _CudaGraph:
    """``torch.cuda.CUDAGraph`` captured on its own side stream, as ``torch.cuda.graph`` does.

    ``keep_graph=True`` keeps the captured ``cudaGraph_t`` next to its executable form, so
    :meth:`nodes` can read it; the graph is instantiated when its capture ends.
    """

    def __init__(self, pool):
        self._graph = torch.cuda.CUDAGraph(keep_graph=True)
        self._pool = pool
        # A stream per graph: a failed capture leaves nothing behind on the stream of the next one.
        self._stream = torch.cuda.Stream()

    @contextlib.contextmanager
    def capturing(self, labels: dict[str, torch.Tensor] | None, stop):
        """Capture the ``with`` block; record it too, unless ``labels`` is ``None`` (yields the record)."""
        # torch warns "The CUDA Graph is empty ... wrong device or stream" when a capture ends with
        # no node. The stream here is always the graph's own: a graph is empty because its capture
        # recorded nothing (mostly one that failed first, and said why), as the emulation is silent.
        # thread_local: only this thread's unsafe calls fail the capture, not another thread's
        # eager work (the emulation, whose refusals are this thread's, does the same).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
            try:
                with torch.cuda.graph(self._graph, pool=self._pool, stream=self._stream,
                                      capture_error_mode="thread_local"):
                    recording = contextlib.nullcontext() if labels is None else Recording(labels, stop).active()
                    with recording as record:
                        yield record
            except BaseException:
                _end_generator_capture()
                raise
        self._graph.instantiate()

    def replay(self) -> None:
        self._graph.replay()

    def nodes(self) -> list[str]:
        return graph_nodes(self._graph.raw_cuda_graph())

    def pool(self):
        return self._graph.pool()
