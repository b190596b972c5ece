"""An extend batch: the rows of several requests, flattened, with their metadata.

Rows are the concatenation of the requests' extend tokens, the *live rows*; padding rows (up to
a bucket, or to the row count shared by data-parallel ranks) follow them, with ``pos = 0``,
``req = 0`` and ``raw_out_loc = 0``, and belong to no request. A padding row is any row with
``raw_out_loc == 0``: only the dummy batch a graph is captured on has them inside a request. What
each row does is the row plan (:meth:`ExtendBatch.plan`, :mod:`c2graph.compressor.rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import allocate, as_device, as_int, check_type
from .batch_values import Request, as_requests, rows_agree, rows_on_device
from .extend_offsets import check_extend_offsets
from .pools import Pools
from .req_to_token import ReqToTokenPool
from .rows import MIN_RING_SIZE, BatchPlan, plan_rows

#: The per-row tensors whose extents a batch counts when it is made (:attr:`ExtendBatch.extents`).
ROW_TENSORS = ("pos", "req", "raw_out_loc", "c2_slot")

MAX_ROWS = 2**31
"""Rows of a batch are fewer than this: the extend offsets hold row numbers in int32."""


@dataclass(frozen=True)
class ExtendBatch:
    """Per-row metadata of one extend batch, padded to ``num_rows``.

    - ``pos``: ``[T]`` int64, the token's absolute position (``prefix_len + i``); 0 past the live rows
    - ``req``: ``[T]`` int64, the request's pool index; 0 past the live rows
    - ``raw_out_loc``: ``[T]`` int64, the token's slot in the full KV pool; 0 marks a padding row
    - ``c2_slot``: ``[T]`` int64, ``raw_out_loc // 2`` on rows that complete a group (odd ``pos``),
      0 on every other row (the torch path sends its unwanted stores to c2 slot 0)
    - ``extend_offsets``: ``[2, request_slots]`` int32, first row and row count of each slot
    - ``kv_slots_needed``: 1 + the largest c2 slot its rows address, at least (counted on the host)
    - ``extents``: ``{name: (smallest, largest)}`` of ``pos``, ``req``, ``raw_out_loc`` and
      ``c2_slot``, known on the host whenever a batch is made, so that the checks against the pools
      (:func:`check_batch_fits`) need no sync and run inside a capture
      too. :meth:`build` counts them from the requests and the pages (it reads no tensor back);
      a batch made from tensors (the constructor, ``dataclasses.replace``) reads them once: make
      it outside a capture. A batch changed in place afterwards is not counted again: with
      ``validate=True`` (the default) both paths check it as it is now (:meth:`check`).
    """

    requests: tuple[Request, ...]
    pos: torch.Tensor
    req: torch.Tensor
    raw_out_loc: torch.Tensor
    c2_slot: torch.Tensor
    extend_offsets: torch.Tensor
    kv_slots_needed: int
    extents: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)
    _checked: tuple | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", as_requests(self.requests))
        rows = [getattr(self, name) for name in ROW_TENSORS]
        well_formed = all(isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point() for t in rows)
        if not well_formed or len({(t.shape[0], t.device) for t in rows}) != 1:
            object.__setattr__(self, "extents", {})  # malformed: the tensor checks name it before any use
            return
        _set_extents(self, count_extents(rows))

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
        allocated: a ``ValueError`` leaves the allocator as it was. Requests that
        :func:`check_requests` returned for this allocator are not checked again. The batch's
        tensors are made on the host and copied to ``device``; nothing is read back (no sync).
        Holds the allocator's lock from working the pages out to giving them (threads share no page).
        """
        check_type("allocator", allocator, ReqToTokenPool, "a c2graph.ReqToTokenPool")
        with allocator.lock:  # no other thread gives pages between pages_for and take
            return cls._build(requests, allocator, request_slots, pad_to, device, pools)

    @classmethod
    def _build(cls, requests, allocator, request_slots, pad_to, device, pools) -> "ExtendBatch":
        reqs = check_requests(requests, allocator)
        slots = len(reqs) if request_slots is None else as_int("request_slots", request_slots, least=0)
        if len(reqs) > slots:
            raise ValueError(
                f"the batch has {len(reqs)} requests but request_slots = {slots}; "
                "expected at most one request per slot"
            )
        live = sum(r.extend_len for r in reqs)
        num_rows = live if pad_to is None else as_int("pad_to", pad_to, least=live, below=MAX_ROWS,
                                                      least_is=f"the {live} live rows",
                                                      below_is=f"2**31 (the extend offsets are int32)")
        dev = as_device("device", device, DEFAULT_DEVICE)
        fits = [pools] if pools is not None and not isinstance(pools, (list, tuple)) else list(pools or ())
        pages = allocator.pages_for(reqs)  # worked out, no page given yet

        extents = _built_extents(reqs, pages, num_rows)  # from the requests and the pages: no tensor read
        unset = torch.empty(0, dtype=torch.int64)  # the checks below read the extents and the slots, no tensor
        described = cls.with_extents(reqs, *(unset,) * 4, torch.empty(2, slots, dtype=torch.int32), 1, extents)
        for i, p in enumerate(fits):
            check_batch_fits(described, p, where=f"pools[{i}]: " if len(fits) > 1 else "")

        lens = [r.extend_len for r in reqs]
        tensors = allocate("pad_to", num_rows, lambda: rows_on_device(pages.rows, lens, slots, num_rows, dev))
        allocator.take(pages)  # every check passed: give the pages
        return cls.with_extents(reqs, *tensors, described.kv_slots_needed, extents)

    @classmethod
    def with_extents(cls, requests, pos, req, raw_out_loc, c2_slot, extend_offsets, kv_slots_needed: int,
                     extents: dict[str, tuple[int, int]]) -> "ExtendBatch":
        """A batch whose extents are known already (counted on the host from the requests and the
        pages, or carried from a loaded batch): made without reading a tensor. The caller vouches
        for ``extents``; :meth:`check` counts them again from the tensors."""
        batch = object.__new__(cls)
        fields = dict(requests=tuple(requests), pos=pos, req=req, raw_out_loc=raw_out_loc, c2_slot=c2_slot,
                      extend_offsets=extend_offsets, kv_slots_needed=kv_slots_needed)
        for name, value in fields.items():
            object.__setattr__(batch, name, value)
        _set_extents(batch, dict(extents))
        return batch

    def check(self, pools: Pools | None = None) -> None:
        """Check the batch against itself (and ``pools``), reading its tensors on the host (a sync:
        never inside a capture). ``ValueError`` naming the tensor, the row and the expected value
        unless:

        - the extents of the tensors *now* (a batch changed in place is counted again) lie inside
          the pools: pool indices, c2 slots, token slots, and positions ``>= 0``;
        - the extend offsets are well formed (:func:`check_extend_offsets`) and say what the request
          list says: slot ``r`` starts where the requests before it end and holds ``extend_len``
          rows, slots past the batch hold no row;
        - each request's rows hold its pool index and consecutive positions from ``prefix_len``,
          and either all of them a token slot (``raw_out_loc != 0``) or none (a dummy request);
          every row outside the requests is padding (``raw_out_loc``, ``pos`` and ``req`` 0);
        - ``c2_slot`` is ``raw_out_loc // 2`` on group rows (odd ``pos``), 0 on every other row:
          what the fused kernel computes from ``raw_out_loc``, so both paths store at one slot;
        - no two group rows store at one c2 slot (a right batch compared a slice at a time: :func:`rows_agree`).

        A batch that passed is not read again while what it was checked on stays as it was: pools of
        the same sizes, and each tensor at the same address with the same version counter (every torch
        op that writes a tensor in place bumps it), so one check a batch serves every layer of a step.
        """
        stamp = _check_stamp(self, pools)
        if stamp is None or stamp != self._checked:
            self._check_rows(pools)
            object.__setattr__(self, "_checked", stamp)

    def _check_rows(self, pools: Pools | None) -> None:
        starts, counts = check_extend_offsets(self.extend_offsets, self.num_rows)
        pos, req, raw, c2 = (getattr(self, name).tolist() for name in ROW_TENSORS)  # copies, no kernel
        if pools is not None:
            now = {name: (min(v), max(v)) if v else (0, -1) for name, v in zip(ROW_TENSORS, (pos, req, raw, c2))}
            check_batch_fits(self, pools, extents=now)
        elif pos and min(pos) < 0:
            raise ValueError(f"batch.pos holds position {min(pos)}; expected values >= 0")
        if rows_agree(self.requests, starts, counts, pos, req, raw, c2):
            return  # a right batch: the rules below, row by row, would find nothing
        if len(self.requests) > len(starts):
            raise ValueError(f"batch.requests has {len(self.requests)} requests but batch.extend_offsets "
                             f"{len(starts)} request slots; expected at most one request per slot")
        in_request, row = [False] * self.num_rows, 0
        for r, (start, count) in enumerate(zip(starts, counts)):
            want = self.requests[r] if r < len(self.requests) else None
            if (start, count) != ((row, want.extend_len) if want else (start, 0)):
                says = (f"request {tuple(want)} at row {row}, {want.extend_len} rows" if want
                        else "no request (a slot past the batch): 0 rows")
                raise ValueError(f"batch.extend_offsets[:, {r}] = ({start}, {count}), but batch.requests says "
                                 f"{says}; expected offsets that match the rows")
            if want is None:
                continue
            holds_a_slot = {raw[row + i] != 0 for i in range(count)}
            for i in range(count):
                if (req[row + i], pos[row + i]) != (want.pool_index, want.prefix_len + i):
                    raise ValueError(f"row {row + i} holds req {req[row + i]}, pos {pos[row + i]}; request slot {r} "
                                     f"{tuple(want)} expects req {want.pool_index}, pos {want.prefix_len + i}")
                in_request[row + i] = True
            if len(holds_a_slot) > 1:
                raise ValueError(f"request slot {r} {tuple(want)} has rows with raw_out_loc == 0 (padding) beside "
                                 "rows with a token slot; expected all of its rows one or the other")
            row += count
        for i in range(self.num_rows):
            if not in_request[i] and (raw[i], pos[i], req[i]) != (0, 0, 0):
                raise ValueError(f"row {i} is in no request but holds raw_out_loc {raw[i]}, pos {pos[i]}, req {req[i]}; "
                                 "expected a padding row: 0, 0, 0")
        stored: dict[int, int] = {}
        for i in range(self.num_rows):
            want = raw[i] // 2 if pos[i] % 2 == 1 and raw[i] != 0 else 0
            if c2[i] != want:
                raise ValueError(f"batch.c2_slot[{i}] = {c2[i]}, but raw_out_loc[{i}] = {raw[i]} at pos {pos[i]}; "
                                 f"expected {want} (raw_out_loc // 2 on a group row, else 0)")
            if want and stored.setdefault(want, i) != i:
                raise ValueError(f"rows {stored[want]} and {i} both store at c2 slot {want}; expected each group "
                                 "its own c2 slot")

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

    # Shortcuts to the plan (the same names as :class:`BatchPlan`'s), for checks and notebooks.

    @property
    def group_rows(self) -> list[int]:
        """Rows that complete a group (odd ``pos``): exactly the rows that store a latent."""
        return self._ring_free_plan().group_rows

    @property
    def ring_partner_rows(self) -> list[int]:
        """Rows whose partner comes from the ring: the first row of a request that starts odd."""
        return sorted(self._ring_free_plan().ring_reads)

    @property
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


class CheckedRequests(tuple):
    """Requests :func:`check_requests` checked against ``allocator``: :meth:`ExtendBatch.build` with
    the same allocator takes them as they are, without checking them again."""

    allocator: ReqToTokenPool


def check_requests(requests, allocator: ReqToTokenPool) -> CheckedRequests:
    """The requests as :class:`Request` tuples of ints; ``ValueError`` naming the request and the
    field if one is bad (fields as :func:`~c2graph.compressor.arguments.as_int` takes them)."""
    if isinstance(requests, CheckedRequests) and requests.allocator is allocator:
        return requests
    check_type("allocator", allocator, ReqToTokenPool, "a c2graph.ReqToTokenPool")
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
    checked = CheckedRequests(reqs)
    checked.allocator = allocator
    return checked


def _built_extents(reqs, pages, num_rows: int) -> dict[str, tuple[int, int]]:
    """The extents of the batch :meth:`ExtendBatch.build` makes of ``reqs`` on ``pages``
    (:meth:`ReqToTokenPool.pages_for`), padded to ``num_rows``: counted on the host, no tensor read."""
    if not num_rows:
        return {name: (0, -1) for name in ROW_TENSORS}
    live = [r for r in reqs if r.extend_len]
    padded = not live or num_rows > sum(r.extend_len for r in live)  # a padding row holds 0 in every tensor
    # c2_slot is 0 on every row that completes no group: a padding row, or an even one
    no_group = padded or any(r.extend_len > 1 or r.prefix_len % 2 == 0 for r in live)
    return {
        "pos": (0 if padded else min(r.prefix_len for r in live),
                max((r.prefix_len + r.extend_len - 1 for r in live), default=0)),
        "req": (0 if padded else min(r.pool_index for r in live), max((r.pool_index for r in live), default=0)),
        "raw_out_loc": (0 if padded else pages.extent[0], max(pages.extent[1], 0)),
        "c2_slot": (0 if no_group else pages.extent[0] // 2, max(pages.odd_max, 0) // 2),
    }


def _check_stamp(batch: ExtendBatch, pools: Pools | None) -> tuple | None:
    """What :meth:`ExtendBatch.check` read, as it is now; ``None`` where an inference tensor keeps no version."""
    tensors = [getattr(batch, name) for name in ROW_TENSORS] + [batch.extend_offsets]
    if not isinstance(pools, Pools | None) or any(not isinstance(t, torch.Tensor) or t.is_inference() for t in tensors):
        return None
    sizes = None if pools is None else (pools.pool_requests, pools.kv_slots)  # all the check reads of the pools
    return (batch.requests, sizes, *((t.data_ptr(), t._version, t.shape, t.dtype, t.device) for t in tensors))


def count_extents(rows: Sequence[torch.Tensor]) -> dict[str, tuple[int, int]]:
    """``{name: (smallest, largest)}`` of the per-row tensors (:data:`ROW_TENSORS`, in that order),
    ``(0, -1)`` where there is no row. Reads them (a sync on a device)."""
    if rows[0].numel():
        lo, hi = (v.tolist() for v in torch.stack(list(rows)).aminmax(dim=1))
    else:
        lo, hi = [0] * len(rows), [-1] * len(rows)
    return dict(zip(ROW_TENSORS, zip(lo, hi)))


def _set_extents(batch: ExtendBatch, extents: dict[str, tuple[int, int]]) -> None:
    object.__setattr__(batch, "extents", extents)
    addressed = max(extents["c2_slot"][1], extents["raw_out_loc"][1] // 2, 0) + 1
    needed = max(as_int("kv_slots_needed", batch.kv_slots_needed), addressed)
    object.__setattr__(batch, "kv_slots_needed", needed)


def _is_fields(r) -> bool:
    """``r`` holds fields (a tuple, a list, an array), not one number or a string."""
    if type(r) in (tuple, list, Request):  # the common case, without the ABC's look
        return True
    return isinstance(r, Iterable) and not isinstance(r, (str, bytes)) and not (
        isinstance(r, torch.Tensor) and r.dim() == 0)


def check_batch_fits(batch: ExtendBatch, pools: Pools, where: str = "", extents: dict | None = None) -> None:
    """Every index the batch's rows hold lies inside the pools: pool indices (the ring's requests),
    c2 slots (both caches) and positions. The extents were counted on the host when the batch was
    made (:attr:`ExtendBatch.extents`), so this reads no tensor: it runs inside a capture too.
    ``extents``: extents counted again (:meth:`ExtendBatch.check` passes those of the tensors now)."""
    check_type(f"{where}pools", pools, Pools, "a c2graph.Pools")
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
        lo, hi = (batch.extents if extents is None else extents).get(name, (0, -1))
        if lo < 0:
            raise ValueError(f"{where}batch.{name} holds {held} {lo}; expected values >= 0")
        if below is not None and hi >= below:
            raise ValueError(f"{where}batch.{name} holds {held} {hi}, past the pools; expected < {limit}")
