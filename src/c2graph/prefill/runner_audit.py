"""The capture audit of a prefill graph runner's bucket: the dummy batch, then a ragged one.

:func:`audit_runner` runs :func:`c2graph.graphs.audit.audit` over the runner's public step and
load (:meth:`~c2graph.prefill.runner.PrefillGraphRunner.step`,
:meth:`~c2graph.prefill.runner.PrefillGraphRunner.load_capture_batch`, ``refresh``), with every
tensor the captured work touches named (:func:`runner_labels`). It holds the runner's lock for
the whole audit (a ``run`` of another thread waits, and never sees the audit's batches), and gives
every one of those tensors, and the static batch's record of what it holds, back as it found them:
a batch refreshed before the audit is still the one a replay after it reads.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..compressor.batch import ExtendBatch
from ..compressor.req_to_token import ReqToTokenPool
from ..graphs.audit import GraphAudit, audit
from ..graphs.audit_replay import Saved


def audit_batch(runner, bucket: int) -> ExtendBatch:
    """A ragged batch of ``bucket`` rows for the second capture: up to 3 requests starting at
    positions 1, 0 and 3, about a quarter of the rows padding, every ``raw_out_loc`` 0 (so its
    warm-up writes nothing)."""
    n = min(3, runner.request_slots, min(p.pool_requests for p in runner.layer_pools))
    live = bucket - max(1, bucket // 4) if bucket > 1 else bucket
    requests = [(i, (1, 0, 3)[i], live // n + (1 if i < live % n else 0)) for i in range(n)]
    allocator = ReqToTokenPool(runner.layers[0].cfg, n, 3 + live)
    batch = ExtendBatch.build(requests, allocator, request_slots=runner.request_slots, pad_to=bucket,
                              device=runner.device)
    zeros = torch.zeros_like(batch.raw_out_loc)
    return replace(batch, raw_out_loc=zeros, c2_slot=zeros.clone(), kv_slots_needed=1)


def audit_runner(runner, bucket: int) -> GraphAudit:
    """Audit the graph of ``bucket`` of a prefill graph runner (or a broken variant of one) with
    :func:`audit`: the step is the runner's captured work (``runner.step(bucket)``), loaded
    first with the batch its graphs are captured with, then, as a replay refreshes its buffers,
    with :func:`audit_batch`."""
    if bucket not in runner.buckets:
        raise ValueError(f"bucket = {bucket!r}; expected one of the runner's buckets {runner.buckets}")
    with runner.lock:
        labels = runner_labels(runner)
        saved, static = Saved(), runner.static
        for t in labels.values():
            saved.keep(t)
        held = {name: value.copy() if isinstance(value, dict) else value for name, value in vars(static).items()}
        try:
            return _audit(runner, bucket, labels)
        finally:
            saved.restore()
            vars(static).clear()
            vars(static).update(held)


def _audit(runner, bucket: int, labels) -> GraphAudit:
    batch = audit_batch(runner, bucket)
    xs = [layer.random_hidden(batch.live_rows, seed=i) for i, layer in enumerate(runner.layers)]
    lengths = ", ".join(str(r.extend_len) for r in batch.requests)
    starts = ", ".join(str(r.prefix_len) for r in batch.requests)
    loads = (f"the dummy batch: one request covering all {bucket} rows",
             f"a ragged batch: {batch.batch_size} requests of {lengths} rows from positions {starts}, "
             f"then {bucket - batch.live_rows} padding rows")
    name = type(runner).__name__ + (f" ({runner.variant})" if hasattr(runner, "variant") else "")
    title = f"audit of {name}, bucket {bucket}, {len(runner.layers)} layer(s): {runner.path} path"
    trash = {name: (0,) for i, path in enumerate(runner.paths) if path == "torch"
             for name in (_label("kv_cache", i, runner), _label("index_k", i, runner))}
    unordered = (trash, "the pools' reserved slot 0, where the torch path sends the stores of every row that "
                 "completes no group, many in one launch, in an order CUDA does not fix") if trash else None
    found = audit(lambda: runner.step(bucket), [lambda: runner.load_capture_batch(bucket),
                                                lambda: runner.refresh(batch, xs)], labels=labels,
                  unordered=unordered)
    return replace(found, title=title, loads=loads)


def _label(name: str, i: int, runner) -> str:
    """The label :func:`runner_labels` gives tensor ``name`` of layer ``i``."""
    return f"{name}[layer {i}]" if len(runner.layers) > 1 else name


def runner_labels(runner) -> dict[str, torch.Tensor]:
    """Every tensor a runner's captured work touches, by name: the shared metadata, and each
    layer's buffers, pools and weights (``"projected[layer 3]"`` where the runner has several)."""
    out = dict(runner.static.metadata())
    several = len(runner.layers) > 1
    for i, (layer, pools, buf) in enumerate(zip(runner.layers, runner.layer_pools, runner.static.layers)):
        tensors = {**buf.tensors(), **pools.tensors(), "norm_w": layer.norm_w, "wk": layer.wk,
                   "k_norm_w": layer.k_norm_w, "inv_freq": layer.inv_freq}
        out.update({f"{name}[layer {i}]" if several else name: t for name, t in tensors.items()})
    return out
