"""The capture audit: it names what a capture froze from the batch, and flags nothing that is static.

Both directions are pinned: every broken variant of notebook 03 is caught by the frozen value that
breaks it, and the fixed runner (one layer, or many with fused and torch layers mixed) is clean.
The same tests run on CUDA graphs where CUDA is present (``make gpu-test``).
"""

from __future__ import annotations

import pytest
import torch
from support import make_case

import c2graph as c2
from c2graph.compressor.model import layer_pools, model_preset
from c2graph.graphs.audit import audit_batch, audit_capture, audit_twice, compare_captures, recording
from c2graph.graphs.broken_offsets import BrokenOffsetsRunner

HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
DEV = c2.DEFAULT_DEVICE


def variant_audit(variant: str, **kw):
    layer, _, pools = make_case(seed=3)
    runner = BrokenOffsetsRunner(layer, pools, variant=variant, buckets=[32], request_slots=4, capture=False, **kw)
    return runner.audit(32)


def test_the_fixed_runner_reads_the_offsets_by_address_and_freezes_only_static_sizes():
    layer, _, pools = make_case(seed=1)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16, 32], request_slots=4)
    audit = runner.audit(16)
    assert audit.ok and audit.flags == [] and audit.refused is None
    (node,) = audit.nodes()
    assert node.op == "c2graph.fused_compress.default"
    assert dict(node.scalars) == {"eps": layer.cfg.eps, "ring_size": 2, "grid_rows": 16}
    reads = {t.name: t.label for t in node.tensors if not t.written}
    writes = {t.name: t.label for t in node.tensors if t.written}
    assert reads["extend_offsets"] == "low_ratio_extend_offsets"
    assert reads["projected"] == "projected[:16]" and reads["pos"] == "pos[:16]"
    assert writes == {"ring": "ring", "kv_cache": "kv_cache", "index_k": "index_k", "latent_out": "latent[:16]"}
    assert "FROM THE BATCH" not in audit.table() and "nothing frozen came from the batch" in audit.table()


@pytest.mark.parametrize("variant, call", [("tolist", "Tensor.tolist"), ("tensor_from_list", "tensor")])
def test_a_refused_capture_is_reported_with_the_call_it_died_in(variant, call):
    audit = variant_audit(variant)
    assert not audit.ok and audit.second is None
    assert audit.refused.startswith(HOST_COPY) and f"(in {call} [graphs/broken_offsets.py: _compress])" in audit.refused
    assert "capture refused" in audit.table()


def test_python_ints_flag_the_frozen_fill_values_of_the_offsets():
    audit = variant_audit("python_ints")
    assert not audit.ok and audit.flags
    for flag in audit.flags:
        record = audit.first.records[flag.index]
        assert (flag.op, flag.arg, flag.what) == ("aten.fill_.Scalar", "value", "value")
        assert record.tensors[0].label.startswith("low_ratio_extend_offsets[")
    # the dummy's count in slot 0 (all 32 rows) against the ragged batch's first request (8 rows)
    flagged = {audit.first.records[f.index].tensors[0].label: (f.first, f.second) for f in audit.flags}
    assert flagged["low_ratio_extend_offsets[1, 0]"] == (32, 8)
    assert "low_ratio_extend_offsets[0, 0]" not in flagged, "0 in both captures: not told apart"
    assert audit.flagged("fused_compress") == set(), "the kernel itself reads the tensor by address"


def test_rebound_flags_the_offsets_tensor_read_at_a_new_address_each_batch():
    audit = variant_audit("rebound")
    assert [(f.op, f.arg, f.what) for f in audit.flags] == [("c2graph.fused_compress.default", "extend_offsets",
                                                            "address")]
    assert "read at a different address in each capture" in audit.table()


def test_grid_from_batch_flags_the_frozen_grid():
    audit = variant_audit("grid_from_batch", capture_rows=9)
    assert [(f.arg, f.first, f.second) for f in audit.flags] == [("grid_rows", 9, 24)]


def test_a_model_of_fused_and_torch_layers_is_clean():
    layers = model_preset("tiny", seed=2)
    pools = layer_pools(layers, 4, 64)
    runner = c2.PrefillGraphRunner(layers, pools, buckets=[16], request_slots=4)
    audit = runner.audit(16)
    assert audit.ok, audit.table(limit=0)
    fused = [r for r in audit.nodes() if r.op == "c2graph.fused_compress.default"]
    assert [t.label for r in fused for t in r.tensors if t.name == "projected"] == [
        "projected[layer 0]", "projected[layer 2]"]
    if runner.graphs[16].backend == "emulate":  # on CUDA, nodes are kernels: not one per op
        assert len(audit.nodes()) == len(runner.nodes(16))


def test_audit_twice_tells_batch_values_from_static_sizes():
    """A Python int and a slice bound taken from the batch are flagged; sizes and copy_ are not."""
    x = torch.arange(16.0, device=DEV)
    out = torch.zeros(16, device=DEV)
    batch = {"n": 3, "scale": 2.0}

    def work():
        out.copy_(x * batch["scale"])  # a value from the batch
        out[: batch["n"]].add_(1.0)    # a slice bound from the batch
        out.mul_(x.shape[0])           # a static size

    def load(n, scale):
        return lambda: batch.update(n=n, scale=scale)

    audit = audit_twice(work, load(3, 2.0), load(5, 4.0), {"x": x, "out": out}, title="t", batches=("a", "b"))
    flags = {(f.op, f.arg, f.what, str(f.first), str(f.second)) for f in audit.flags}
    assert ("aten.mul.Tensor", "other", "value", "2.0", "4.0") in flags, flags
    assert ("aten.slice.Tensor", "end", "value", "3", "5") in flags
    assert ("aten.add_.Tensor", "self", "shape", "(3,)", "(5,)") in flags
    assert len(flags) == 3, flags
    assert not any(f.first == 16 for f in audit.flags), "the static size is not flagged"
    labels = {t.label for r in audit.first.records for t in r.tensors}
    assert {"x", "out", "out[:3]"} <= labels


def test_audit_capture_records_and_names_temporaries_and_python_numbers():
    x = torch.ones(4, 2, device=DEV)
    y = torch.zeros(4, 2, device=DEV)

    def work():
        t = x * 3
        y.copy_(t)
        y[-1, :1] = 0.5

    records = audit_capture(work, {"x": x, "y": y})
    assert records.refused is None
    ops = [r.op for r in records.records if r.launches]
    assert ops[:2] == ["aten.mul.Tensor", "aten.copy_.default"], ops
    copy = next(r for r in records.records if r.op == "aten.copy_.default")
    assert [t.label for t in copy.tensors] == ["y", "temporary of op 0"]
    fill = [r for r in records.records if r.launches][-1]  # y[-1, :1] = 0.5: a fill of the view
    assert fill.tensors[0].label == "y[3, 0]" and fill.tensors[0].written, fill
    # the number is frozen either way: lifted from Python into a tensor, or an op's scalar
    lifted = {t.label for r in records.records for t in r.tensors if t.label.startswith("the Python number")}
    scalars = {v for r in records.records for _, v in r.scalars}
    assert lifted == {"the Python number 0.5"} or 0.5 in scalars, records.records
    assert compare_captures(records, audit_capture(work, {"x": x, "y": y})) == []


def test_the_audit_batch_is_ragged_and_writes_nothing():
    layer, _, pools = make_case(seed=0)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[32], request_slots=4, capture=False)
    batch = audit_batch(runner, 32)
    assert [tuple(r) for r in batch.requests] == [(0, 1, 8), (1, 0, 8), (2, 3, 8)]
    assert batch.extend_offsets.tolist() == [[0, 8, 16, 24], [8, 8, 8, 0]]
    assert int(batch.raw_out_loc.abs().sum()) == 0 and batch.num_rows == 32
    with pytest.raises(ValueError, match="bucket = 8; expected one of the runner's buckets"):
        runner.audit(8)
    with pytest.raises(ValueError, match="labels"):
        audit_capture(lambda: None, {"x": 1})


def test_recording_inside_a_capture_leaves_the_graph_working():
    """What ``Graph.audit`` can build on: the records of a capture that still replays."""
    x = torch.ones(4, device=DEV)
    graph = c2.Graph()
    with graph.capture(), recording({"x": x}) as records:
        x.mul_(2)
    assert [(r.op, r.scalars, [t.label for t in r.tensors]) for r in records.records] == [
        ("aten.mul_.Tensor", (("other", 2),), ["x"])]
    graph.replay()
    graph.replay()
    assert x.tolist() == [4.0] * 4
    with pytest.raises(RuntimeError, match=HOST_COPY):
        with c2.Graph().capture(), recording({"x": x}) as refused:
            x.tolist()
    assert refused.refused.startswith(HOST_COPY) and "(in Tensor.tolist [your code:" in refused.refused
