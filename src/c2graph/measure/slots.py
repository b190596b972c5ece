"""Which places a replayed batch got wrong, and why: the graph's pools against eager's, slot by slot.

:func:`compare_slots` walks the batch's row plan (:meth:`ExtendBatch.plan`): every c2 slot a group
row stores and every ring row a row is parked into, with the row that writes it and whether the
graph's bytes equal eager's, differ, or still hold the poison both pools were filled with (never
written). Given what the graph really read (``frozen_offsets``, ``grid_pairs``, ``rings_before``),
it also says why a group went wrong: the partner the frozen offsets gave it (or that they gave
it no lane), a grid that stopped
short of it, or a partner ring row that already differed before the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..compressor.batch import ExtendBatch
from ..compressor.pools import POISON, Pools
from ..compressor.rows import Partner, RowPlan, plan_rows
from .compare import bits_of

EQUAL = "equal"
DIFFERS = "differs"
NEVER_WRITTEN = "never written"
C2_SLOT = "c2 slot"
RING_ROW = "ring row"


@dataclass(frozen=True)
class SlotState:
    """One place a batch writes, and how the graph's result compares with eager's.

    ``kind`` is :data:`C2_SLOT` (both caches at ``index``) or :data:`RING_ROW` (the ring at
    ``index``); ``writer`` is the plan of the batch row that writes it. ``state`` is
    :data:`EQUAL`, :data:`DIFFERS` or :data:`NEVER_WRITTEN`; ``why`` (c2 slots only, empty when
    nothing is known) what the graph did differently for this group, in words.
    """

    kind: str
    index: int
    writer: RowPlan
    state: str
    why: str = ""

    @property
    def row(self) -> int:
        return self.writer.row

    @property
    def request_slot(self) -> int:
        return self.writer.request_slot

    @property
    def req(self) -> int:
        return self.writer.req

    @property
    def pos(self) -> int:
        return self.writer.pos

    @property
    def partner(self) -> Partner:
        return self.writer.partner


@dataclass(frozen=True)
class SlotReport:
    """Every c2 slot a batch writes (``slots``, in batch order) and ring row it parks (``ring``)."""

    slots: tuple[SlotState, ...]
    ring: tuple[SlotState, ...]

    def wrong(self, kind: str | None = None) -> list[SlotState]:
        """The places that are not :data:`EQUAL` (of one ``kind``, or both)."""
        return [s for s in self.slots + self.ring if s.state != EQUAL and kind in (None, s.kind)]

    def __str__(self) -> str:
        parts = []
        for kind, items in (("c2 slots", self.slots), ("ring rows", self.ring)):
            bad = [s for s in items if s.state != EQUAL]
            if not bad:
                parts.append(f"{kind}: all {len(items)} equal to eager")
                continue
            by_state = {st: [s.index for s in bad if s.state == st] for st in (DIFFERS, NEVER_WRITTEN)}
            described = "; ".join(f"{len(ix)} {st} {ix}" for st, ix in by_state.items() if ix)
            parts.append(f"{kind}: {len(bad)} of {len(items)} wrong ({described})")
        return " | ".join(parts)


def compare_slots(
    graph_pools: Pools,
    eager_pools: Pools,
    batch: ExtendBatch,
    ring_size: int,
    *,
    poison: float = POISON,
    frozen_offsets: torch.Tensor | None = None,
    grid_pairs: int | None = None,
    rings_before: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> SlotReport:
    """After the same batch ran in a graph and eagerly: each c2 slot it writes and ring row it parks,
    with the row that writes it and whether the graph's bytes equal eager's, differ, or are still
    ``poison`` (the value both pools were filled with before the first batch: never written).

    A c2 slot is equal when both caches (``kv_cache`` and ``index_k``) are bitwise equal there.
    Each c2 slot's ``why`` is filled from what the graph really read, where given:
    ``frozen_offsets`` (``[2, request_slots]`` int32, the offsets a frozen graph replays),
    ``grid_pairs`` (how many of the batch's pairs of rows a frozen grid computes: its blocks times
    their pairs), ``rings_before`` (the graph's and eager's ring,
    ``[ring rows, 2 * D]`` fp32 each, as they were before the batch).
    """
    _check_pools(graph_pools, eager_pools)
    plan = plan_rows(batch, ring_size)
    frozen = frozen_offsets.cpu().tolist() if frozen_offsets is not None else None
    pos = batch.pos.cpu().tolist() if frozen is not None else None
    number = {row: p for p, pair in enumerate(plan.pairs) for row in pair}  # each row's pair of rows
    slots, ring = [], []
    for r in plan.rows:
        if r.c2_slot is not None:
            c2 = r.c2_slot
            state = _state([graph_pools.kv_cache[c2], graph_pools.index_k[c2]],
                           [eager_pools.kv_cache[c2], eager_pools.index_k[c2]], poison)
            why = _why(r, number[r.row], ring_size, poison, frozen, pos, grid_pairs, rings_before)
            slots.append(SlotState(C2_SLOT, c2, r, state, why))
        if r.parked_in is not None:
            k = r.parked_in
            ring.append(SlotState(RING_ROW, k, r, _state([graph_pools.ring[k]], [eager_pools.ring[k]], poison)))
    return SlotReport(tuple(slots), tuple(ring))


def _state(got: list[torch.Tensor], want: list[torch.Tensor], poison: float) -> str:
    if all(torch.equal(bits_of(g.detach().cpu()), bits_of(w.detach().cpu())) for g, w in zip(got, want)):
        return EQUAL
    if all(bool((g.detach().float().cpu() == poison).all()) for g in got):
        return NEVER_WRITTEN
    return DIFFERS


def _check_pools(graph_pools, eager_pools) -> None:
    for name, p in (("graph_pools", graph_pools), ("eager_pools", eager_pools)):
        if not isinstance(p, Pools):
            raise ValueError(f"{name} is a {type(p).__name__}; expected a Pools")
    for name, g in graph_pools.tensors().items():
        w = eager_pools.tensors()[name]
        if g.shape != w.shape:
            raise ValueError(f"{name}: graph_pools has shape {tuple(g.shape)}, eager_pools {tuple(w.shape)}; "
                             "expected the same pools")


def partner_under(offsets: Sequence[Sequence[int]], r: RowPlan, ring_size: int,
                  pos: Sequence[int]) -> tuple[Partner, int | None]:
    """Where group row ``r``'s partner comes from when the kernel reads ``offsets`` (``[2, request
    slots]`` as lists, e.g. the offsets a frozen graph replays) instead of the batch's own, ``pos``
    being the batch's ``pos`` (a list, every row): ``(Partner.PREVIOUS_ROW, batch row)``,
    ``(Partner.RING, ring row)`` (the kernel takes the ring row from the row's own ``req`` and
    ``pos``), ``(Partner.PADDING, None)`` when the offsets put the row in no request, or
    ``(Partner.NONE_EVEN, None)`` when no lane computes it: the kernel cuts each request of the
    offsets into pairs of rows and computes the first row of a pair at an odd position, and
    under these offsets ``r`` is the second row of a pair whose first is odd too."""
    for start, count in zip(*offsets):
        if start <= r.row < start + count:
            pair = start + 2 * ((r.row - start) // 2)
            if r.row != pair and pos[pair] % 2 == 1:
                return Partner.NONE_EVEN, None
            if r.row > start:
                return Partner.PREVIOUS_ROW, r.row - 1
            return Partner.RING, r.req * ring_size + (r.pos - 1) % ring_size
    return Partner.PADDING, None


def _planned_partner(r: RowPlan) -> tuple[Partner, int | None]:
    return r.partner, (r.partner_row if r.partner is Partner.PREVIOUS_ROW else r.partner_ring_row)


def _why(r: RowPlan, number: int, ring_size: int, poison: float, frozen, pos, grid_pairs, rings_before) -> str:
    """What the graph did differently for the group of ``r``, in the batch's pair of rows ``number``
    (empty when nothing is known)."""
    if grid_pairs is not None and number >= grid_pairs:
        return f"pair {number}: past\nthe grid's {grid_pairs}"
    if frozen is not None:
        used = partner_under(frozen, r, ring_size, pos)
        if used != _planned_partner(r):
            kind, index = used
            if kind is Partner.NONE_EVEN:
                return "graph computed\nno group here"
            words = {Partner.PREVIOUS_ROW: f"row {index}", Partner.RING: f"ring row {index}",
                     Partner.PADDING: "nothing\n(no request)"}[kind]
            return f"graph used:\n{words}"
    if rings_before is not None and r.partner is Partner.RING:
        k = r.partner_ring_row
        got, want = rings_before[0][k].detach().cpu(), rings_before[1][k].detach().cpu()
        if not torch.equal(bits_of(got), bits_of(want)):
            held = "the poison" if bool((got.float() == poison).all()) else "other bytes"
            return f"ring row {k}\nheld {held}"
    return ""
