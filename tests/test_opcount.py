"""The launch counters: the dispatch-level op counter (any device) and the CUDA kernel counter."""

from __future__ import annotations

import pytest
import torch

import c2graph as c2
from c2graph.graphs.ops import launches_kernel
from c2graph.measure.opcount import count_cuda_kernels, count_ops, op_bytes

aten = torch.ops.aten


def test_counts_ops_not_views():
    x = torch.randn(8, 4)
    with count_ops() as ops:
        y = x[2:6].T[1].unsqueeze(0).view(-1)  # views only: no launch
        z = (y * 2 + 1).exp()  # three ops
        x[0].copy_(z[:4])  # one
    assert dict(ops.counts) == {
        "aten.mul.Tensor": 1,
        "aten.add.Tensor": 1,
        "aten.exp.default": 1,
        "aten.copy_.default": 1,
    }
    assert ops.total == 4
    assert ops["aten.mul.Tensor"] == 1 and ops["aten.sin.default"] == 0


def test_ops_still_run():
    x = torch.arange(6.0)
    with count_ops():
        y = torch.where(x > 2, x, -x)
    assert y.tolist() == [-0.0, -1.0, -2.0, 3.0, 4.0, 5.0]


def test_views_and_metadata_are_not_launches():
    assert not launches_kernel(aten.view.default)
    assert not launches_kernel(aten.slice.Tensor)
    assert not launches_kernel(aten.detach.default)
    assert not launches_kernel(aten.empty.memory_format)
    assert launches_kernel(aten.add.Tensor)
    assert launches_kernel(aten.index_put_.default)


def test_bytes():
    a, b = torch.randn(10, 4), torch.randn(10, 4)
    with count_ops() as ops:
        c = a + b  # reads 2 x 160 B, writes 160 B
        c.fill_(1.0)  # writes 160 B, reads nothing
        g = a[torch.tensor([1, 3])]  # reads 2 int64 indices and 2 rows, writes 2 rows
        a[torch.tensor([0])] = torch.ones(1, 4)  # reads 1 index and 1 row, writes 1 row
    assert ops.bytes["aten.add.Tensor"] == 3 * 160
    assert ops.bytes["aten.fill_.Scalar"] == 160
    assert ops.bytes["aten.index.Tensor"] == 16 + 2 * g.numel() * 4
    assert ops.bytes["aten.index_put_.default"] == 8 + 2 * 16
    assert op_bytes(aten.exp.default, (a,), {}, a.exp()) == 2 * 160


def test_table_lists_every_op_and_the_total():
    x = torch.randn(4)
    with count_ops() as ops:
        for _ in range(3):
            x = x * 2
        x = x.exp()
    table = ops.table()
    assert "aten.mul.Tensor" in table and "aten.exp.default" in table
    assert table.splitlines()[1].startswith("aten.mul.Tensor")  # most frequent first
    assert table.splitlines()[-1].split()[:2] == ["total", "4"]
    assert "1 more" in ops.table(top=1)


def test_torch_path_is_many_launches():
    from support import make_case

    layer, alloc, pools = make_case()
    batch = c2.ExtendBatch.build([(0, 1, 6), (1, 0, 5)], alloc, request_slots=3, pad_to=14)
    projected = c2.project_fused(layer, layer.random_hidden(batch.num_rows, 0))
    with count_ops() as ops:
        c2.compress_torch(layer, *c2.split_projected(projected), batch, pools)
    print(f"\ntorch path: {ops.total} ops\n{ops.table(top=8)}")
    assert ops.total > 30
    assert ops["aten.index_put_.default"] >= 3  # index_k, kv_cache and ring stores


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised on a machine without CUDA")
def test_count_cuda_kernels_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        count_cuda_kernels(lambda: None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.profiler's CUDA kernel events need CUDA")
def test_count_cuda_kernels():
    x = torch.randn(1024, device="cuda")
    kernels = count_cuda_kernels(lambda: (x * 2 + 1).exp())
    assert kernels.total == 3, kernels.table()
    copies = count_cuda_kernels(lambda: x.cpu())  # a device-to-host copy is no kernel
    assert copies.total == 0, copies.table()
