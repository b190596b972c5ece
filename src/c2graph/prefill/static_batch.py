"""The static batch: what a captured graph reads, at fixed addresses, refreshed in place before every replay.

A graph captures pointers, so the batch it runs on must live in tensors that never move: ``pos``,
``req``, ``raw_out_loc``, ``c2_slot`` (``[bucket]`` int64) and the extend offsets
``low_ratio_extend_offsets`` (``[2, request_slots]`` int32, also named ``extend_offsets``, as an
:class:`~c2graph.compressor.batch.ExtendBatch` names its offsets). A graph is captured on the
*dummy* batch (one request covering all rows, every row padding, so nothing real is written);
before each replay :meth:`StaticBatch.load` copies the next batch's metadata in with ``copy_``.

The prefill graph runner keeps one static batch for all its buckets (each bucket's graph reads
the first ``bucket`` rows: :meth:`StaticBatch.view`); notebook 03's exercises keep one of one
bucket (:attr:`StaticBatch.batch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._runtime import DEFAULT_DEVICE
from ..compressor.arguments import as_device, as_int
from ..compressor.batch import ROW_TENSORS as ROWS, ExtendBatch, Request
from ..compressor.extend_offsets import build_extend_offsets


class StaticBatch:
    """Metadata tensors at fixed addresses, sized for ``bucket`` rows and ``request_slots`` slots.

    ``view(rows)`` is an :class:`ExtendBatch` of views of their first ``rows`` rows, whose host-side
    request list is the dummy's (one request covering all rows): what Python code that loops over
    requests sees during a capture. The views are made here, once per row count in ``buckets``
    (and ``bucket``), so that a capture reads no tensor to make one. :meth:`load` copies a real
    batch in with ``copy_``; :meth:`load_dummy` puts the dummy back.
    """

    def __init__(self, bucket: int, request_slots: int, device=None, *, buckets: Sequence[int] = ()):
        self.bucket = as_int("bucket", bucket, least=1)
        self.request_slots = as_int("request_slots", request_slots, least=1)
        device = as_device("device", device, DEFAULT_DEVICE)
        for name in ROWS:
            setattr(self, name, torch.zeros(self.bucket, dtype=torch.int64, device=device))
        self.low_ratio_extend_offsets = torch.zeros(2, self.request_slots, dtype=torch.int32, device=device)
        self.load_dummy()
        sizes = {as_int(f"buckets[{i}]", b, least=1, below=self.bucket + 1) for i, b in enumerate(buckets)}
        self._views = {rows: self._make_view(rows) for rows in sorted(sizes | {self.bucket})}

    @property
    def extend_offsets(self) -> torch.Tensor:
        """``low_ratio_extend_offsets``, by the name an :class:`ExtendBatch` gives its offsets."""
        return self.low_ratio_extend_offsets

    @property
    def batch(self) -> ExtendBatch:
        """The static batch of all ``bucket`` rows (:meth:`view`)."""
        return self._views[self.bucket]

    def view(self, rows: int) -> ExtendBatch:
        """The static batch of the first ``rows`` rows: views of the tensors, the dummy's request list."""
        if rows not in self._views:
            raise ValueError(f"rows = {rows!r}; expected one of the row counts made at the start {sorted(self._views)}")
        return self._views[rows]

    def _make_view(self, rows: int) -> ExtendBatch:
        return ExtendBatch((Request(0, 0, rows),), *(getattr(self, name)[:rows] for name in ROWS),
                           self.low_ratio_extend_offsets, kv_slots_needed=1)

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

    def load(self, batch: ExtendBatch) -> None:
        """``copy_`` a batch of at most ``bucket`` rows and exactly ``request_slots`` slots into the
        first ``batch.num_rows`` rows, in place (the rows past it keep what they held)."""
        if batch.num_rows > self.bucket or batch.request_slots != self.request_slots:
            raise ValueError(f"batch has {batch.num_rows} rows and {batch.request_slots} request slots; expected "
                             f"at most {self.bucket} and exactly {self.request_slots} (pad_to and request_slots)")
        for name in ROWS:
            getattr(self, name)[: batch.num_rows].copy_(getattr(batch, name))
        self.low_ratio_extend_offsets.copy_(batch.extend_offsets)
