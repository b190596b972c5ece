"""Custom ops and Triton launches in a graph: one node each, replayed as launched, never as Python.

Each scenario is written once and run on both backends (``tests/graph_backends.py``). A custom
op's body runs once, at capture; a replay relaunches what it launched with the arguments it
launched with, so a launcher that sizes its work from host state keeps the capture-time size.
The emulation lists a custom op by its name, CUDA by the kernels it launched; a Triton kernel
launched directly is its own name on both.
"""

from __future__ import annotations

import c2graph  # noqa: F401, I001  (first: decides TRITON_INTERPRET before Triton is imported)

import pytest
import torch
import triton
import triton.language as tl
from graph_backends import EMULATE, INVALID_901, SYNC_900, add_one_, backend, device_of, needs_triton  # noqa: F401

from c2graph.graphs.graph import Graph

# ``HOST`` is host-side state a launcher might keep (the live rows of the batch it last saw), and
# counts the calls of the ops' Python.
HOST = {"rows": 0, "calls": 0}


@triton.jit
def _add_scalar_kernel(x_ptr, n, scale, BLOCK: tl.constexpr):
    """One program: ``x[:n] += scale``."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, x + scale, mask=mask)


@torch.library.custom_op("c2graph_test::add_scalar_triton_", mutates_args=("x",))
def add_scalar_triton_(x: torch.Tensor, scale: float) -> None:
    """``x += scale`` in place (``x``: a contiguous fp32 vector), by a one-program Triton kernel."""
    _add_scalar_kernel[(1,)](x, x.numel(), scale, BLOCK=triton.next_power_of_2(x.numel()))


@triton.jit
def _double_blocks_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Program ``p`` doubles ``x[p * BLOCK : (p + 1) * BLOCK]`` (rows below ``n``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@torch.library.custom_op("c2graph_test::double_rows_triton_", mutates_args=("x",))
def double_rows_triton_(x: torch.Tensor) -> None:
    """Double ``x[:HOST["rows"]]`` (fp32 vector): a grid of ``cdiv(rows, 2)`` programs of 2 rows."""
    HOST["calls"] += 1
    _double_blocks_kernel[(triton.cdiv(HOST["rows"], 2),)](x, x.numel(), BLOCK=2)


@torch.library.custom_op("c2graph_test::double_rows_torch_", mutates_args=("x",))
def double_rows_torch_(x: torch.Tensor) -> None:
    """Double ``x[:HOST["rows"]]`` with a torch op on a slice."""
    HOST["calls"] += 1
    x[: HOST["rows"]].mul_(2)


@torch.library.custom_op("c2graph_test::pointer_only_", mutates_args=("x",))
def pointer_only_(x: torch.Tensor) -> None:
    """Reads ``x``'s pointer and records no work: the shape of a kernel launched through a raw pointer."""
    assert x.data_ptr() != 0


PLANS: dict[int, float] = {}  # a plan cache keyed by an input's address, as a launcher keeps one


@torch.library.custom_op("c2graph_test::add_planned_", mutates_args=("x",))
def add_planned_(x: torch.Tensor) -> None:
    """``x += plan``, the plan looked up by ``x.data_ptr()`` (made on the first call)."""
    x.add_(PLANS.setdefault(x.data_ptr(), 1.0))


# ---------------------------------------------------------------------------------------------


def test_custom_op_is_one_node_and_replays(backend):
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    g = Graph(backend)
    g.capture_fn(lambda: add_one_(x), warmup_iters=1)  # the warm-up runs it (x == 1), the capture does not
    assert x.tolist() == [1.0] * 4
    g.replay()
    g.replay()
    assert x.tolist() == [3.0] * 4
    assert g.num_nodes == 1
    if backend == EMULATE:  # the emulation names the op, CUDA the kernel its body launched
        assert g.nodes() == ["c2graph_test.add_one_.default"]


def test_triton_custom_op_replays_with_frozen_scalar(backend):
    needs_triton(backend)
    dev = device_of(backend)
    x = torch.zeros(5, device=dev)
    scale = 0.5
    g = Graph(backend)
    g.capture_fn(lambda: add_scalar_triton_(x, scale), warmup_iters=1)  # x == 0.5 after the warm-up
    scale = 100.0  # noqa: F841  (frozen: replay adds 0.5)
    g.replay()
    assert x.tolist() == [1.0] * 5
    # the emulation names the op, CUDA the kernel its body launched
    assert g.nodes() == ["c2graph_test.add_scalar_triton_.default" if backend == EMULATE else "_add_scalar_kernel"]


def test_directly_launched_triton_kernel_is_one_node(backend):
    needs_triton(backend)
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    g = Graph(backend)
    g.capture_fn(lambda: _add_scalar_kernel[(1,)](x, 4, 1.0, BLOCK=4), warmup_iters=1)
    assert x.tolist() == [1.0] * 4  # the warm-up's launch; the capture launched nothing
    g.replay()
    g.replay()
    assert x.tolist() == [3.0] * 4
    assert g.nodes() == ["_add_scalar_kernel"]


@pytest.mark.parametrize("body", ["triton", "torch"])
def test_op_python_never_runs_on_replay(backend, body):
    """A launcher sizes its work from host state; the graph keeps the capture-time size.

    ``triton``: the grid is ``cdiv(HOST["rows"], 2)`` programs; ``torch``: a slice ``[:rows]``.
    """
    if body == "triton":
        needs_triton(backend)
    op = double_rows_triton_ if body == "triton" else double_rows_torch_
    dev = device_of(backend)
    x = torch.arange(1.0, 9.0, device=dev)
    HOST.update(rows=4, calls=0)
    g = Graph(backend)
    g.capture_fn(lambda: op(x), warmup_iters=1)
    assert HOST["calls"] == 2  # the warm-up and the capture
    HOST["rows"] = 8  # the launcher's host state moves on; the captured launch does not
    x.copy_(torch.arange(1.0, 9.0, device=dev) * 10)
    g.replay()
    g.replay()
    assert x.tolist() == [40.0, 80.0, 120.0, 160.0, 50.0, 60.0, 70.0, 80.0]
    assert HOST["calls"] == 2


def test_a_plan_cache_keyed_by_data_ptr_is_captured(backend):
    """``data_ptr()`` is no host sync: a CUDA capture allows it, in the caller's code and in an op's body."""
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    cache: dict[int, float] = {}

    def step():
        scale = cache.setdefault(x.data_ptr(), 2.0)  # a plan cache keyed by the input's address
        x.mul_(scale).add_(1.0)
        add_planned_(x)

    g = Graph(backend)
    g.capture_fn(step, warmup_iters=1)  # the warm-up: x == 2
    g.replay()
    assert x.tolist() == [6.0] * 4 and list(cache) == [x.data_ptr()] and x.data_ptr() in PLANS


def test_raw_pointer_work_the_emulation_cannot_see_is_refused():
    """Emulation only: a custom op that reads pointers and records no work.

    A CUDA capture records whatever kernel the pointer is handed to; the emulation cannot see
    such a kernel, and replay would skip it, so it refuses the op.
    """
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="read raw pointers .* and recorded no work"):
        with Graph(EMULATE).capture():
            pointer_only_(x)
    assert x.tolist() == [0.0] * 4


# A launch's grid that reads a tensor's value on the host: a tensor in the grid tuple (Triton reads
# it with int()), or a grid callable that calls .item(). Both are host syncs inside the capture.
HOST_GRIDS = {
    "tensor_in_grid": lambda n: (n,),
    "item_in_grid_callable": lambda n: lambda meta: (int(n.item()),),
}


@pytest.mark.parametrize("grid", HOST_GRIDS)
def test_a_grid_read_on_the_host_is_refused(backend, grid):
    """Code 900, and the capture is invalid (901 at its end), as for ``.item()`` in the caller's code."""
    needs_triton(backend)
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    programs = torch.tensor(1, device=dev)
    _add_scalar_kernel[(1,)](x, 4, 1.0, BLOCK=4)  # compiled outside the capture (x == 1)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901):
        with g.capture():
            with pytest.raises(RuntimeError, match=SYNC_900) as first:
                _add_scalar_kernel[HOST_GRIDS[grid](programs)](x, 4, 1.0, BLOCK=4)
            if backend == EMULATE:  # the emulation names what it refused; CUDA names nothing
                assert "aten._local_scalar_dense.default reads a tensor's value on the host" in str(first.value)
    assert x.tolist() == [1.0] * 4
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()
