"""A capture stays in its thread, one capture at a time: both graph backends.

Each scenario runs on the CPU emulation and on a real CUDA graph (``tests/graph_backends.py``).
Thread ``B`` works eagerly while thread ``A`` (the test's own) is inside a capture: ``A`` waits in
the ``with`` block until ``B`` is done, so ``B``'s work falls inside the capture. ``B``'s ops and
Triton launches must be neither recorded nor undone; a second capture, in another thread or
inside the first, is refused before anything changes; Triton's launcher is restored on every exit.
"""

from __future__ import annotations

import c2graph  # noqa: F401, I001  (first: decides TRITON_INTERPRET before Triton is imported)

import threading

import pytest
import torch
import triton
import triton.language as tl
from graph_backends import CUDA, EMULATE, backend, device_of, needs_triton  # noqa: F401  (backend: a fixture)
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from c2graph.graphs.graph import Graph
from c2graph.graphs.refusals import CONCURRENT_CAPTURE, NESTED_CAPTURE

LAUNCHERS = {cls: cls.__dict__["run"] for cls in (JITFunction, InterpretedFunction)}  # Triton's own


@triton.jit
def _add_kernel(x_ptr, value, BLOCK: tl.constexpr):
    """One program: ``x[:BLOCK] += value``."""
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + value)


def launchers_restored() -> bool:
    return all(cls.__dict__["run"] is run for cls, run in LAUNCHERS.items())


def in_thread(work, name: str = "B", timeout: float = 120.0):
    """Run ``work()`` in a thread named ``name`` to its end; returns what it returned, or raises what it raised."""
    done: dict = {}

    def body():
        try:
            done["value"] = work()
        except BaseException as error:  # handed to the test's thread
            done["error"] = error

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"thread {name} did not finish in {timeout} s"
    if "error" in done:
        raise done["error"]
    return done.get("value")


def test_another_threads_work_during_a_capture_is_neither_recorded_nor_undone(backend):
    needs_triton(backend)
    dev = device_of(backend)
    mine = torch.zeros(8, device=dev)
    theirs = torch.zeros(8, device=dev)
    _add_kernel[(1,)](theirs, 0.0, BLOCK=8)  # compiled before the capture

    def eager_work():
        _add_kernel[(1,)](theirs, 5.0, BLOCK=8)  # a Triton launch ...
        theirs.mul_(2)  # ... a torch op ...
        fresh = torch.full((4096,), 1.0, device=dev)  # ... and a fresh allocation
        capturing = torch.cuda.is_current_stream_capturing()
        return float(fresh.sum()), capturing

    g = Graph(backend)
    with g.capture(labels={"mine": mine, "theirs": theirs}):
        _add_kernel[(1,)](mine, 1.0, BLOCK=8)
        total, capturing_there = in_thread(eager_work)
        capturing_here = torch.cuda.is_current_stream_capturing()
    assert (total, capturing_there, capturing_here) == (4096.0, False, True)
    assert theirs.tolist() == [10.0] * 8, "the other thread's writes stay after the capture"
    assert mine.tolist() == [0.0] * 8, "the capture launched nothing"
    record = g.audit()
    assert [r.op for r in record.nodes()] == ["_add_kernel"]
    assert [t.label for r in record.flat() for t in r.tensors] == ["mine"]
    assert launchers_restored()
    g.replay()
    g.replay()
    assert mine.tolist() == [2.0] * 8 and theirs.tolist() == [10.0] * 8
    assert g.nodes() == ["_add_kernel"]


def test_a_capture_in_another_thread_while_one_is_on_is_refused(backend):
    dev = device_of(backend)
    x = torch.ones(4, device=dev)
    y = torch.ones(4, device=dev)
    second = Graph(backend)

    def capture_in_b():
        with second.capture():
            y.mul_(3)

    first = Graph(backend)
    with first.capture():
        x.mul_(2)
        with pytest.raises(RuntimeError) as refused:
            in_thread(capture_in_b, name="worker-B")
        x.add_(1)  # the first capture is still valid
    assert str(refused.value) == CONCURRENT_CAPTURE.format(thread="MainThread")
    assert "one graph at a time" in str(refused.value) and repr(second) == f"Graph(backend={backend!r}, state='new')"
    assert y.tolist() == [1.0] * 4 and launchers_restored()
    first.replay()
    assert x.tolist() == [3.0] * 4
    in_thread(capture_in_b, name="worker-B")  # in turn, after the first ended: fine
    second.replay()
    assert y.tolist() == [3.0] * 4 and launchers_restored()


def test_a_capture_inside_a_capture_is_refused(backend):
    dev = device_of(backend)
    x = torch.ones(4, device=dev)
    y = torch.ones(4, device=dev)
    outer, inner = Graph(backend), Graph(backend)
    with outer.capture():
        x.mul_(2)
        with pytest.raises(RuntimeError, match="a capture inside another capture") as refused:
            with inner.capture():
                y.add_(5)
        x.add_(1)
    assert str(refused.value) == NESTED_CAPTURE
    assert repr(inner) == f"Graph(backend={backend!r}, state='new')" and y.tolist() == [1.0] * 4
    assert outer.num_nodes == 2, outer.nodes()  # nothing of the inner capture, no restore of its writes
    if backend == EMULATE:
        assert outer.nodes() == ["aten.mul_.Tensor", "aten.add_.Tensor"]
    outer.replay()
    assert x.tolist() == [3.0] * 4 and y.tolist() == [1.0] * 4
    with inner.capture():  # the refused graph is still new: it captures after the outer one
        y.add_(5)
    inner.replay()
    assert y.tolist() == [6.0] * 4


class _Stop(BaseException):
    """Stands for an exception that is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``)."""


@pytest.mark.parametrize("ending", ["normal", "error", "keyboard_interrupt", "base_exception"])
def test_the_launcher_is_restored_on_every_exit(backend, ending):
    needs_triton(backend)
    x = torch.zeros(8, device=device_of(backend))
    _add_kernel[(1,)](x, 0.0, BLOCK=8)
    raised = {"normal": None, "error": ValueError, "keyboard_interrupt": KeyboardInterrupt, "base_exception": _Stop}
    g = Graph(backend)
    try:
        with g.capture():
            _add_kernel[(1,)](x, 1.0, BLOCK=8)
            assert not launchers_restored(), "wrapped for the capture"
            if raised[ending] is not None:
                raise raised[ending]()
    except (ValueError, KeyboardInterrupt, _Stop) as error:
        assert type(error) is raised[ending]
    assert launchers_restored() and x.tolist() == [0.0] * 8
    assert repr(g).endswith("'captured')" if ending == "normal" else "'failed')")
    _add_kernel[(1,)](x, 1.0, BLOCK=8)  # an eager launch after it runs at once
    assert x.tolist() == [1.0] * 8


def test_captures_in_two_threads_one_after_the_other(backend):
    """Each thread captures its own work, in turn; the launcher is restored after each."""
    needs_triton(backend)
    dev = device_of(backend)
    xs = [torch.zeros(8, device=dev) for _ in range(2)]
    _add_kernel[(1,)](xs[0], 0.0, BLOCK=8)
    graphs = [Graph(backend) for _ in range(2)]

    def capture(k):
        with graphs[k].capture():
            _add_kernel[(1,)](xs[k], float(k + 1), BLOCK=8)

    for k in range(2):
        in_thread(lambda: capture(k), name=f"capturer-{k}")
        assert launchers_restored()
    for g in graphs:
        g.replay()
    assert [x.tolist() for x in xs] == [[1.0] * 8, [2.0] * 8]


TORCH_ASKS = (torch.cuda.is_current_stream_capturing, torch.cuda.graphs.is_current_stream_capturing)  # torch's own


def test_is_current_stream_capturing_is_true_only_inside_a_capture(backend):
    """A guard on it works: the capture takes the graph-safe branch, the warm-up's eager calls the
    other one; outside the capture and the warm-up the function is torch's own object."""
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    out = torch.zeros(4, device=dev)

    def step():
        if torch.cuda.is_current_stream_capturing():
            out.copy_(x * 2)
        else:
            out.copy_(x * 3)

    g = Graph(backend)
    g.capture_fn(step, warmup_iters=1)
    assert out.tolist() == [0.0, 3.0, 6.0, 9.0]  # the warm-up's, eager
    assert all(a is b for a, b in zip((torch.cuda.is_current_stream_capturing,
                                       torch.cuda.graphs.is_current_stream_capturing), TORCH_ASKS))
    x.fill_(1.0)
    g.replay()
    assert out.tolist() == [2.0] * 4
    if backend == CUDA:
        torch.cuda.synchronize()
