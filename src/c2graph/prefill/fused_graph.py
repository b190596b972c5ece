"""The fused compressor in an engine's prefill graph: the whole change, over the engine's own metadata.

An engine's prefill graph already keeps each bucket's batch metadata in static tensors that it
refreshes in place before every replay: the rows' positions, their requests' indices and their
cache locations. To run the fused compressor of every ratio-2 source layer inside that graph, it
adds three things:

1. one more static tensor, ``low_ratio_extend_offsets``: ``[2, request_slots]`` int32, allocated
   once (row 0: each request slot's first row; row 1: its row count; slots past the batch: count
   0, first row the live rows), refreshed with ``copy_`` beside the others (:meth:`StaticRows.refresh`);
2. one launch per layer whose grid depends only on the bucket and the request slots, never on the
   batch: the kernel reads the offsets from the tensor, inside (:func:`compress_layers`);
3. a capture on the *dummy* batch, one request covering all rows, every row padding (cache
   location 0), so the warm-up and the capture write nothing real (:meth:`StaticRows.load_dummy`).

Nothing else: no host read of the offsets, no tensor made per batch, no Python int from the batch
in the captured code. Capture uses ``torch.cuda.graph``; ``graph=`` takes any object with
``capture()`` and ``replay()`` instead (``c2graph.Graph()``: its CPU emulation needs no GPU).

The caller's contract (nothing here checks it: checking would read the batch on the host):

- **refresh before every replay.** A replay compresses the batch last copied in, over the ring
  its previous replay left (each request's last rows parked there). Replaying twice without a
  refresh runs a batch again over ring rows it parked itself: a request that starts at an odd
  position pairs its first row with its own last row, and its caches are wrong;
- the metadata is what the engine's allocator gave: positions that continue the request that
  holds each index (a new request on a freed index starts at an even position, reading no ring
  row), distinct cache locations, padding rows (location 0) past the live rows. The kernel masks
  every store by the caches' and the ring's extents: wrong metadata writes wrong values, never
  outside the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..compressor.fused import compress_fused_op


class FusedLayer(NamedTuple):
    """What one source layer's fused compressor reads and writes, at fixed addresses.

    ``projected``: ``[bucket, 2D]`` fp32 ``| kv | score |`` (the engine's projection writes it);
    ``latent``: ``[bucket, D]`` bf16 (written on group rows only); the layer's weights, its caches
    and ring, and ``eps`` and ``ring_size`` from its config.
    """

    projected: torch.Tensor
    latent: torch.Tensor
    norm_w: torch.Tensor
    wk: torch.Tensor
    k_norm_w: torch.Tensor
    inv_freq: torch.Tensor
    kv_cache: torch.Tensor
    index_k: torch.Tensor
    ring: torch.Tensor
    eps: float
    ring_size: int


@dataclass(frozen=True)
class StaticRows:
    """One bucket's metadata at fixed addresses: ``pos``, ``req``, ``raw_out_loc`` (``[bucket]``
    int64: the engine's own) and ``low_ratio_extend_offsets`` (``[2, request_slots]`` int32: the one
    tensor the change adds)."""

    pos: torch.Tensor
    req: torch.Tensor
    raw_out_loc: torch.Tensor
    low_ratio_extend_offsets: torch.Tensor

    @classmethod
    def zeros(cls, bucket: int, request_slots: int, device) -> StaticRows:
        rows = [torch.zeros(bucket, dtype=torch.int64, device=device) for _ in range(3)]
        return cls(*rows, torch.zeros(2, request_slots, dtype=torch.int32, device=device))

    bucket = property(lambda self: self.pos.shape[0])

    def head(self, bucket: int) -> StaticRows:
        """The first ``bucket`` rows (views) and the same offsets: a smaller bucket's graph shares them."""
        return StaticRows(self.pos[:bucket], self.req[:bucket], self.raw_out_loc[:bucket],
                          self.low_ratio_extend_offsets)

    def refresh(self, pos: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor,
                extend_offsets: torch.Tensor) -> None:
        """Copy the next batch in, in place: its rows padded to the bucket, its offsets in every slot."""
        new = (pos, req, raw_out_loc, extend_offsets)
        for name, mine, t in zip(("pos", "req", "raw_out_loc", "extend_offsets"), self.tensors(), new):
            if not isinstance(t, torch.Tensor) or t.shape != mine.shape:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} has shape {shape}; expected {tuple(mine.shape)} (the bucket's rows, "
                                 "padded; the offsets of every request slot)")
        for mine, t in zip(self.tensors(), new):
            mine.copy_(t)

    def load_dummy(self) -> None:
        """One request covering all rows, every row padding: a capture on it writes nothing real."""
        n, slots = self.bucket, self.low_ratio_extend_offsets.shape[1]
        offsets = torch.tensor([[0] + [n] * (slots - 1), [n] + [0] * (slots - 1)], dtype=torch.int32)
        self.refresh(torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), offsets)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.pos, self.req, self.raw_out_loc, self.low_ratio_extend_offsets


def compress_layers(rows: StaticRows, layers: Sequence[FusedLayer]) -> None:
    """The captured work: one launch of the fused kernel per layer, over ``rows``; the grid comes
    from the bucket (``grid_rows``) and the offsets' request slots alone."""
    for layer in layers:
        compress_fused_op(
            layer.projected, layer.ring, rows.pos, rows.req, rows.raw_out_loc, rows.low_ratio_extend_offsets,
            layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, layer.kv_cache, layer.index_k,
            layer.latent, layer.eps, layer.ring_size, rows.bucket,
        )


class FusedPrefillGraph:
    """One bucket's graph of ``layers``' fused compressors over ``rows``: captured on the dummy batch
    (after ``warmup_iters`` eager runs of it), then :meth:`replay` refreshes and replays.

    ``graph``: a CUDA graph by default (``torch.cuda.graph``, in the memory pool ``pool``: the
    largest bucket's, shared by the smaller ones); or any object with ``capture()`` and ``replay()``.
    """

    def __init__(self, rows: StaticRows, layers: Sequence[FusedLayer], *, graph=None, pool=None, warmup_iters=2):
        self.rows, self.layers = rows, tuple(layers)
        rows.load_dummy()
        side = torch.cuda.Stream() if graph is None else None  # warm up as torch.cuda.graph's notes ask
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else nullcontext():
            for _ in range(warmup_iters):
                compress_layers(rows, self.layers)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph() if graph is None else graph
        with torch.cuda.graph(self.graph, pool=pool) if graph is None else graph.capture():
            compress_layers(rows, self.layers)

    def replay(self, pos, req, raw_out_loc, extend_offsets) -> None:
        """Refresh the static rows with the next batch (:meth:`StaticRows.refresh`), then replay."""
        self.rows.refresh(pos, req, raw_out_loc, extend_offsets)
        self.graph.replay()
