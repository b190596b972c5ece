"""What a graph capture freezes and what a replay runs: each scenario written once, run on both backends.

The ``backend`` fixture (``tests/graph_backends.py``) runs every scenario on the CPU emulation and
on a real CUDA graph. Where the backends differ on purpose, the scenario says so next to the
assertion; the few tests of one backend only say why in their docstring. Custom ops and Triton
launches are ``tests/test_graph_custom_ops.py``; what a capture refuses,
``tests/test_graph_refusals.py``.
"""

from __future__ import annotations

import c2graph  # noqa: F401, I001  (first: decides TRITON_INTERPRET before Triton is imported)

import pytest
import torch
from graph_backends import EMULATE, add_one_, backend, device_of  # noqa: F401  (backend: a fixture)

from c2graph.graphs.graph import Graph, warmup


# ---------------------------------------------------------------------------------------------
# Frozen values


def test_capture_launches_nothing(backend):
    dev = device_of(backend)
    x = torch.ones(4, device=dev)
    acc = torch.zeros(4, device=dev)
    g = Graph(backend)
    with g.capture():
        acc.add_(x)  # in place, on tensors from before the capture
        acc[1:3].mul_(10)  # through a view
        add_one_(acc)  # a custom op that writes its argument
        total = acc.sum()  # made inside the capture
    assert acc.tolist() == [0.0] * 4  # the capture wrote nothing
    g.replay()
    assert acc.tolist() == [2.0, 11.0, 11.0, 2.0] and total.item() == 26.0
    g.replay()
    assert acc.tolist() == [4.0, 121.0, 121.0, 4.0]


def test_python_int_is_frozen(backend):
    dev = device_of(backend)
    x = torch.arange(8.0, device=dev)
    n = 3
    g = Graph(backend)
    with g.capture():
        y = x * n
        head = x[:n].sum()
    n = 5  # noqa: F841  (rebinding the int: replay still multiplies by 3 and sums 3 rows)
    x.copy_(torch.arange(8.0, device=dev) + 1)
    g.replay()
    assert torch.equal(y, (torch.arange(8.0, device=dev) + 1) * 3)
    assert head.item() == 1 + 2 + 3


def test_tensor_from_list_outside_capture_is_frozen(backend):
    dev = device_of(backend)
    src = torch.arange(10.0, device=dev) * 10
    idx = torch.tensor([0, 2], device=dev)  # built from a list before the capture: fine
    captured_idx = idx
    g = Graph(backend)
    with g.capture():
        picked = src[idx]
    idx = torch.tensor([5, 7], device=dev)  # rebinding the name: replay never sees it
    g.replay()
    assert picked.tolist() == [0.0, 20.0]
    captured_idx.copy_(idx)  # copy_ into the captured tensor: replay sees it
    g.replay()
    assert picked.tolist() == [50.0, 70.0]


def test_copy_into_input_is_seen_rebinding_is_not(backend):
    dev = device_of(backend)
    x = torch.ones(4, device=dev)
    g = Graph(backend)
    with g.capture():
        y = x * 2
    static_x = x
    x = torch.full((4,), 10.0, device=dev)  # a new tensor under the old name
    g.replay()
    assert y.tolist() == [2.0] * 4
    static_x.copy_(x)
    g.replay()
    assert y.tolist() == [20.0] * 4


def test_outputs_are_overwritten_by_each_replay(backend):
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    g = Graph(backend)
    with g.capture():
        y = x + 1
    g.replay()  # an output holds a result once the graph has replayed (on CUDA, garbage before)
    first, kept = y, y.clone()
    ptr = y.data_ptr()
    x.copy_(torch.full((4,), 7.0, device=dev))
    g.replay()
    assert y is first and y.data_ptr() == ptr  # the same tensor object and memory ...
    assert y.tolist() == [8.0] * 4  # ... holding the new values
    assert kept.tolist() == [1.0, 2.0, 3.0, 4.0]  # only a copy keeps the old ones


def test_stale_padding_persists(backend):
    dev = device_of(backend)
    x = torch.arange(6.0, device=dev)
    out = torch.zeros(6, device=dev)
    g = Graph(backend)
    with g.capture():
        out[:4].copy_(x[:4] + 1)  # the captured work writes rows [0, 4) only
        scratch = torch.empty(6, device=dev)  # allocated, never filled: no kernel
        scratch[:4].copy_(x[:4])
    out[4:].fill_(99.0)  # rows of a "previous batch"
    scratch[4:].fill_(7.0)
    x.copy_(torch.full((6,), 5.0, device=dev))
    g.replay()
    assert out.tolist() == [6.0, 6.0, 6.0, 6.0, 99.0, 99.0]
    assert scratch.tolist() == [5.0, 5.0, 5.0, 5.0, 7.0, 7.0]


# ---------------------------------------------------------------------------------------------
# Views and slices


def test_views_alias_the_base(backend):
    dev = device_of(backend)
    base = torch.arange(12.0, device=dev)
    g = Graph(backend)
    with g.capture():
        grid = base.view(3, 4)
        sub = grid[1:, ::2]  # a view of a view
        strided = base.as_strided((2, 2), (1, 3), 1)
        scaled = sub * 10
        shifted = strided + 0.5
    new = torch.arange(12.0, device=dev) * -1
    base.copy_(new)
    g.replay()
    for view in (grid, sub, strided):
        assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert torch.equal(sub, new.view(3, 4)[1:, ::2])
    assert torch.equal(strided, new.as_strided((2, 2), (1, 3), 1))
    assert torch.equal(scaled, new.view(3, 4)[1:, ::2] * 10)
    assert torch.equal(shifted, new.as_strided((2, 2), (1, 3), 1) + 0.5)
    assert g.num_nodes == 2  # views launch nothing
    if backend == EMULATE:  # the emulation names ops, CUDA names kernels
        assert g.nodes() == ["aten.mul.Tensor", "aten.add.Tensor"]


def test_slice_bakes_its_offset(backend):
    dev = device_of(backend)
    x = torch.zeros(8, device=dev)
    start = 2
    g = Graph(backend)
    with g.capture():
        x[start : start + 2].add_(1)  # an in-place write through a view of rows [2, 4)
        x[6:] = 5.0  # a Python number written through a slice
    start = 4  # noqa: F841  (replay keeps writing rows [2, 4))
    x.zero_()
    g.replay()
    g.replay()
    assert x.tolist() == [0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 5.0, 5.0]


# ---------------------------------------------------------------------------------------------
# What runs on replay: launches with their captured arguments, never Python


def test_listing_nodes_launches_nothing(backend):
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    g = Graph(backend)
    with g.capture():
        x.add_(1)
    for _ in range(3):
        assert g.num_nodes == 1
    assert x.tolist() == [0.0] * 4
    g.replay()
    assert x.tolist() == [1.0] * 4


def test_no_caller_python_runs_on_replay(backend):
    dev = device_of(backend)
    calls = []
    x = torch.ones(3, device=dev)

    def step():
        calls.append(1)  # a side effect of the caller's Python
        return x * 3

    g = Graph(backend)
    with g.capture():
        y = step()
    for _ in range(3):
        g.replay()
    assert len(calls) == 1
    assert y.tolist() == [3.0] * 3


def test_random_ops_draw_fresh_numbers_each_replay(backend):
    dev = device_of(backend)
    g = Graph(backend)
    warmup(lambda: torch.rand(16, device=dev))
    with g.capture():
        r = torch.rand(16, device=dev)
    draws = [r.clone()]
    for _ in range(2):
        g.replay()
        draws.append(r.clone())
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    assert g.num_nodes == 1  # on CUDA the RNG seed and offset refreshed before each launch are no node
    if backend == EMULATE:
        assert g.nodes() == ["aten.rand.default"]


def test_random_ops_leave_the_callers_generator_alone():
    """Emulation only: replays draw from the graph's own stream.

    (A CUDA replay advances the CUDA generator's offset instead.)
    """
    g = Graph(EMULATE)
    with g.capture():
        torch.rand(4)
    torch.manual_seed(7)
    want = torch.rand(4)
    torch.manual_seed(7)
    g.replay()
    assert torch.equal(torch.rand(4), want)


def test_graphs_share_a_pool(backend):
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    first = Graph(backend)
    with first.capture():
        y = x * 2
    second = Graph(backend, pool=first.pool())  # replayed after `first`, never at the same time
    with second.capture():
        z = y + 1
    x.fill_(3.0)
    first.replay()
    second.replay()
    assert z.tolist() == [7.0] * 4


def test_capture_fn_warms_up_then_captures(backend):
    dev = device_of(backend)
    calls = []
    x = torch.arange(3.0, device=dev)

    def step():
        calls.append(1)
        return x + 1

    g = Graph(backend)
    out = g.capture_fn(step, warmup_iters=2)
    assert len(calls) == 3  # two warm-up calls, one captured call
    x.fill_(10.0)
    g.replay()
    assert out.tolist() == [11.0] * 3 and len(calls) == 3


# Ways to give a captured tensor ``x`` other memory, or a smaller shape, after the capture.
SWAPS = {
    "data": lambda x, other: setattr(x, "data", other),
    "set_": lambda x, other: x.set_(other),
    "resize_": lambda x, other: x.resize_(2),  # the same memory, a smaller shape
}


@pytest.mark.parametrize("swap", SWAPS)
def test_a_tensor_given_other_memory_after_capture_is_replayed_where_it_was(backend, swap):
    """A graph holds the memory and shape each tensor had at capture: replays read and write there."""
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    captured = x.view(4)  # the captured memory, kept alive and writable (a CUDA graph holds only its pointer)
    g = Graph(backend)
    with g.capture():
        y = x * 2
        x.add_(1)
    other = torch.full((4,), 100.0, device=dev)
    SWAPS[swap](x, other)
    captured.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev))
    g.replay()
    assert y.tolist() == [2.0, 4.0, 6.0, 8.0] and captured.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert x.tolist() == ([2.0, 3.0] if swap == "resize_" else [100.0] * 4)  # x follows its new memory
    assert other.tolist() == [100.0] * 4


# ---------------------------------------------------------------------------------------------
# Grad modes, reading after a capture, bad arguments


def test_inference_mode_capture(backend):
    dev = device_of(backend)
    with torch.inference_mode():
        x = torch.ones(3, device=dev)
        g = Graph(backend)
        with g.capture():
            y = x * 4
            x.add_(1)
    g.replay()  # outside inference mode: replay still writes the inference tensors
    assert y.tolist() == [4.0] * 3 and x.tolist() == [2.0] * 3


def test_grad_mode_capture(backend):
    dev = device_of(backend)
    w = torch.full((3,), 2.0, device=dev, requires_grad=True)
    x = torch.ones(3, device=dev)
    g = Graph(backend)
    with g.capture():
        y = w * x
    x.fill_(5.0)
    g.replay()
    assert y.detach().tolist() == [10.0] * 3


def test_host_reads_after_capture_are_fine(backend):
    dev = device_of(backend)
    x = torch.arange(3.0, device=dev)
    g = Graph(backend)
    with g.capture():
        y = x + 1
    g.replay()
    assert y.tolist() == [1.0, 2.0, 3.0] and y.cpu().numpy().tolist() == [1.0, 2.0, 3.0]
    assert "tensor" in repr(y) and torch.tensor([1, 2], device=dev).tolist() == [1, 2]


def test_bad_backend_and_pool():
    with pytest.raises(ValueError, match="backend = 'gpu'"):
        Graph("gpu")
    for pool in ("pool", (1,), (0, 1.5), Graph(EMULATE)):
        with pytest.raises(ValueError, match="^pool = .*; expected None or a memory-pool handle"):
            Graph(EMULATE, pool=pool)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            Graph("cuda")


def test_bad_warmup_iters_and_record_are_refused_before_anything_runs():
    calls = []
    step = lambda: calls.append(1)  # noqa: E731
    with pytest.raises(ValueError, match="iters = -1; expected an int >= 0"):
        warmup(step, -1)
    for bad in (True, False, 2.0, "2", None):
        with pytest.raises(TypeError, match=f"^iters = {bad!r}; expected an int >= 0"):
            warmup(step, iters=bad)
    g = Graph(EMULATE)
    with pytest.raises(TypeError, match="^warmup_iters = True; expected an int >= 0, a number of eager calls"):
        g.capture_fn(step, warmup_iters=True)
    with pytest.raises(ValueError, match="^warmup_iters = -2; "):
        g.capture_fn(step, warmup_iters=-2)
    with pytest.raises(TypeError, match="^record = 'yes'; expected True"):
        with g.capture(record="yes"):
            step()
    with pytest.raises(TypeError, match="^fn is a int; expected a callable with no arguments"):
        g.capture_fn(3)
    with pytest.raises(TypeError, match="^fn is a NoneType; expected a callable"):
        warmup(None, 1)
    assert calls == [] and repr(g) == "Graph(backend='emulate', state='new')"


def test_audit_lists_what_the_capture_froze_and_read_by_address(backend):
    """``Graph.audit()``: per op, its frozen scalars and the labelled tensors it reads and writes;
    listing it launches nothing (the output keeps what the last replay wrote)."""
    dev = device_of(backend)
    x = torch.rand(8, device=dev) + 1.0
    acc = torch.rand(8, device=dev)
    n = 5  # a Python int: frozen
    g = Graph(backend)
    with g.capture(labels={"acc": acc, "x": x}):
        acc[:n].add_(x[:n], alpha=3)
    g.replay()
    after = acc.clone()
    audit = g.audit()
    launched = audit.nodes()
    assert [r.op for r in launched] == ["aten.add_.Tensor"]
    assert dict(launched[0].scalars) == {"alpha": 3}
    tensors = {t.name: (t.label, t.written) for t in launched[0].tensors}
    assert tensors == {"self": ("acc[:5]", True), "other": ("x[:5]", False)}
    assert "froze:  alpha=3" in audit.table()
    assert torch.equal(acc, after)


def test_capture_without_records_has_no_audit(backend):
    x = torch.randn(8, device=device_of(backend))
    g = Graph(backend)
    with g.capture(record=False):
        add_one_(x)
    with pytest.raises(RuntimeError, match="record=False"):
        g.audit()
    before = x.clone()
    g.replay()
    assert torch.equal(x, before + 1)
