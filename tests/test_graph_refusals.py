"""What a graph capture refuses, in the caller's code and inside a custom op's body: both backends.

The ``backend`` fixture (``tests/graph_backends.py``) runs every scenario on the CPU emulation and
on a real CUDA graph; where the backends differ on purpose, the scenario says so.

On CUDA (measured on an H200, torch 2.11): a host sync (``.item()``, ``print``, ``nonzero``, ...)
fails with code 900 and invalidates the capture (code 901 from then on); a host copy (``.cpu()``,
``.tolist()``, ``torch.tensor(list)``, ...) fails torch's own "Cannot copy ... unless the CPU
tensor is pinned" check, and the capture stays valid. Both hold inside a custom op's body as in
the caller's code, and both are deterministic: three captures of each host copy all raised the
check with the capture still active (the only CUDA call each makes before it asks whether the
stream is capturing). One run of these tests once saw 901 instead of the check at
``as_tensor_from_list``: not the op, but the garbage collector, which freed an earlier test's
finished graph in the middle of that capture. ``Graph`` keeps the collector off during a capture
(``test_no_automatic_garbage_collection_during_a_capture``); what the freeing does is
``test_freeing_a_finished_graph_during_a_capture``.
"""

from __future__ import annotations

import c2graph  # noqa: F401, I001  (first: decides TRITON_INTERPRET before Triton is imported)

import gc
from types import SimpleNamespace

import pytest
import torch
from graph_backends import CUDA, EMULATE, HOST_COPY, INVALID_901, SYNC_900, backend, device_of  # noqa: F401

from c2graph.graphs.graph import NOT_PERMITTED, PREVIOUS_ERROR, UNPINNED_COPY, Graph


@torch.library.custom_op("c2graph_test::add_one_to_counted_rows_", mutates_args=("out",))
def add_one_to_counted_rows_(out: torch.Tensor, counts: torch.Tensor) -> None:
    """``out[:counts.sum()] += 1``, the count read on the host: the launcher bug of notebook 03."""
    n = int(counts.sum().item())
    out[:n] += 1


@torch.library.custom_op("c2graph_test::host_read_in_op_", mutates_args=("x",))
def host_read_in_op_(x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    """``x += 1``, then the host read ``name`` (of ``HOST_SYNCS`` or ``HOST_COPIES``), in an op's body."""
    _launch_then_read(name, SimpleNamespace(x=x, idx=idx, mask=mask, dev=x.device))


def test_op_reading_a_count_on_the_host_is_refused(backend):
    dev = device_of(backend)
    out = torch.zeros(8, device=dev)
    counts = torch.tensor([3, 2], device=dev)
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901) as ended:
        with g.capture():
            with pytest.raises(RuntimeError, match=SYNC_900) as first:
                add_one_to_counted_rows_(out, counts)
            assert str(first.value).startswith(NOT_PERMITTED)
            if backend == EMULATE:  # the emulation names what it refused; CUDA names nothing
                assert "aten._local_scalar_dense.default" in str(first.value)
    assert str(ended.value).startswith(PREVIOUS_ERROR)
    assert out.tolist() == [0.0] * 8
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


# ---------------------------------------------------------------------------------------------
# What a capture refuses, in the caller's code and inside a custom op's body alike, each time after
# one launch (``x += 1``). Each scenario gets a fresh graph (and, on CUDA, a fresh stream), and
# ``s``: ``s.x`` (arange(8)), ``s.idx`` (an int64 index), ``s.mask`` (``x > 3``), all made before
# the capture, and ``s.dev``.

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

# Host copies: torch's own check raises before the copy; the capture stays valid.
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
    "setitem_int_number": lambda s: s.x.__setitem__(2, 5.0),
}

WHERE = ["caller", "op"]  # the host read runs in the caller's code, or inside a custom op's body


def _scenario(dev):
    x = torch.arange(8.0, device=dev)
    return SimpleNamespace(x=x, idx=torch.tensor([0, 2], device=dev), mask=x > 3, dev=dev), x * 2


def _launch_then_read(name: str, s) -> None:
    s.x.add_(1)  # a launch before the refused read: captured, as long as the capture stays valid
    (HOST_SYNCS.get(name) or HOST_COPIES[name])(s)


def _host_read(name: str, where: str, s) -> None:
    if where == "op":
        host_read_in_op_(s.x, s.idx, s.mask, name)
    else:
        _launch_then_read(name, s)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", HOST_SYNCS)
def test_host_sync_raises_and_ending_capture_raises(backend, name, where):
    s, y = _scenario(device_of(backend))
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901):
        with g.capture():
            with pytest.raises(RuntimeError, match=SYNC_900) as first:
                _host_read(name, where, s)
            assert str(first.value).startswith(NOT_PERMITTED)
            with pytest.raises(RuntimeError, match=INVALID_901):
                y.copy_(s.x * 3)  # every later launch fails too
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", HOST_SYNCS)
def test_uncaught_host_sync_escapes_as_901(backend, name, where):
    s, _ = _scenario(device_of(backend))
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=INVALID_901) as escaped:
        with g.capture():
            _host_read(name, where, s)
    assert str(escaped.value).startswith(PREVIOUS_ERROR)
    assert SYNC_900 in str(escaped.value.__context__)  # the first error is chained, not lost
    record = g.audit()  # the capture's own refusal, said in CUDA's words, at the line that made it
    assert not record.raised and record.refused == NOT_PERMITTED and record.refused_where != "the end of the capture"
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", HOST_COPIES)
def test_host_copy_raises_and_capture_stays_valid(backend, name, where):
    s, y = _scenario(device_of(backend))
    g = Graph(backend)
    with g.capture():
        with pytest.raises(RuntimeError, match=HOST_COPY) as refused:
            _host_read(name, where, s)
        assert str(refused.value).startswith(UNPINNED_COPY)
        y.copy_(s.x * 3)
    s.x.fill_(1.0)
    g.replay()  # the launch made before the refused copy is part of the graph
    assert s.x.tolist() == [2.0] * 8 and y.tolist() == [6.0] * 8


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", HOST_COPIES)
def test_uncaught_host_copy_fails_the_graph(backend, name, where):
    s, _ = _scenario(device_of(backend))
    g = Graph(backend)
    with pytest.raises(RuntimeError, match=HOST_COPY):
        with g.capture():
            _host_read(name, where, s)
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def test_no_automatic_garbage_collection_during_a_capture(backend):
    """The collector never runs inside a capture; it does outside, at the same allocation rate."""
    x = torch.arange(4.0, device=device_of(backend))
    collections = []

    def note(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a collection at almost every allocation while the collector is on
    gc.callbacks.append(note)
    try:
        g = Graph(backend)
        with g.capture():
            before = len(collections)
            junk = [[i] for i in range(1000)]
            y = x + 1
            during = len(collections) - before
        after = len(collections)
        junk = [[i] for i in range(1000)]  # noqa: F841
        outside = len(collections) - after
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*threshold)
    assert during == 0 and outside > 0
    g.replay()
    assert y.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_freeing_a_finished_graph_during_a_capture(backend):
    dev = device_of(backend)
    x = torch.arange(4.0, device=dev)
    old = Graph(backend)
    with old.capture():
        x.add_(1)
    cycle = [old]
    cycle.append(cycle)  # only the collector can free `old` now
    del old, cycle
    g = Graph(backend)
    if backend == CUDA:  # on purpose: destroying a finished CUDA graph is a CUDA call a capture refuses
        with pytest.raises(RuntimeError, match=INVALID_901):
            with g.capture():
                gc.collect()  # frees `old`; torch warns "operation not permitted when stream is capturing"
                x.mul_(2)
    else:  # the emulation's graphs own no CUDA objects: freeing one refuses nothing
        with g.capture():
            gc.collect()
            x.mul_(2)
        g.replay()
        assert x.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_numpy_raises_type_error(backend):
    s, _ = _scenario(device_of(backend))
    g = Graph(backend)
    with g.capture():
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            s.x.numpy()
        y = s.x + 1
    g.replay()
    assert y.tolist() == list(range(1, 9))


def test_bool_mask_assign_of_number_is_a_masked_fill(backend):
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


def test_unrelated_error_fails_the_graph(backend):
    dev = device_of(backend)
    x = torch.ones(2, device=dev)
    g = Graph(backend)
    with pytest.raises(ValueError, match="boom"):
        with g.capture():
            x.mul_(2)
            raise ValueError("boom")
    assert x.tolist() == [1.0, 1.0]
    record = g.audit()  # the step's own error, by its type and line: no refusal of the capture
    assert record.raised and record.refused == "ValueError: boom" and record.refused_code == 'raise ValueError("boom")'
    assert record.refused_where.startswith("test_graph_refusals.py:") and "capture failed" in record.table()
    with pytest.raises(RuntimeError, match="capture failed"):
        g.replay()


def test_replay_before_capture_and_capturing_twice(backend):
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
