"""The prefill graph: one captured graph per bucket, replayed over static buffers (SPEC §6).

At capture time the runner knows only the static sizes: the bucket (a token count) and
``request_slots``. It allocates, once, every buffer the captured work reads, sized for the
largest bucket (each bucket's graph uses the first ``bucket`` rows of them):

- the projection output: one ``[T, 2D]`` fp32 ``| kv | score |`` buffer for a layer with the
  fused gate, or separate ``kv`` and ``score`` ``[T, D]`` fp32 buffers for one without;
- per-row metadata ``pos``, ``req``, ``raw_out_loc``, ``c2_slot`` (``[T]`` int64);
- the extend offsets, ``low_ratio_extend_offsets``: ``[2, request_slots]`` int32;
- the latents ``[T, D]`` bf16 that the compressor writes.

Each graph is captured with a dummy batch: one request covering all rows, every row padding
(``raw_out_loc == 0``), so the warm-up and the capture write nothing real.

To run a batch: pick the smallest bucket that fits (eager above the largest bucket, or when
padding would more than double the rows), build the batch's metadata, ``copy_`` it into the
static buffers, run the source projection on the live rows into the static projection buffer
(zeroing its tail), and replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..compressor.batch import ExtendBatch, Request, check_requests
from ..compressor.fused import compress_fused
from .graph import Graph, warmup
from ..compressor.pools import Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer, check_hidden, project, project_fused
from ..compressor.compress import compress, layer_path
from ..compressor.torch_path import compress_torch
from ..compressor.arguments import check_layer_batch_pools


@dataclass
class PrefillStep:
    """What :meth:`PrefillGraphRunner.run` did with one batch.

    ``latent`` is ``[rows, D]`` bf16; after a replay it is a view of the static latent buffer,
    overwritten by the next replay (copy it to keep it).
    """

    mode: str  # "graph" or "eager"
    bucket: int | None
    batch: ExtendBatch
    latent: torch.Tensor


class StaticBuffers:
    """Every tensor the captured work reads or writes, at a fixed address, sized for ``rows``."""

    def __init__(self, layer: SourceLayer, rows: int, request_slots: int, device: torch.device):
        D = layer.cfg.D
        i64 = dict(dtype=torch.int64, device=device)
        self.pos = torch.zeros(rows, **i64)
        self.req = torch.zeros(rows, **i64)
        self.raw_out_loc = torch.zeros(rows, **i64)
        self.c2_slot = torch.zeros(rows, **i64)
        self.extend_offsets = torch.zeros(2, request_slots, dtype=torch.int32, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        if layer.use_fused_gate:
            self.projected = torch.zeros(rows, 2 * D, **f32)
        else:
            self.kv = torch.zeros(rows, D, **f32)
            self.score = torch.zeros(rows, D, **f32)
        self.latent = torch.zeros(rows, D, dtype=torch.bfloat16, device=device)

    def batch(self, bucket: int) -> ExtendBatch:
        """The static batch a graph of ``bucket`` rows is captured with: views of the buffers."""
        return ExtendBatch(
            requests=(Request(0, 0, bucket),),
            pos=self.pos[:bucket],
            req=self.req[:bucket],
            raw_out_loc=self.raw_out_loc[:bucket],
            c2_slot=self.c2_slot[:bucket],
            extend_offsets=self.extend_offsets,
            kv_slots_needed=1,
        )

    def load_dummy(self, bucket: int) -> None:
        """One request covering all ``bucket`` rows, every row padding: nothing real is written."""
        self.pos[:bucket].copy_(torch.arange(bucket, device=self.pos.device))
        self.req[:bucket].zero_()
        self.raw_out_loc[:bucket].zero_()
        self.c2_slot[:bucket].zero_()
        self.extend_offsets[0].fill_(bucket)
        self.extend_offsets[0, 0] = 0
        self.extend_offsets[1].zero_()
        self.extend_offsets[1, 0] = bucket

    def load(self, batch: ExtendBatch) -> None:
        """``copy_`` the batch's metadata into the first ``batch.num_rows`` rows, in place."""
        n = batch.num_rows
        for name in ("pos", "req", "raw_out_loc", "c2_slot"):
            getattr(self, name)[:n].copy_(getattr(batch, name))
        self.extend_offsets.copy_(batch.extend_offsets)


class PrefillGraphRunner:
    """Runs extend batches of one source layer through per-bucket prefill graphs.

    ``buckets``: the token counts a graph is captured for (a batch is padded up to the next
    one). ``request_slots``: the most requests one batch may hold. A layer with the fused gate
    runs the fused path in its graphs, one without runs the torch path.
    """

    def __init__(
        self,
        layer: SourceLayer,
        pools: Pools,
        *,
        buckets: Sequence[int],
        request_slots: int,
        warmup_iters: int = 2,
    ):
        buckets = sorted(set(buckets))
        if not buckets or any(not isinstance(b, int) or b <= 0 for b in buckets):
            raise ValueError(f"buckets = {list(buckets)!r}; expected positive ints")
        if not isinstance(request_slots, int) or request_slots <= 0:
            raise ValueError(f"request_slots = {request_slots!r}; expected a positive int")
        self.layer, self.pools = layer, pools
        self.buckets, self.request_slots = buckets, request_slots
        self.static = StaticBuffers(layer, buckets[-1], request_slots, pools.device)
        self.graphs: dict[int, Graph] = {}
        for bucket in reversed(buckets):  # largest first, as serving engines do
            self.graphs[bucket] = self._capture(bucket, warmup_iters)

    @property
    def path(self) -> str:
        """``"fused"`` or ``"torch"``: the layer's own path (:func:`~c2graph.compressor.compress.layer_path`)."""
        return layer_path(self.layer)

    # -- capture ----------------------------------------------------------------------------

    def _compress(self, bucket: int) -> None:
        """The captured work: the compressor over the static buffers of ``bucket`` rows."""
        s = self.static
        if self.path == "fused":
            compress_fused(self.layer, s.projected[:bucket], s.batch(bucket), self.pools,
                           latent_out=s.latent[:bucket], validate=False)
        else:
            compress_torch(self.layer, s.kv[:bucket], s.score[:bucket], s.batch(bucket), self.pools,
                           latent_out=s.latent[:bucket])

    def _capture(self, bucket: int, warmup_iters: int) -> Graph:
        self.static.load_dummy(bucket)
        return self._capture_loaded(bucket, warmup_iters)

    def _capture_loaded(self, bucket: int, warmup_iters: int) -> Graph:
        """Warm up (eagerly, outside the capture), then capture, with the static buffers as loaded."""
        warmup(lambda: self._compress(bucket), iters=warmup_iters)
        graph = Graph()
        with graph.capture():
            self._compress(bucket)
        return graph

    # -- replay -----------------------------------------------------------------------------

    def pick_bucket(self, rows: int) -> int | None:
        """The smallest bucket with room for ``rows``; ``None`` (run eagerly) above the largest
        bucket, or when padding would more than double the rows."""
        i = bisect.bisect_left(self.buckets, rows)
        if i == len(self.buckets) or self.buckets[i] > 2 * rows:
            return None
        return self.buckets[i]

    def run(
        self,
        requests: Sequence[tuple[int, int, int]],
        allocator: ReqToTokenPool,
        x: torch.Tensor,
        *,
        pad_to: int | None = None,
    ) -> PrefillStep:
        """Compress one extend batch: ``x`` holds the hidden states of its live rows ``[live, hidden]`` bf16.

        ``pad_to`` is the row count shared by all data-parallel ranks (an idle rank passes no
        requests and still replays, with every row padding).
        """
        requests = check_requests(requests, allocator)
        live = sum(r.extend_len for r in requests)
        check_hidden(self.layer, x)
        if x.shape[0] != live:
            raise ValueError(f"x has {x.shape[0]} rows; expected the batch's {live} live rows")
        rows = live if pad_to is None else pad_to
        bucket = self.pick_bucket(rows)
        if bucket is None or len(requests) > self.request_slots:
            return self._run_eager(requests, allocator, x, pad_to)
        batch = ExtendBatch.build(requests, allocator, request_slots=self.request_slots,
                                  pad_to=bucket, device=self.pools.device)
        check_layer_batch_pools(self.layer, batch, self.pools)
        self.refresh(batch, x)
        self.graphs[bucket].replay()
        return PrefillStep("graph", bucket, batch, self.static.latent[:bucket])

    def refresh(self, batch: ExtendBatch, x: torch.Tensor) -> None:
        """Everything done between two replays: metadata by ``copy_``, then the source projection
        on the live rows, written into the static projection buffer with its tail zeroed."""
        s, live, bucket = self.static, batch.live_rows, batch.num_rows
        s.load(batch)
        if self.path == "fused":
            project_fused(self.layer, x, out=s.projected)
            s.projected[live:bucket].zero_()
        else:
            kv, score = project(self.layer, x)
            for buf, val in ((s.kv, kv), (s.score, score)):
                buf[:live].copy_(val)
                buf[live:bucket].zero_()

    def _run_eager(self, requests, allocator, x, pad_to) -> PrefillStep:
        batch = ExtendBatch.build(requests, allocator, request_slots=max(self.request_slots, len(requests)),
                                  pad_to=pad_to, device=self.pools.device)
        return PrefillStep("eager", None, batch, compress(self.layer, x, batch, self.pools))

    def nodes(self, bucket: int) -> list[str]:
        """The captured graph's nodes for ``bucket`` (recorded ops, or CUDA kernels of one replay).

        The dummy batch is loaded first: where listing the nodes replays the graph (CUDA), that
        replay writes nothing real.
        """
        self.static.load_dummy(bucket)
        return self.graphs[bucket].nodes()
