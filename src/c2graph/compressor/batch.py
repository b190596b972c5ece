"""An extend batch: the rows of several requests, flattened, with their metadata.

Rows are the concatenation of the requests' extend tokens; padding rows (up to a bucket, or to
the row count shared by data-parallel ranks) follow the live rows, with ``pos = 0`` and
``raw_out_loc = 0``, and belong to no request. What each row does is the row plan
(:meth:`ExtendBatch.plan`, :mod:`c2graph.compressor.rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import as_device, as_int
from .extend_offsets import build_extend_offsets
from .req_to_token import ReqToTokenPool
from .rows import MIN_RING_SIZE, BatchPlan, plan_rows

if TYPE_CHECKING:
    from .pools import Pools

#: The per-row tensors whose extents a batch counts when it is made (:attr:`ExtendBatch.extents`).
ROW_TENSORS = ("pos", "req", "raw_out_loc", "c2_slot")


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
    - ``kv_slots_needed``: 1 + the largest c2 slot its rows address, at least (counted on the host)
    - ``extents``: ``{name: (smallest, largest)}`` of ``pos``, ``req``, ``raw_out_loc`` and
      ``c2_slot``, counted on the host whenever a batch is made, ``dataclasses.replace`` included,
      so that the checks against the pools (:func:`check_batch_fits`)
      need no sync and run inside a capture too. Make a batch outside a capture (it reads the
      tensors once); a batch changed in place afterwards is not counted again.
    """

    requests: tuple[Request, ...]
    pos: torch.Tensor
    req: torch.Tensor
    raw_out_loc: torch.Tensor
    c2_slot: torch.Tensor
    extend_offsets: torch.Tensor
    kv_slots_needed: int
    extents: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rows = [getattr(self, name) for name in ROW_TENSORS]
        well_formed = all(isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point() for t in rows)
        if not well_formed or len({(t.shape[0], t.device) for t in rows}) != 1:
            object.__setattr__(self, "extents", {})  # malformed: the tensor checks name it before any use
            return
        if rows[0].numel():
            lo, hi = (v.tolist() for v in torch.stack(rows).aminmax(dim=1))
        else:
            lo, hi = [0] * len(rows), [-1] * len(rows)
        extents = dict(zip(ROW_TENSORS, zip(lo, hi)))
        object.__setattr__(self, "extents", extents)
        addressed = max(extents["c2_slot"][1], extents["raw_out_loc"][1] // 2, 0) + 1
        needed = max(as_int("kv_slots_needed", self.kv_slots_needed), addressed)
        object.__setattr__(self, "kv_slots_needed", needed)

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
        pools: Pools | Sequence[Pools] | None = None,
    ) -> "ExtendBatch":
        """Rows of ``requests`` (``(pool_index, prefix_len, extend_len)`` each), padded to ``pad_to`` rows.

        ``request_slots`` defaults to the number of requests; ``pad_to`` (a bucket, or the row
        count shared by data-parallel ranks) defaults to the live rows. ``pools``: the pools (one
        or a list) the batch is for; its pool indices and c2 slots must lie inside each. Every
        argument is checked, and the pages the requests would get worked out, before any page is
        allocated: a ``ValueError`` leaves the allocator as it was.
        """
        reqs = check_requests(requests, allocator)
        slots = len(reqs) if request_slots is None else as_int("request_slots", request_slots, least=0)
        if len(reqs) > slots:
            raise ValueError(
                f"the batch has {len(reqs)} requests but request_slots = {slots}; "
                "expected at most one request per slot"
            )
        live = sum(r.extend_len for r in reqs)
        num_rows = live if pad_to is None else as_int("pad_to", pad_to, least=live, least_is=f"the {live} live rows")
        dev = as_device("device", device, DEFAULT_DEVICE)
        fits = [pools] if pools is not None and not isinstance(pools, (list, tuple)) else list(pools or ())

        pos = torch.zeros(num_rows, dtype=torch.int64)
        req = torch.zeros(num_rows, dtype=torch.int64)
        raw = torch.zeros(num_rows, dtype=torch.int64)
        row = 0
        for r, locations in zip(reqs, allocator.assign(reqs, commit=False)):  # no page given yet
            n = r.extend_len
            pos[row : row + n] = torch.arange(r.prefix_len, r.prefix_len + n)
            req[row : row + n] = r.pool_index
            raw[row : row + n] = locations
            row += n
        c2_slot = torch.where((pos % 2 == 1) & (raw != 0), raw // 2, 0)
        offsets = build_extend_offsets([r.extend_len for r in reqs], slots)
        on_host = cls(reqs, pos, req, raw, c2_slot, offsets, kv_slots_needed=1)
        for i, p in enumerate(fits):
            check_batch_fits(on_host, p, where=f"pools[{i}]: " if len(fits) > 1 else "")
        allocator.assign(reqs)  # every check passed: give the pages (the same ones)
        return cls(reqs, pos.to(dev), req.to(dev), raw.to(dev), c2_slot.to(dev), offsets.to(dev),
                   kv_slots_needed=on_host.kv_slots_needed)

    # The layout of the rows, and what they do (the row plan), from the host-side request list.

    def row_ranges(self) -> list[range]:
        """The rows of each request slot, in batch order (what ``extend_offsets`` says)."""
        out, row = [], 0
        for r in self.requests:
            out.append(range(row, row + r.extend_len))
            row += r.extend_len
        return out

    def plan(self, ring_size: int) -> BatchPlan:
        """What every row does, for a ring of ``ring_size`` rows per pool request (:func:`plan_rows`)."""
        return plan_rows(self, ring_size)

    def _ring_free_plan(self) -> BatchPlan:
        """The plan of the smallest ring, for what does not depend on the ring size (group rows,
        c2 slots, which rows read the ring)."""
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


def check_requests(requests, allocator: ReqToTokenPool) -> tuple[Request, ...]:
    """The requests as :class:`Request` tuples of ints; ``ValueError`` naming the request and the
    field if one is bad (fields as :func:`~c2graph.compressor.arguments.as_int` takes them)."""
    expected = "expected a list of (pool_index, prefix_len, extend_len) tuples"
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Iterable):
        raise ValueError(f"requests = {requests!r}; {expected}")
    requests = list(requests)
    if requests and not any(_is_fields(r) for r in requests):
        raise ValueError(f"requests = {tuple(requests)!r} is one request; {expected}, such as [{tuple(requests)!r}]")
    reqs = []
    for i, r in enumerate(requests):
        if not _is_fields(r) or len(fields := tuple(r)) != 3:
            raise ValueError(f"request {i} = {r!r}; expected three fields (pool_index, prefix_len, extend_len)")
        reqs.append(Request(*allocator.check_request(*fields, where=f"request {i}: ")))
    seen: set[int] = set()
    for i, r in enumerate(reqs):
        if r.pool_index in seen:
            raise ValueError(f"request {i}: pool_index = {r.pool_index} appears twice in one batch")
        seen.add(r.pool_index)
    return tuple(reqs)


def _is_fields(r) -> bool:
    """``r`` holds fields (a tuple, a list, an array), not one number or a string."""
    return isinstance(r, Iterable) and not isinstance(r, (str, bytes)) and not (
        isinstance(r, torch.Tensor) and r.dim() == 0)


def check_batch_fits(batch: ExtendBatch, pools: Pools, where: str = "") -> None:
    """Every index the batch's rows hold lies inside the pools: pool indices (the ring's requests),
    c2 slots (both caches) and positions. The extents were counted on the host when the batch was
    made (:attr:`ExtendBatch.extents`), so this reads no tensor: it runs inside a capture too."""
    for r in batch.requests:
        as_int(f"{where}batch request pool_index", r.pool_index, least=0, below=pools.pool_requests,
               below_is=f"pools.pool_requests ({pools.pool_requests})")
    bounds = (  # tensor, what it holds, the first value past the pools, and which bound that is
        ("pos", "position", None, ""),
        ("req", "pool index", pools.pool_requests, f"pools.pool_requests ({pools.pool_requests})"),
        ("c2_slot", "c2 slot", pools.kv_slots, f"pools.kv_slots ({pools.kv_slots})"),
        ("raw_out_loc", "token slot", 2 * pools.kv_slots, f"2 * pools.kv_slots ({2 * pools.kv_slots})"),
    )
    for name, held, below, limit in bounds:
        lo, hi = batch.extents.get(name, (0, -1))
        if lo < 0:
            raise ValueError(f"{where}batch.{name} holds {held} {lo}; expected values >= 0")
        if below is not None and hi >= below:
            raise ValueError(f"{where}batch.{name} holds {held} {hi}, past the pools; expected < {limit}")
