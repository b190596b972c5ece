"""The prefill graph: one captured graph per bucket, replayed over static buffers.

The runner compresses every source layer of a model in one graph per bucket. At capture time it
knows only the static sizes: the bucket (a token count) and ``request_slots``. It allocates, once,
every buffer the captured work reads, sized for the largest bucket (each bucket's graph uses the
first ``bucket`` rows of them):

- one set of row metadata shared by all layers: ``pos``, ``req``, ``raw_out_loc``, ``c2_slot``
  (``[T]`` int64) and the extend offsets ``low_ratio_extend_offsets`` (``[2, request_slots]``
  int32: row 0 the first row of each request slot, row 1 its row count);
- per layer, the projection output: one ``[T, 2D]`` fp32 ``| kv | score |`` buffer for a layer
  with the fused gate, or separate ``kv`` and ``score`` ``[T, D]`` fp32 buffers for one without;
  and the latents ``[T, D]`` bf16 that its compressor writes.

Each graph is captured with a dummy batch: one request covering all rows, every row padding
(``raw_out_loc == 0``), so the warm-up and the capture write nothing real. The graphs share one
memory pool, the largest bucket captured first, as serving engines do (they never replay at the
same time).

To run a batch: pick the smallest bucket that fits (eager above the largest bucket, when padding
would more than double the rows, or when the batch has more requests than ``request_slots``),
check the batch against every layer's pools and build its metadata, ``copy_`` it into the static
buffers once for all layers, run each layer's source projection on the live rows into its static
projection buffer (zeroing its tail), fill its latents with NaN (eager returns NaN on the rows that
complete no group; so does a replay), and replay.

A graph writes the tensors it captured, whatever the runner holds later: a replay after
``runner.layer_pools`` (or a pools' cache or ring, a layer's weights, a static buffer) was rebound
would write the old memory. The runner keeps, at capture, the captured tensors and their
addresses, and refuses to replay when one moved (build a new runner over the new pools): one
comparison of identities and data pointers a step.

What the runner leaves to its caller: a replay compresses the batch loaded last, over the ring
its previous step left. :meth:`PrefillGraphRunner.run` loads before every replay; one who drives
the graphs directly (``runner.graphs[bucket].replay()``, after :meth:`~PrefillGraphRunner.refresh`)
must not replay twice without a refresh: the second replay runs the batch again over the ring
rows the first parked, so a request that starts at an odd position pairs its first row with its
own last row (wrong caches, and nothing can tell). A step interrupted once it began writing the
caches (a ``KeyboardInterrupt`` between layers) leaves some layers written and others not; the
next :meth:`~PrefillGraphRunner.run` refuses, saying so and what to do
(:meth:`~PrefillGraphRunner.clear_unfinished`). The engine's own piece, without the runner's
checks, buffers and audit: :mod:`.fused_graph`.

Threads: a runner runs one batch at a time. :meth:`PrefillGraphRunner.run` and
:meth:`PrefillGraphRunner.refresh` hold its :attr:`~PrefillGraphRunner.lock`, so two threads
calling ``run`` take turns and each batch writes its own caches; a step's latents are the static
buffers, overwritten by the next replay: a thread that reads them while another runs holds the lock
around both (``with runner.lock: step = runner.run(...); mine = step.latent.clone()``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..compressor.arguments import as_int, as_ints
from ..compressor.batch import MAX_ROWS, ExtendBatch, check_batch_fits, check_requests
from ..compressor.compress import compress, layer_path
from ..compressor.fused import compress_fused
from ..compressor.model import check_layers_and_pools, one_layer
from ..compressor.pools import Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import PROJECTIONS, SourceLayer, check_hidden, project_rows
from ..compressor.torch_path import compress_torch
from ..graphs.graph import Graph, warmup
from .captured import CapturedTensors
from .runner_audit import audit_runner
from .static_batch import StaticBuffers


@dataclass
class PrefillStep:
    """What :meth:`PrefillGraphRunner.run` did with one batch.

    ``latents``: one ``[rows, D]`` bf16 tensor per layer, NaN on the rows that complete no group
    (in graph and eager mode alike); after a replay each is a view of that layer's static latent
    buffer, overwritten by the next replay (copy it to keep it).
    """

    mode: str  # "graph" or "eager"
    bucket: int | None
    batch: ExtendBatch
    latents: tuple[torch.Tensor, ...]

    latent = one_layer("latents", owner="step")


class PrefillGraphRunner:
    """Runs extend batches of one or many source layers through per-bucket prefill graphs.

    ``layers``: one :class:`SourceLayer`, or a list of them; ``pools``: one :class:`Pools`, or a
    list of the same length (each layer writes its own caches and ring). All layers share one
    :class:`Config` and one device. ``buckets``: the token counts a graph is captured for (a batch
    is padded up to the next one). ``request_slots``: the most requests one batch may hold.
    A layer with the fused gate runs the fused path in the graph, one without the torch path.
    ``capture=False`` allocates the buffers but captures no graph (:meth:`audit` captures its
    own; :meth:`run` then refuses). ``projection``: how the source projection's GEMMs run, outside
    the graph (:data:`~c2graph.compressor.source_layer.PROJECTIONS`): ``"exact"`` (float64, the
    default: a replay equals eager bitwise) or ``"engine"`` (a bf16 GEMM with fp32 output, as the
    engine runs it: its last bits can change with the row count, so it is compared within a
    tolerance, never bitwise). An eager step runs :func:`~c2graph.compressor.compress.compress`,
    whose projection is the exact one.
    """

    def __init__(
        self,
        layers: SourceLayer | Sequence[SourceLayer],
        pools: Pools | Sequence[Pools],
        *,
        buckets: Sequence[int],
        request_slots: int,
        warmup_iters: int = 2,
        capture: bool = True,
        projection: str = "exact",
    ):
        self.layers, self.layer_pools = check_layers_and_pools(layers, pools)
        warmup_iters = as_int("warmup_iters", warmup_iters, least=0)
        if projection not in PROJECTIONS:
            raise ValueError(f"projection = {projection!r}; expected one of {PROJECTIONS}")
        self.projection = projection
        buckets = sorted(set(as_ints("buckets", buckets, least=1)))
        for i, b in enumerate(buckets):
            as_int(f"buckets[{i}]", b, below=MAX_ROWS, below_is="2**31 (the extend offsets are int32)")
        self.buckets, self.request_slots = buckets, as_int("request_slots", request_slots, least=1)
        self.device = self.layer_pools[0].device
        self.static = StaticBuffers(self.layers, buckets, self.request_slots, self.device)
        self.graphs: dict[int, Graph] = {}
        self.lock = threading.RLock()
        """Held by :meth:`run` and :meth:`refresh`: one batch at a time (see the module docstring)."""
        self._memory_pool = None  # the first graph's, shared by the others
        self._unfinished: str | None = None  # the step that began writing the caches and did not return
        self._captured = CapturedTensors(self)  # every tensor the graphs read or write, and where
        # each bucket's latents as a step returns them: views of the static buffers, made once
        self._latents = {b: tuple(buf.latent[:b] for buf in self.static.layers) for b in buckets}
        if capture:
            for bucket in reversed(buckets):  # largest first: the smaller ones fit in its memory
                self.graphs[bucket] = self._capture(bucket, warmup_iters)

    layer = one_layer("layers", owner="runner")
    pools = one_layer("layer_pools", owner="runner")

    @property
    def paths(self) -> tuple[str, ...]:
        """Each layer's path, ``"fused"`` or ``"torch"`` (:func:`~c2graph.compressor.compress.layer_path`)."""
        return tuple(layer_path(layer) for layer in self.layers)

    @property
    def path(self) -> str:
        """``"fused"`` or ``"torch"`` when every layer runs that path, else ``"mixed"``."""
        paths = set(self.paths)
        return paths.pop() if len(paths) == 1 else "mixed"

    # -- capture ----------------------------------------------------------------------------

    def _compress(self, bucket: int) -> None:
        """The captured work: every layer's compressor over the static buffers of ``bucket`` rows."""
        s = self.static
        batch = s.view(bucket)  # one set of metadata, read by every layer
        for layer, pools, buf in zip(self.layers, self.layer_pools, s.layers):
            if layer.use_fused_gate:
                compress_fused(layer, buf.projected[:bucket], batch, pools, latent_out=buf.latent[:bucket],
                               validate=False)
            else:
                compress_torch(layer, buf.kv[:bucket], buf.score[:bucket], batch, pools,
                               latent_out=buf.latent[:bucket], validate=False)

    def _load_capture_batch(self, bucket: int) -> None:
        """Load the batch a graph of ``bucket`` rows is captured with: the dummy."""
        self.static.load_dummy(bucket)

    def _capture(self, bucket: int, warmup_iters: int) -> Graph:
        """Load the capture batch, warm up (eagerly, outside the capture), then capture."""
        self._load_capture_batch(bucket)
        warmup(lambda: self._compress(bucket), iters=warmup_iters)
        graph = Graph(pool=self._memory_pool)
        with graph.capture():
            self._compress(bucket)
        if self._memory_pool is None:
            self._memory_pool = graph.pool()
        return graph

    def step(self, bucket: int) -> None:
        """Run, eagerly, the work the graph of ``bucket`` captures, over the static buffers as loaded."""
        self._compress(bucket)

    def load_capture_batch(self, bucket: int) -> None:
        """Load the static buffers with the batch the graph of ``bucket`` is captured with."""
        self._load_capture_batch(bucket)

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
        xs: torch.Tensor | Sequence[torch.Tensor],
        *,
        pad_to: int | None = None,
    ) -> PrefillStep:
        """Compress one extend batch in every layer.

        ``xs``: the hidden states of the batch's live rows, one ``[live, hidden]`` bf16 tensor per
        layer (a single tensor for a one-layer runner). ``pad_to`` is the row count shared by all
        data-parallel ranks (an idle rank passes no requests and still replays, every row padding).
        Eager above the largest bucket or past ``request_slots`` requests (:meth:`pick_bucket`).
        Everything is checked, the batch against every layer's pools too, before a page is allocated.
        Holds :attr:`lock` (one batch at a time).
        """
        with self.lock:
            self._check_finished()
            requests = check_requests(requests, allocator)
            live = sum(r.extend_len for r in requests)
            xs = self._check_xs(xs, live)
            if pad_to is not None:
                pad_to = as_int("pad_to", pad_to, least=live, least_is=f"the batch's {live} live rows")
            bucket = self.pick_bucket(live if pad_to is None else pad_to)
            if bucket is None or len(requests) > self.request_slots:
                return self._run_eager(requests, allocator, xs, pad_to)
            if bucket not in self.graphs:
                raise RuntimeError(f"no graph for bucket {bucket}: this runner was built with capture=False")
            self.check_captured()
            batch = ExtendBatch.build(requests, allocator, request_slots=self.request_slots, pad_to=bucket,
                                      device=self.device, pools=self._fit_pools())
            self._refresh(batch, xs)
            self._writing(batch, self.graphs[bucket].replay)
            return PrefillStep("graph", bucket, batch, self._latents[bucket])

    @property
    def unfinished(self) -> str | None:
        """The step that began writing the caches and rings and did not return (interrupted, or
        failed), in words; ``None`` when the last one finished."""
        return self._unfinished

    def clear_unfinished(self) -> None:
        """Say that the caches of the :attr:`unfinished` step's requests were dealt with (its requests
        freed, to be prefilled again from position 0), so :meth:`run` runs again."""
        with self.lock:
            self._unfinished = None

    def _check_finished(self) -> None:
        if self._unfinished is not None:
            raise RuntimeError(
                f"the last step ({self._unfinished}) did not finish: it was interrupted after it began writing "
                "the layers' caches and rings, so some layers may hold its writes and others not, and a "
                "request of it run again would pair its rows with ring rows that step parked. Free its "
                "requests (allocator.free(pool_index)) and prefill them again from position 0, then call "
                "runner.clear_unfinished()")

    def _writing(self, batch: ExtendBatch, write) -> None:
        """``write()``, the part of a step that writes the caches and rings, marked unfinished until it returns."""
        indices = ", ".join(str(r.pool_index) for r in batch.requests)
        self._unfinished = f"{batch.batch_size} request(s), pool indices [{indices}], {batch.num_rows} rows"
        write()
        self._unfinished = None

    def _fit_pools(self):
        """The pools a batch is checked against before a page is given: one, when every layer's
        pools have one size (the checks depend only on it), else each layer's."""
        sizes = {(p.pool_requests, p.kv_slots) for p in self.layer_pools}
        return self.layer_pools[0] if len(sizes) == 1 else self.layer_pools

    def refresh(self, batch: ExtendBatch, xs: torch.Tensor | Sequence[torch.Tensor], *, validate: bool = True) -> None:
        """Everything done between two replays: the metadata by ``copy_``, once for all layers
        (:meth:`StaticBuffers.load`), then every layer's source projection (:meth:`project`) and its
        latents filled with NaN.

        ``batch``: padded to one of the runner's buckets, with ``request_slots`` slots, fitting every
        layer's pools; with ``validate`` (the default) also checked against itself on the host
        (:meth:`ExtendBatch.check`: a sync). All of it, and that the graphs' tensors are still the
        runner's (:meth:`check_captured`), before anything is written. Holds :attr:`lock`.
        """
        with self.lock:
            if not isinstance(batch, ExtendBatch):
                raise ValueError(f"batch is a {type(batch).__name__}; expected a c2graph.ExtendBatch")
            if batch.num_rows not in self.buckets or batch.request_slots != self.request_slots:
                raise ValueError(
                    f"batch has {batch.num_rows} rows and {batch.request_slots} request slots; expected one of "
                    f"this runner's buckets ({self.buckets}) and {self.request_slots} request slots "
                    "(ExtendBatch.build's pad_to and request_slots)")
            xs = self._check_xs(xs, batch.live_rows)
            self.check_captured()
            for i, pools in enumerate(self.layer_pools):
                where = f"pools[{i}]: " if len(self.layer_pools) > 1 else ""
                check_batch_fits(batch, pools, where=where)
                if validate:
                    batch.check(pools)
            self._refresh(batch, xs)

    def _refresh(self, batch: ExtendBatch, xs) -> None:
        """:meth:`refresh` of a batch and hidden states already checked."""
        self.static.load(batch)
        self._project(batch.live_rows, xs)
        self.static.clear(batch.live_rows, batch.num_rows)

    def check_captured(self) -> None:
        """``ValueError`` naming the first tensor the graphs captured that the runner no longer holds
        where it was captured (a rebound cache or ring, replaced ``layer_pools`` or ``layers``, a
        static buffer): a replay would write the old memory (:class:`~.captured.CapturedTensors`)."""
        self._captured.check(self)

    def project(self, batch: ExtendBatch, xs: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """The eager break before the captured work: each layer's source projection on the live
        rows (the runner's ``projection``), written into its static projection buffer, the tail up
        to the bucket zeroed, and the latents filled with NaN (:meth:`StaticBuffers.clear`). ``xs``
        as in :meth:`run`."""
        xs = self._check_xs(xs, batch.live_rows)
        self._project(batch.live_rows, xs)
        self.static.clear(batch.live_rows, batch.num_rows)

    def _project(self, live: int, xs: Sequence[torch.Tensor]) -> None:
        """:meth:`project`'s GEMMs, of hidden states already checked."""
        for layer, buf, x in zip(self.layers, self.static.layers, xs):
            if layer.use_fused_gate:
                project_rows(x, layer.wkv_gate, self.projection, out=buf.projected[:live])
            else:
                project_rows(x, layer.wkv, self.projection, out=buf.kv[:live])
                project_rows(x, layer.wgate, self.projection, out=buf.score[:live])

    def _check_xs(self, xs, live: int) -> tuple[torch.Tensor, ...]:
        xs = (xs,) if isinstance(xs, torch.Tensor) else tuple(xs)
        if len(xs) != len(self.layers):
            raise ValueError(f"xs has {len(xs)} tensors; expected one per layer ({len(self.layers)})")
        for i, (layer, x) in enumerate(zip(self.layers, xs)):
            check_hidden(layer, x)
            if x.shape[0] != live:
                where = f"xs[{i}]" if len(xs) > 1 else "x"
                raise ValueError(f"{where} has {x.shape[0]} rows; expected the batch's {live} live rows")
        return xs

    def _run_eager(self, requests, allocator, xs, pad_to) -> PrefillStep:
        batch = ExtendBatch.build(requests, allocator, request_slots=max(self.request_slots, len(requests)),
                                  pad_to=pad_to, device=self.device, pools=self._fit_pools())
        latents = []
        self._writing(batch, lambda: latents.extend(
            compress(layer, x, batch, pools) for layer, x, pools in zip(self.layers, xs, self.layer_pools)))
        return PrefillStep("eager", None, batch, tuple(latents))

    # -- inspection -------------------------------------------------------------------------

    def nodes(self, bucket: int) -> list[str]:
        """The captured graph's nodes for ``bucket``, all layers in order (the emulation's recorded
        ops, or the CUDA graph's kernels, copies and fills, read from the graph: nothing is launched)."""
        if bucket not in self.graphs:
            raise ValueError(f"bucket = {bucket!r}; expected one of the buckets this runner captured {sorted(self.graphs)}")
        return self.graphs[bucket].nodes()

    def layer_nodes(self, bucket: int) -> list[list[str]]:
        """:meth:`nodes`, split by layer: ``[layer][node]``.

        A graph keeps no layer boundaries, so they are worked out from what each path launches: a
        fused layer is one node (the one launch of the fused kernel); the torch layers share the
        rest, and every torch layer launches the same list of nodes (checked: ``RuntimeError``
        otherwise).
        """
        nodes, paths = self.nodes(bucket), self.paths
        n_torch = paths.count("torch")
        rest = len(nodes) - paths.count("fused")
        if rest < 0 or (n_torch and rest % n_torch) or (not n_torch and rest):
            raise RuntimeError(f"{len(nodes)} nodes do not split into {paths.count('fused')} one-node fused "
                               f"layers and {n_torch} torch layers of equal length")
        per_torch = rest // n_torch if n_torch else 0
        out, i = [], 0
        for path in paths:
            n = 1 if path == "fused" else per_torch
            out.append(nodes[i:i + n])
            i += n
        torch_lists = {tuple(chunk) for chunk, path in zip(out, paths) if path == "torch"}
        if len(torch_lists) > 1:
            raise RuntimeError("the torch layers' nodes differ from layer to layer; they cannot be split by count")
        return out

    def audit(self, bucket: int):
        """What the graph of ``bucket`` froze from the batch: :func:`c2graph.audit` of its captured
        work over the dummy batch and a ragged one (:func:`~c2graph.prefill.runner_audit.audit_runner`)."""
        return audit_runner(self, bucket)

