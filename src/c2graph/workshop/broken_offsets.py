"""How per-request extend offsets break a CUDA graph: the fused path inside the prefill graph,
with its offsets handled the way an eager path naturally handles them.

Each variant changes one thing in :class:`~c2graph.prefill.runner.PrefillGraphRunner`
(one source layer, with the fused gate) and keeps everything else (buckets, static metadata,
projection) as it is:

- ``"tolist"``: the captured code reads the offsets back to the host with ``.tolist()`` to get
  Python ints for the launch. A device-to-host copy: capture refuses it.
- ``"tensor_from_list"``: it builds the offsets tensor from the host's Python lists with
  ``torch.tensor(list)``. A copy from pageable host memory to the device: capture refuses it.
- ``"python_ints"``: it writes each slot's first row and row count into an offsets tensor as
  Python ints. Capture records those ints; every replay writes the *dummy batch's* offsets
  (one request covering all rows), so rows pair across request boundaries and odd-start
  requests never read their ring row.
- ``"rebound"``: it gives each batch a fresh offsets tensor (rebinding a name) instead of
  ``copy_`` into the captured one. The graph keeps reading the capture-time tensor: the dummy's.
- ``"grid_from_batch"``: offsets are fine, but the grid is sized from the live rows of the batch
  seen at capture; replays never visit rows past them.

Every variant replays the batch seen at capture in one way or another. What must a graph-safe way
satisfy? Notebook 04 answers; :mod:`c2graph.prefill.fused_graph` is the answer an engine takes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..compressor.batch import ExtendBatch
from ..compressor.fused import compress_fused_op
from ..compressor.pools import Pools
from ..compressor.source_layer import SourceLayer
from ..prefill.runner import PrefillGraphRunner

VARIANTS: dict[str, str] = {
    "tolist": "reads the offsets back with .tolist() during capture",
    "tensor_from_list": "builds the offsets with torch.tensor(list) during capture",
    "python_ints": "writes each request's first row and row count as Python ints",
    "rebound": "rebinds the offsets tensor per batch instead of copy_ into the captured one",
    "grid_from_batch": "sizes the grid from the live rows of the batch seen at capture",
}


class BrokenOffsetsRunner(PrefillGraphRunner):
    """A prefill graph runner whose fused path handles the extend offsets in one broken way.

    ``capture_rows`` (``"grid_from_batch"`` only): live rows of the batch seen at capture.
    ``capture=False``: no graph is captured (for :meth:`audit`, which captures its own, even of a
    variant whose capture is refused).
    """

    def __init__(self, layer: SourceLayer, pools: Pools, *, variant: str, buckets: Sequence[int], request_slots: int,
                 capture_rows: int | None = None, warmup_iters: int = 2, capture: bool = True):
        if variant not in VARIANTS:
            raise ValueError(f"variant = {variant!r}; expected one of {sorted(VARIANTS)}")
        if not isinstance(layer, SourceLayer):
            raise ValueError(f"layer is a {type(layer).__name__}; expected one SourceLayer (a variant has one layer)")
        if not layer.use_fused_gate:
            raise ValueError("layer.use_fused_gate is False; the broken variants are of the fused path")
        self.variant = variant
        self.capture_rows = capture_rows
        # host-side copies of the offsets of the batch being prepared: what an eager path has
        self.host_offsets: list[list[int]] = [[], []]
        self.host_live_rows = 0
        self.offsets_tensor: torch.Tensor | None = None
        self._kept_alive: list[torch.Tensor] = []
        super().__init__(layer, pools, buckets=buckets, request_slots=request_slots,
                         warmup_iters=warmup_iters, capture=capture)

    def _remember(self, offsets: torch.Tensor, live_rows: int) -> None:
        """Outside any capture: keep the batch's offsets as an eager path has them."""
        self.host_offsets = offsets.tolist()
        self.host_live_rows = live_rows
        if self.variant == "rebound":
            self.offsets_tensor = offsets.clone()  # a fresh tensor per batch

    def _load_capture_batch(self, bucket: int) -> None:
        s = self.static
        s.load_dummy(bucket)
        rows = bucket
        if self.capture_rows is not None:  # the capture-time batch covers fewer rows
            rows = min(self.capture_rows, bucket)
            s.extend_offsets[0].fill_(rows)
            s.extend_offsets[0, 0] = 0
            s.extend_offsets[1, 0] = rows
        self._remember(s.extend_offsets, rows)
        if self.offsets_tensor is not None:
            # A graph holds only a raw pointer: keep the tensor it was captured with alive, or
            # its memory could go to another tensor and every replay would read garbage.
            self._kept_alive.append(self.offsets_tensor)

    def _refresh(self, batch: ExtendBatch, x: torch.Tensor) -> None:
        super()._refresh(batch, x)
        self._remember(batch.extend_offsets, batch.live_rows)

    def _compress(self, bucket: int) -> None:
        s, layer, pools = self.static, self.layer, self.pools
        offsets, grid_rows = s.extend_offsets, bucket
        if self.variant == "tolist":
            starts, counts = s.extend_offsets.tolist()  # a copy from the device to the host
            offsets = s.extend_offsets.new_tensor([starts, counts])
        elif self.variant == "tensor_from_list":
            offsets = torch.tensor(self.host_offsets, dtype=torch.int32, device=pools.device)
        elif self.variant == "python_ints":
            offsets = s.extend_offsets
            for r, (start, count) in enumerate(zip(*self.host_offsets)):
                offsets[0, r].fill_(start)  # a kernel whose scalar argument is frozen
                offsets[1, r].fill_(count)
        elif self.variant == "rebound":
            offsets = self.offsets_tensor
        elif self.variant == "grid_from_batch":
            grid_rows = self.host_live_rows
        compress_fused_op(
            s.projected[:bucket], pools.ring, s.pos[:bucket], s.req[:bucket], s.raw_out_loc[:bucket],
            offsets, layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq,
            pools.kv_cache, pools.index_k, s.latent[:bucket],
            layer.cfg.eps, layer.cfg.ring_size, grid_rows,
        )


def compress_layers_per_batch(rows, layers, host_offsets: list[list[int]], live_rows: int) -> None:
    """The engine's captured work (:func:`c2graph.prefill.fused_graph.compress_layers`) as an eager
    engine writes it: the offsets made for each batch from the host's lists, and the grid sized
    from its live rows. Right eagerly; a capture refuses its host-to-device copy, and a graph that
    froze them would replay the capture batch's offsets and grid (``tensor_from_list`` and
    ``grid_from_batch`` above). The fix is the difference of the two functions."""
    offsets = torch.tensor(host_offsets, dtype=torch.int32, device=rows.pos.device)
    for layer in layers:
        compress_fused_op(
            layer.projected, layer.ring, rows.pos, rows.req, rows.raw_out_loc, offsets,
            layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, layer.kv_cache, layer.index_k,
            layer.latent, layer.eps, layer.ring_size, live_rows,
        )
