"""An extend batch: the rows of several requests, flattened, with their metadata.

Rows are the concatenation of the requests' extend tokens; padding rows (up to a bucket, or to
the row count shared by data-parallel ranks) follow the live rows, with ``pos = 0`` and
``raw_out_loc = 0``, and belong to no request. What each row does is the row plan
(:meth:`ExtendBatch.plan`, :mod:`c2graph.compressor.rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from .._runtime import DEFAULT_DEVICE
from .extend_offsets import build_extend_offsets
from .req_to_token import ReqToTokenPool

if TYPE_CHECKING:
    from .rows import BatchPlan


class Request(NamedTuple):
    """One request of an extend batch: its pool index and the positions it extends."""

    pool_index: int
    prefix_len: int
    extend_len: int


@dataclass(frozen=True)
class ExtendBatch:
    """Per-row metadata of one extend batch, padded to ``num_rows``.

    - ``pos``: ``[T]`` int64, the token's absolute position (``prefix_len + i``); 0 on padding rows
    - ``req``: ``[T]`` int64, the request's pool index; 0 on padding rows
    - ``raw_out_loc``: ``[T]`` int64, the token's slot in the full KV pool; 0 marks a padding row
    - ``c2_slot``: ``[T]`` int64, ``raw_out_loc // 2`` on rows that complete a group (odd ``pos``),
      0 on every other row (the torch path sends its unwanted stores to c2 slot 0)
    - ``extend_offsets``: ``[2, request_slots]`` int32, first row and row count of each slot
    - ``kv_slots_needed``: 1 + the largest c2 slot (counted on the host, so checks need no sync)
    """

    requests: tuple[Request, ...]
    pos: torch.Tensor
    req: torch.Tensor
    raw_out_loc: torch.Tensor
    c2_slot: torch.Tensor
    extend_offsets: torch.Tensor
    kv_slots_needed: int

    @property
    def live_rows(self) -> int:
        """Rows that belong to a request (the rest, up to ``num_rows``, are padding)."""
        return sum(r.extend_len for r in self.requests)

    @property
    def num_rows(self) -> int:
        return self.pos.shape[0]

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def request_slots(self) -> int:
        return self.extend_offsets.shape[1]

    @property
    def device(self) -> torch.device:
        return self.pos.device

    @classmethod
    def build(
        cls,
        requests: Sequence[tuple[int, int, int]],
        allocator: ReqToTokenPool,
        *,
        request_slots: int | None = None,
        pad_to: int | None = None,
        device=None,
    ) -> "ExtendBatch":
        """Rows of ``requests`` (``(pool_index, prefix_len, extend_len)`` each), padded to ``pad_to`` rows.

        ``request_slots`` defaults to the number of requests; ``pad_to`` (a bucket, or the row
        count shared by data-parallel ranks) defaults to the live rows. Every argument is checked
        before any page is allocated.
        """
        reqs = check_requests(requests, allocator)
        slots = len(reqs) if request_slots is None else request_slots
        if not isinstance(slots, int) or slots < 0:
            raise ValueError(f"request_slots = {request_slots!r}; expected an int >= 0")
        if len(reqs) > slots:
            raise ValueError(
                f"the batch has {len(reqs)} requests but request_slots = {slots}; "
                "expected at most one request per slot"
            )
        live = sum(r.extend_len for r in reqs)
        num_rows = live if pad_to is None else pad_to
        if not isinstance(num_rows, int) or num_rows < live:
            raise ValueError(f"pad_to = {pad_to!r}; expected an int >= the {live} live rows")

        pos = torch.zeros(num_rows, dtype=torch.int64)
        req = torch.zeros(num_rows, dtype=torch.int64)
        raw = torch.zeros(num_rows, dtype=torch.int64)
        row = 0
        for r in reqs:
            n = r.extend_len
            pos[row : row + n] = torch.arange(r.prefix_len, r.prefix_len + n)
            req[row : row + n] = r.pool_index
            raw[row : row + n] = allocator.locations(*r)
            row += n
        c2_slot = torch.where((pos % 2 == 1) & (raw != 0), raw // 2, 0)
        offsets = build_extend_offsets([r.extend_len for r in reqs], slots)
        dev = torch.device(device) if device is not None else DEFAULT_DEVICE
        return cls(
            requests=reqs,
            pos=pos.to(dev),
            req=req.to(dev),
            raw_out_loc=raw.to(dev),
            c2_slot=c2_slot.to(dev),
            extend_offsets=offsets.to(dev),
            kv_slots_needed=int(c2_slot.max()) + 1 if num_rows else 1,
        )

    # The layout of the rows, and what they do (the row plan), from the host-side request list.

    def row_ranges(self) -> list[range]:
        """The rows of each request slot, in batch order (what ``extend_offsets`` says)."""
        out, row = [], 0
        for r in self.requests:
            out.append(range(row, row + r.extend_len))
            row += r.extend_len
        return out

    def plan(self, ring_size: int) -> "BatchPlan":
        """What every row does, for a ring of ``ring_size`` rows per pool request (:func:`plan_rows`)."""
        from .rows import plan_rows  # rows.py builds on this module

        return plan_rows(self, ring_size)

    def _ring_free_plan(self) -> "BatchPlan":
        """The plan of the smallest ring, for what does not depend on the ring size (group rows,
        c2 slots, which rows read the ring)."""
        from .rows import MIN_RING_SIZE

        return self.plan(MIN_RING_SIZE)

    # Shortcuts to the plan, for checks and notebooks.

    def group_rows(self) -> list[int]:
        """Rows that complete a group (odd ``pos``): exactly the rows that store a latent."""
        return self._ring_free_plan().group_rows

    def ring_partner_rows(self) -> list[int]:
        """Rows whose partner comes from the ring: the first row of a request that starts odd."""
        return sorted(self._ring_free_plan().ring_reads)

    def stored_slots(self) -> list[int]:
        """c2 slots this batch writes (in ``kv_cache`` and ``index_k``), one per group row."""
        return self._ring_free_plan().stored_slots

    def parked_ring_rows(self, ring_size: int) -> dict[int, int]:
        """``{ring row: batch row}`` the batch parks: each request's last ``min(rows, ring_size)`` rows."""
        return self.plan(ring_size).parked

    def __repr__(self) -> str:
        reqs = ", ".join(f"({r.pool_index}, {r.prefix_len}, {r.extend_len})" for r in self.requests)
        return (
            f"ExtendBatch(requests=[{reqs}], rows={self.num_rows} ({self.live_rows} live), "
            f"request_slots={self.request_slots})"
        )


def check_requests(requests: Sequence[tuple[int, int, int]], allocator: ReqToTokenPool) -> tuple[Request, ...]:
    """The requests as :class:`Request` tuples; ``ValueError`` naming the field if one is bad."""
    reqs = tuple(Request(*map(_as_int, r)) for r in requests)
    seen: set[int] = set()
    for i, r in enumerate(reqs):
        allocator.check_request(*r, where=f"request {i}: ")
        if r.pool_index in seen:
            raise ValueError(f"request {i}: pool_index = {r.pool_index} appears twice in one batch")
        seen.add(r.pool_index)
    return reqs


def _as_int(v) -> int:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"request field {v!r}; expected an int")
    return v
