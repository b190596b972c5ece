"""What a graph capture freezes and what it refuses: the CPU emulation (``Graph(backend="emulate")``).

Each ``check_*`` function below is one scenario, written once for both backends: the ``test_*``
functions here run it on the emulation, and ``tests/test_graph_cuda.py`` runs the same function
on a real CUDA graph. Where the two backends differ on purpose, the scenario says so.

On CUDA, host syncs and host copies behave differently (measured on an H200, torch 2.11):
a sync (``.item()``, ``print``, ``nonzero``, ...) fails with code 900 and invalidates the capture
(code 901 from then on); a host copy (``.cpu()``, ``.tolist()``, ``torch.tensor(list)``, ...)
fails torch's own "Cannot copy ... unless the CPU tensor is pinned" check before any CUDA call,
so the capture stays valid.
"""

from __future__ import annotations

import c2graph  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from c2graph.graphs.graph import NOT_PERMITTED, PREVIOUS_ERROR, UNPINNED_COPY, Graph, warmup

SYNC_900 = "operation not permitted when stream is capturing"
INVALID_901 = "operation failed due to a previous error during capture"
HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
EMULATE = "emulate"


def device_of(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


# ---------------------------------------------------------------------------------------------
# Two custom ops, seen by the emulation as one op each: one in torch, one a Triton kernel.


@torch.library.custom_op("c2graph_test::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    """``x += 1`` in place."""
    x.add_(1)


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


# ---------------------------------------------------------------------------------------------
# Frozen values


def check_capture_launches_nothing(backend):
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


def check_python_int_is_frozen(backend):
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


def check_tensor_from_list_outside_capture_is_frozen(backend):
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


def check_copy_into_input_is_seen_rebinding_is_not(backend):
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


def check_outputs_are_overwritten_by_each_replay(backend):
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


def check_stale_padding_persists(backend):
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


def check_views_alias_the_base(backend):
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
    if backend == EMULATE:
        assert g.nodes() == ["aten.mul.Tensor", "aten.add.Tensor"]  # views launch nothing
    else:
        assert g.num_nodes == 2


def check_slice_bakes_its_offset(backend):
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
# What runs on replay


def check_custom_op_is_one_node_and_reruns(backend):
    dev = device_of(backend)
    x = torch.zeros(4, device=dev)
    g = Graph(backend)
    g.capture_fn(lambda: add_one_(x), warmup_iters=1)  # the warm-up runs it (x == 1), the capture does not
    assert x.tolist() == [1.0] * 4
    g.replay()
    g.replay()
    assert x.tolist() == [3.0] * 4
    if backend == EMULATE:
        assert g.nodes() == ["c2graph_test.add_one_.default"]
    assert g.num_nodes == 1  # on CUDA: reading the nodes replays once more
    assert x.tolist() == [3.0 if backend == EMULATE else 4.0] * 4


def check_triton_custom_op_reruns_with_frozen_scalar(backend):
    dev = device_of(backend)
    x = torch.zeros(5, device=dev)
    scale = 0.5
    g = Graph(backend)
    g.capture_fn(lambda: add_scalar_triton_(x, scale), warmup_iters=1)  # x == 0.5 after the warm-up
    scale = 100.0  # noqa: F841  (frozen: replay adds 0.5)
    g.replay()
    assert x.tolist() == [1.0] * 5
    nodes = g.nodes()
    assert len(nodes) == 1
    if backend == EMULATE:
        assert nodes == ["c2graph_test.add_scalar_triton_.default"]
    else:
        assert "_add_scalar_kernel" in nodes[0]


def check_no_caller_python_runs_on_replay(backend):
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


def check_random_ops_draw_fresh_numbers_each_replay(backend):
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
    if backend == EMULATE:
        assert g.nodes() == ["aten.rand.default"]
    else:
        assert g.num_nodes == 1  # the RNG seed and offset refreshed before the launch are not nodes


def check_graphs_share_a_pool(backend):
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


def check_capture_fn_warms_up_then_captures(backend):
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


def check_resized_input_after_capture(backend):
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    g = Graph(backend)
    with g.capture():
        y = x * 2
    x.resize_(2)  # the same storage, a smaller shape
    if backend == EMULATE:
        with pytest.raises(RuntimeError, match="a dynamic shape got through"):
            g.replay()
    else:
        g.replay()  # CUDA checks nothing: it replays the old pointer and grid
        assert y.shape == (4,) and y.tolist() == [0.0, 2.0, 4.0, 6.0]


# ---------------------------------------------------------------------------------------------
# What a capture refuses. Each scenario gets a fresh graph (and, on CUDA, a fresh stream), and
# ``s``: ``s.x`` (arange(8)), ``s.idx`` (an int64 index), ``s.mask`` (``x > 3``),
# all made before the capture, and ``s.dev``.

# Host syncs: code 900, and the capture is invalid from then on.
HOST_SYNCS = {
    "item": lambda s: s.x[0].item(),
    "int": lambda s: int(s.x[0]),
    "if": lambda s: 1 if s.x[0] else 0,
    "print": lambda s: print(s.x),
    "equal": lambda s: torch.equal(s.x, s.x + 1),
    "nonzero": lambda s: s.x.nonzero(),
    "unique": lambda s: s.x.unique(),
    "masked_select": lambda s: s.x.masked_select(s.mask),
    "bool_mask_index": lambda s: s.x[s.mask],
    "bool_mask_assign_tensor": lambda s: s.x.__setitem__(s.mask, torch.zeros(4, device=s.dev)),
}

# Host copies: torch's own check raises before any CUDA call; the capture stays valid.
HOST_COPIES = {
    "cpu": lambda s: s.x.cpu(),
    "to_cpu": lambda s: s.x.to("cpu"),
    "tolist": lambda s: s.x.tolist(),
    "tensor_from_list": lambda s: torch.tensor([1, 2], device=s.dev),
    "tensor_from_number": lambda s: torch.tensor(3.0, device=s.dev),
    "as_tensor_from_list": lambda s: torch.as_tensor([1, 2], device=s.dev),
    "new_tensor_from_list": lambda s: s.x.new_tensor([1.0, 2.0]),
    "index_with_list": lambda s: s.x[[0, 2]],
    "index_put_number": lambda s: s.x.__setitem__(s.idx, 5.0),
}


def _scenario(dev):
    x = torch.arange(8.0, device=dev)
    return SimpleNamespace(x=x, idx=torch.tensor([0, 2], device=dev), mask=x > 3, dev=dev), x * 2


def check_host_sync_raises_and_ending_capture_raises(backend, name):
    dev = device_of(backend)
    s, y = _scenario(dev)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901):
        with g.capture():
            with pytest.raises(RuntimeError, match=SYNC_900) as first:
                HOST_SYNCS[name](s)
            assert str(first.value).startswith(NOT_PERMITTED)
            with pytest.raises(RuntimeError, match=INVALID_901):
                y.copy_(s.x * 3)  # every later launch fails too
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def check_uncaught_host_sync_escapes_as_901(backend, name):
    dev = device_of(backend)
    s, _ = _scenario(dev)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901) as escaped:
        with g.capture():
            HOST_SYNCS[name](s)
    assert SYNC_900 in str(escaped.value.__context__)  # the first error is chained, not lost
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def check_host_copy_raises_and_capture_stays_valid(backend, name):
    dev = device_of(backend)
    s, y = _scenario(dev)
    g = Graph(backend)
    with g.capture():
        with pytest.raises(RuntimeError, match=HOST_COPY) as refused:
            HOST_COPIES[name](s)
        assert str(refused.value).startswith(UNPINNED_COPY)
        y.copy_(s.x * 3)
    s.x.fill_(1.0)
    g.replay()
    assert y.tolist() == [3.0] * 8


def check_uncaught_host_copy_fails_the_graph(backend, name):
    dev = device_of(backend)
    s, _ = _scenario(dev)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=HOST_COPY):
        with g.capture():
            HOST_COPIES[name](s)
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def check_numpy_raises_type_error(backend):
    dev = device_of(backend)
    s, _ = _scenario(dev)
    g = Graph(backend)
    with g.capture():
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            s.x.numpy()
        y = s.x + 1
    g.replay()
    assert y.tolist() == list(range(1, 9))


def check_bool_mask_assign_of_number_is_a_masked_fill(backend):
    dev = device_of(backend)
    x = torch.arange(6.0, device=dev)
    mask = torch.zeros(6, dtype=torch.bool, device=dev)
    mask[:2] = True
    g = Graph(backend)
    with g.capture():
        out = x.clone()
        out[mask] = -1.0  # no sync: torch runs it as masked_fill_(mask, -1.0)
    mask.copy_(torch.tensor([False, False, False, True, True, True], device=dev))
    g.replay()
    assert out.tolist() == [0.0, 1.0, 2.0, -1.0, -1.0, -1.0]


def check_unrelated_error_fails_the_graph(backend):
    dev = device_of(backend)
    x = torch.ones(2, device=dev)
    g = Graph(backend)
    with pytest.raises(ValueError, match="boom"):
        with g.capture():
            x.mul_(2)
            raise ValueError("boom")
    assert x.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def check_replay_before_capture_and_capturing_twice(backend):
    dev = device_of(backend)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match="before capture"):
        g.replay()
    with pytest.raises(RuntimeError, match="before capture"):
        g.nodes()
    x = torch.ones(2, device=dev)
    with g.capture():
        with pytest.raises(RuntimeError, match="inside this graph's own capture"):
            g.replay()
        x.mul_(2)
    with pytest.raises(RuntimeError, match="captured once"):
        with g.capture():
            pass


def check_inference_mode_capture(backend):
    dev = device_of(backend)
    with torch.inference_mode():
        x = torch.ones(3, device=dev)
        g = Graph(backend)
        with g.capture():
            y = x * 4
            x.add_(1)
    g.replay()  # outside inference mode: replay still writes the inference tensors
    assert y.tolist() == [4.0] * 3 and x.tolist() == [2.0] * 3


def check_grad_mode_capture(backend):
    dev = device_of(backend)
    w = torch.full((3,), 2.0, device=dev, requires_grad=True)
    x = torch.ones(3, device=dev)
    g = Graph(backend)
    with g.capture():
        y = w * x
    x.fill_(5.0)
    g.replay()
    assert y.detach().tolist() == [10.0] * 3


# ---------------------------------------------------------------------------------------------
# The emulation's tests (the CUDA twins are in tests/test_graph_cuda.py)


def test_capture_launches_nothing():
    check_capture_launches_nothing(EMULATE)


def test_python_int_is_frozen():
    check_python_int_is_frozen(EMULATE)


def test_tensor_from_list_outside_capture_is_frozen():
    check_tensor_from_list_outside_capture_is_frozen(EMULATE)


def test_copy_into_input_is_seen_rebinding_is_not():
    check_copy_into_input_is_seen_rebinding_is_not(EMULATE)


def test_outputs_are_overwritten_by_each_replay():
    check_outputs_are_overwritten_by_each_replay(EMULATE)


def test_stale_padding_persists():
    check_stale_padding_persists(EMULATE)


def test_views_alias_the_base():
    check_views_alias_the_base(EMULATE)


def test_slice_bakes_its_offset():
    check_slice_bakes_its_offset(EMULATE)


def test_custom_op_is_one_node_and_reruns():
    check_custom_op_is_one_node_and_reruns(EMULATE)


NEEDS_INTERPRETER = pytest.mark.skipif(
    not c2graph.INTERPRET,
    reason="the emulation runs Triton kernels on CPU tensors, which needs Triton's interpreter "
    "(TRITON_INTERPRET=1, which c2graph sets on a machine without CUDA)",
)


@NEEDS_INTERPRETER
def test_triton_custom_op_reruns_with_frozen_scalar():
    check_triton_custom_op_reruns_with_frozen_scalar(EMULATE)


def test_no_caller_python_runs_on_replay():
    check_no_caller_python_runs_on_replay(EMULATE)


def test_random_ops_draw_fresh_numbers_each_replay():
    check_random_ops_draw_fresh_numbers_each_replay(EMULATE)


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


def test_graphs_share_a_pool():
    check_graphs_share_a_pool(EMULATE)


def test_capture_fn_warms_up_then_captures():
    check_capture_fn_warms_up_then_captures(EMULATE)


def test_resized_input_after_capture():
    check_resized_input_after_capture(EMULATE)


@pytest.mark.parametrize("name", HOST_SYNCS)
def test_host_sync_raises_and_ending_capture_raises(name):
    check_host_sync_raises_and_ending_capture_raises(EMULATE, name)


@pytest.mark.parametrize("name", HOST_SYNCS)
def test_uncaught_host_sync_escapes_as_901(name):
    check_uncaught_host_sync_escapes_as_901(EMULATE, name)


@pytest.mark.parametrize("name", HOST_COPIES)
def test_host_copy_raises_and_capture_stays_valid(name):
    check_host_copy_raises_and_capture_stays_valid(EMULATE, name)


@pytest.mark.parametrize("name", HOST_COPIES)
def test_uncaught_host_copy_fails_the_graph(name):
    check_uncaught_host_copy_fails_the_graph(EMULATE, name)


def test_host_sync_message_names_the_op():
    """Emulation only: a second line names what was refused (CUDA's message does not)."""
    g = Graph(EMULATE)
    x = torch.arange(3.0)
    with pytest.raises(RuntimeError, match=INVALID_901):
        with g.capture():
            with pytest.raises(RuntimeError) as first:
                x.sum().item()
            assert str(first.value).splitlines() == [
                NOT_PERMITTED,
                "(emulated capture: aten._local_scalar_dense.default reads a tensor's value on the host)",
            ]


def test_ending_a_failed_capture_raises_901_text():
    g = Graph(EMULATE)
    with pytest.raises(RuntimeError) as ended:
        with g.capture():
            with pytest.raises(RuntimeError):
                torch.ones(2).nonzero()
    assert str(ended.value) == PREVIOUS_ERROR


def test_numpy_raises_type_error():
    check_numpy_raises_type_error(EMULATE)


def test_bool_mask_assign_of_number_is_a_masked_fill():
    check_bool_mask_assign_of_number_is_a_masked_fill(EMULATE)


def test_unrelated_error_fails_the_graph():
    check_unrelated_error_fails_the_graph(EMULATE)


def test_replay_before_capture_and_capturing_twice():
    check_replay_before_capture_and_capturing_twice(EMULATE)


def test_inference_mode_capture():
    check_inference_mode_capture(EMULATE)


def test_grad_mode_capture():
    check_grad_mode_capture(EMULATE)


def test_host_reads_outside_capture_are_fine():
    """Emulation only: the refusals end with the capture; the recorded tensors read normally."""
    x = torch.arange(3.0)
    g = Graph(EMULATE)
    with g.capture():
        y = x + 1
    assert y.tolist() == [1.0, 2.0, 3.0] and y.cpu().numpy().tolist() == [1.0, 2.0, 3.0]
    assert "tensor" in repr(y) and torch.tensor([1, 2]).tolist() == [1, 2]


@NEEDS_INTERPRETER
def test_directly_launched_triton_kernel_is_refused():
    """Emulation only: a Triton launch that is not a custom op would be invisible to replay.

    Its launcher reads ``data_ptr()``, which the emulated capture refuses, naming the remedy;
    wrapped in a custom op (``add_scalar_triton_``) the same launch is one recorded node.
    """
    x = torch.zeros(4)
    g = Graph(EMULATE)
    with pytest.raises(RuntimeError, match="Register the kernel as a custom op"):
        with g.capture():
            _add_scalar_kernel[(1,)](x, 4, 1.0, BLOCK=4)
    assert x.tolist() == [0.0] * 4


def test_bad_backend():
    with pytest.raises(ValueError, match="backend = 'gpu'"):
        Graph("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            Graph("cuda")


def test_bad_warmup_iters():
    with pytest.raises(ValueError, match="iters = -1"):
        warmup(lambda: None, -1)
