"""The static batch: what a captured graph reads, at fixed addresses, refreshed in place before every replay.

A graph captures pointers, so the batch it runs on must live in tensors that never move: ``pos``,
``req``, ``raw_out_loc``, ``c2_slot`` (``[bucket]`` int64) and the extend offsets
``low_ratio_extend_offsets`` (``[2, request_slots]`` int32, also named ``extend_offsets``, as an
:class:`~c2graph.compressor.batch.ExtendBatch` names its offsets). A graph is captured on the
*dummy* batch (one request covering all rows, every row padding, so nothing real is written);
before each replay :meth:`StaticBatch.load` copies the next batch's metadata in with ``copy_``.

The prefill graph runner keeps one static batch for all its buckets (each bucket's graph reads
the first ``bucket`` rows: :meth:`StaticBatch.view`), with every layer's buffers beside it
(:class:`StaticBuffers`); notebook 03's exercises keep one of one bucket (:attr:`StaticBatch.batch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._runtime import DEFAULT_DEVICE
from ..compressor.arguments import allocate, as_device, as_int
from ..compressor.batch import MAX_ROWS, ROW_TENSORS as ROWS, ExtendBatch, Request
from ..compressor.extend_offsets import build_extend_offsets
from ..compressor.model import one_layer
from ..compressor.source_layer import SourceLayer


class StaticBatch:
    """Metadata tensors at fixed addresses, sized for ``bucket`` rows and ``request_slots`` slots.

    ``view(rows)`` is an :class:`ExtendBatch` of views of their first ``rows`` rows that carries what
    was last loaded: the loaded batch's request list and extents (what Python code that loops over
    requests, and the checks against the pools, see during a capture), the dummy's after
    :meth:`load_dummy`. For a row count other than the one loaded, the request list is the loaded
    one cut at ``rows`` and the extents cover everything the tensors hold, the rows past the loaded
    ones included. Views are made from what the host knows, so that a capture reads no tensor to
    make one; ``view(rows)`` is one object until the next load. :meth:`load` copies a real batch in
    with ``copy_``; :meth:`load_dummy` puts the dummy back.
    """

    def __init__(self, bucket: int, request_slots: int, device=None, *, buckets: Sequence[int] = ()):
        self.bucket = as_int("bucket", bucket, least=1, below=MAX_ROWS, below_is="2**31 (the offsets are int32)")
        self.request_slots = as_int("request_slots", request_slots, least=1, below=MAX_ROWS, below_is="2**31")
        device = as_device("device", device, DEFAULT_DEVICE)

        def zeros(name: str, *shape: int, dtype: torch.dtype) -> torch.Tensor:  # sized by the argument ``name``
            return allocate(name, getattr(self, name), lambda: torch.zeros(*shape, dtype=dtype, device=device))

        for name in ROWS:
            setattr(self, name, zeros("bucket", self.bucket, dtype=torch.int64))
        self.low_ratio_extend_offsets = zeros("request_slots", 2, self.request_slots, dtype=torch.int32)
        sizes = {as_int(f"buckets[{i}]", b, least=1, below=self.bucket + 1) for i, b in enumerate(buckets)}
        self._sizes = sorted(sizes | {self.bucket})
        self._held = {name: (0, 0) for name in ROWS}  # extents of every row the tensors hold (all zeros)
        self.load_dummy()

    @property
    def extend_offsets(self) -> torch.Tensor:
        """``low_ratio_extend_offsets``, by the name an :class:`ExtendBatch` gives its offsets."""
        return self.low_ratio_extend_offsets

    @property
    def batch(self) -> ExtendBatch:
        """The static batch of all ``bucket`` rows (:meth:`view`)."""
        return self.view(self.bucket)

    @property
    def loaded(self) -> ExtendBatch:
        """What was loaded last (:meth:`load` or :meth:`load_dummy`), as a view of its rows."""
        return self.view(self._loaded[0])

    def view(self, rows: int) -> ExtendBatch:
        """The static batch of the first ``rows`` rows: views of the tensors, with the loaded batch's
        request list and extents (see the class docstring)."""
        if rows not in self._sizes:
            raise ValueError(f"rows = {rows!r}; expected one of the row counts made at the start {self._sizes}")
        if rows not in self._views:
            n, requests, extents, needed = self._loaded
            if rows != n:
                requests, extents = _cut(requests, rows), self._held
            tensors = (getattr(self, name)[:rows] for name in ROWS)
            self._views[rows] = ExtendBatch.with_extents(requests, *tensors, self.low_ratio_extend_offsets, needed, extents)
        return self._views[rows]

    def metadata(self) -> dict[str, torch.Tensor]:
        """Every tensor by name: the per-row tensors and ``low_ratio_extend_offsets``."""
        offsets = {"low_ratio_extend_offsets": self.low_ratio_extend_offsets}
        return {**{name: getattr(self, name) for name in ROWS}, **offsets}

    def load_dummy(self, rows: int | None = None) -> None:
        """One request covering the first ``rows`` rows (all by default), every row padding
        (``raw_out_loc == 0``): a graph captured on it writes nothing real."""
        rows = self.bucket if rows is None else as_int("rows", rows, least=0, below=self.bucket + 1)
        self.pos[:rows].copy_(torch.arange(rows, device=self.pos.device))
        for name in ROWS[1:]:
            getattr(self, name)[:rows].zero_()
        self.low_ratio_extend_offsets.copy_(build_extend_offsets([rows], self.request_slots))
        extents = {name: (0, 0) if rows else (0, -1) for name in ROWS}
        extents["pos"] = (0, rows - 1)
        self._remember(rows, (Request(0, 0, rows),), extents, 1)

    def load(self, batch: ExtendBatch) -> None:
        """``copy_`` a batch of at most ``bucket`` rows and exactly ``request_slots`` slots into the
        first ``batch.num_rows`` rows, in place (the rows past it keep what they held). The views
        carry its request list and extents from here on."""
        if not isinstance(batch, ExtendBatch):
            raise ValueError(f"batch is a {type(batch).__name__}; expected a c2graph.ExtendBatch")
        if batch.num_rows > self.bucket or batch.request_slots != self.request_slots:
            raise ValueError(f"batch has {batch.num_rows} rows and {batch.request_slots} request slots; expected "
                             f"at most {self.bucket} and exactly {self.request_slots} (pad_to and request_slots)")
        n = batch.num_rows
        torch._foreach_copy_([getattr(self, name)[:n] for name in ROWS], [getattr(batch, name) for name in ROWS])
        self.low_ratio_extend_offsets.copy_(batch.extend_offsets)
        self._remember(batch.num_rows, batch.requests, batch.extents, batch.kv_slots_needed)

    def _remember(self, rows: int, requests, extents: dict, kv_slots_needed: int) -> None:
        """What the first ``rows`` rows now hold; every view is made again from it when next asked."""
        if rows == self.bucket:
            self._held = dict(extents)
        else:  # the rows past them keep what they held: the extents of all rows cover both
            self._held = {name: _union(self._held[name], extents[name]) for name in ROWS}
        needed = max(kv_slots_needed, self._held["c2_slot"][1] + 1, self._held["raw_out_loc"][1] // 2 + 1)
        self._loaded = (rows, tuple(requests), dict(extents), needed)
        self._views: dict[int, ExtendBatch] = {}


class LayerBuffers:
    """The static buffers of one source layer: its projection output and its latents, views of
    :class:`StaticBuffers`' blocks.

    ``projected``: ``[rows, 2D]`` fp32 (a layer with the fused gate), or ``kv`` and ``score``:
    ``[rows, D]`` fp32 each (one without); ``latent``: ``[rows, D]`` bf16.
    """

    def __init__(self, **buffers: torch.Tensor):
        vars(self).update(buffers)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every buffer by name."""
        return dict(vars(self))


class StaticBuffers(StaticBatch):
    """Every tensor the captured work reads or writes, at a fixed address, sized for the largest bucket.

    The row metadata and ``low_ratio_extend_offsets`` (the :class:`StaticBatch`, one view per
    bucket) are shared by all layers; ``layers[i]`` holds layer ``i``'s :class:`LayerBuffers`. The
    layers' buffers of one kind are slices of one block (``blocks``), so that one launch clears a
    kind for every layer before a replay (:meth:`clear`).
    """

    def __init__(self, layers: Sequence[SourceLayer], buckets: Sequence[int], request_slots: int,
                 device: torch.device):
        super().__init__(max(buckets), request_slots, device, buckets=buckets)
        rows, D, n_fused = self.bucket, layers[0].cfg.D, sum(layer.use_fused_gate for layer in layers)
        shapes = {"projected": (n_fused, rows, 2 * D), "kv": (len(layers) - n_fused, rows, D),
                  "score": (len(layers) - n_fused, rows, D), "latent": (len(layers), rows, D)}
        self.blocks = allocate("buckets", list(buckets), lambda: {
            name: torch.zeros(*shape, dtype=torch.bfloat16 if name == "latent" else torch.float32, device=device)
            for name, shape in shapes.items()})
        fused, unfused = iter(self.blocks["projected"]), iter(zip(self.blocks["kv"], self.blocks["score"]))
        self.layers = []
        for layer, latent in zip(layers, self.blocks["latent"]):
            if layer.use_fused_gate:
                self.layers.append(LayerBuffers(projected=next(fused), latent=latent))
            else:
                kv, score = next(unfused)
                self.layers.append(LayerBuffers(kv=kv, score=score, latent=latent))

    projected = one_layer("layers", "projected", owner="static")
    kv = one_layer("layers", "kv", owner="static")
    score = one_layer("layers", "score", owner="static")
    latent = one_layer("layers", "latent", owner="static")

    def clear(self, live: int, rows: int) -> None:
        """Before a replay of ``rows`` rows: zero every projection buffer past the ``live`` rows and
        fill every latent row with NaN (what eager returns on rows that complete no group)."""
        for name in ("projected", "kv", "score"):
            if live < rows and self.blocks[name].numel():
                self.blocks[name][:, live:rows].zero_()
        self.blocks["latent"][:, :rows].fill_(float("nan"))


def _union(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Extents covering both (``(0, -1)`` is no row)."""
    if a[1] < a[0]:
        return b
    if b[1] < b[0]:
        return a
    return min(a[0], b[0]), max(a[1], b[1])


def _cut(requests, rows: int) -> tuple[Request, ...]:
    """The requests' rows up to ``rows``: each request cut where the rows end."""
    out, row = [], 0
    for r in requests:
        n = max(0, min(r.extend_len, rows - row))
        out.append(r._replace(extend_len=n))
        row += r.extend_len
    return tuple(out)
