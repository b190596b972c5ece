"""The row plan: what each row of an extend batch does, decided once, next to the batch.

Which rows complete a group, where each group row's partner comes from, which c2 slot it
stores, which rows are parked in the ring after the batch: every picture, check, explanation
and host-side recomputation of the fused kernel asks :func:`plan_rows` (or
:meth:`ExtendBatch.plan`) instead of deciding again. It reads the batch's request list and
``raw_out_loc`` on the host (a sync): for pictures and checks, never inside a graph capture.

The rules, for a row of request ``(pool_index, prefix_len, extend_len)`` at ``pos``:

- a row at an odd ``pos`` completes the group ``(pos - 1, pos)`` and stores at c2 slot
  ``raw_out_loc // 2``; a row at an even ``pos`` stores nothing;
- a group row's partner is the previous batch row, except for the first row of a request that
  starts at an odd position: that partner was parked in the ring by an earlier chunk, at ring row
  ``pool_index * ring_size + (pos - 1) % ring_size``;
- after the batch, each request's last ``min(extend_len, ring_size)`` rows are parked at ring
  row ``pool_index * ring_size + pos % ring_size`` (all ring reads come first);
- a padding row (``raw_out_loc == 0``) does nothing: it completes no group, stores nothing, is
  not parked and is no partner. The rows past the live rows are padding and belong to no
  request; a request may be padding too (the dummy batch a graph is captured on: one request
  covering every row, each with ``raw_out_loc == 0``). Both paths skip these rows, so the plan
  does (:meth:`ExtendBatch.check` refuses a request whose rows are partly padding).

Which rows complete a group, which c2 slots they store and which partners come from the ring do
not depend on ``ring_size``; only the ring rows read and parked do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .arguments import as_int
from .config import MAX_RING_SIZE

# ``ExtendBatch`` below is :class:`c2graph.compressor.batch.ExtendBatch`, named, not imported: the batch
# builds on this module (:meth:`ExtendBatch.plan`), never the other way.

MIN_RING_SIZE = 2
"""The smallest ring: one pending pair per pool request."""


class Partner(Enum):
    """Where a row's partner comes from."""

    PREVIOUS_ROW = "previous row"
    RING = "ring"
    NONE_EVEN = "none: even row"
    PADDING = "padding"


@dataclass(frozen=True)
class RowPlan:
    """One row of the batch and what it does. Fields that do not apply are ``None``: rows past the
    live rows have no ``request_slot``, ``req`` or ``pos``; rows that complete no group have no
    ``c2_slot``; only a ring partner has a ``partner_ring_row``; only a parked row has a
    ``parked_in``."""

    row: int
    request_slot: int | None
    req: int | None
    pos: int | None
    raw_out_loc: int
    partner: Partner
    partner_ring_row: int | None
    c2_slot: int | None
    parked_in: int | None

    @property
    def is_padding(self) -> bool:
        """The row does nothing (``raw_out_loc == 0``): past the live rows, or in the dummy batch's request."""
        return self.partner is Partner.PADDING

    @property
    def completes_group(self) -> bool:
        """The row is at an odd position: it completes a group and stores a latent."""
        return self.c2_slot is not None

    @property
    def partner_row(self) -> int | None:
        """The batch row of the partner, where it is the previous row."""
        return self.row - 1 if self.partner is Partner.PREVIOUS_ROW else None

    def partner_text(self) -> str:
        """The partner in words: ``"previous row"``, ``"ring row N"``, ``"none: even row"``, ``"padding"``."""
        if self.partner is Partner.RING:
            return f"ring row {self.partner_ring_row}"
        return self.partner.value


@dataclass(frozen=True)
class BatchPlan:
    """Every row of ``batch`` (:class:`RowPlan`, in batch order), for a ring of ``ring_size`` rows
    per pool request. ``print(plan)`` shows it as a table."""

    batch: ExtendBatch
    ring_size: int
    rows: tuple[RowPlan, ...]

    @property
    def request_rows(self) -> list[range]:
        """The rows of each request slot of the batch, in batch order."""
        return self.batch.row_ranges()

    @property
    def pairs(self) -> list[range]:
        """The batch's pairs of rows, numbered in row order: each request's rows 0 and 1, 2 and 3,
        ... (the last of an odd count alone). Two consecutive positions hold one odd one, so a pair
        completes at most one group; the fused kernel gives each pair a lane."""
        return [range(row, min(row + 2, span.stop)) for span in self.request_rows for row in span[::2]]

    @property
    def group_rows(self) -> list[int]:
        """Rows that complete a group (odd ``pos``), in batch order: exactly the rows that store."""
        return [r.row for r in self.rows if r.completes_group]

    @property
    def ring_reads(self) -> dict[int, int]:
        """``{batch row: ring row}`` for the group rows whose partner is read from the ring."""
        return {r.row: r.partner_ring_row for r in self.rows if r.partner is Partner.RING}

    @property
    def stored_slots(self) -> list[int]:
        """c2 slots the batch writes (``kv_cache`` and ``index_k``), one per group row, in batch order."""
        return [r.c2_slot for r in self.rows if r.c2_slot is not None]

    @property
    def parked(self) -> dict[int, int]:
        """``{ring row: batch row}`` written into the ring after the batch."""
        return {r.parked_in: r.row for r in self.rows if r.parked_in is not None}

    @property
    def request_slot_of_row(self) -> list[int | None]:
        """Each row's request slot (``None`` for padding), in batch order."""
        return [r.request_slot for r in self.rows]

    def table(self) -> str:
        """The rows as a text table, one line a row, then the ring writes."""
        head = ("row", "request slot", "req", "pos", "group?", "partner", "c2 slot", "parked in")
        lines = [
            (
                str(r.row),
                _or_dash(r.request_slot),
                _or_dash(r.req),
                _or_dash(r.pos),
                "yes" if r.completes_group else "-",
                r.partner_text(),
                _or_dash(r.c2_slot),
                "-" if r.parked_in is None else f"ring row {r.parked_in}",
            )
            for r in self.rows
        ]
        widths = [max(len(s) for s in col) for col in zip(head, *lines)]
        left = {5, 7}  # the columns in words
        fmt = "  ".join(f"{{:<{w}}}" if i in left else f"{{:>{w}}}" for i, w in enumerate(widths))
        out = [fmt.format(*head).rstrip()] + [fmt.format(*line).rstrip() for line in lines]
        parked = ", ".join(f"row {row} -> ring row {ring}" for ring, row in sorted(self.parked.items()))
        out.append(f"ring writes (after every read): {parked or 'none'}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def check_ring_size(ring_size) -> int:
    return as_int("ring_size", ring_size, least=MIN_RING_SIZE, below=MAX_RING_SIZE + 1, below_is=f"{MAX_RING_SIZE + 1}")


def plan_rows(batch: ExtendBatch, ring_size: int) -> BatchPlan:
    """The plan of every row of ``batch`` (see the module docstring for the rules)."""
    ring_size = check_ring_size(ring_size)
    if not callable(getattr(batch, "row_ranges", None)):  # what this module reads of an ExtendBatch
        raise ValueError(f"batch is a {type(batch).__name__}; expected an ExtendBatch")
    raw = batch.raw_out_loc.cpu().tolist()
    R = ring_size
    rows: list[RowPlan] = []
    for slot, (r, span) in enumerate(zip(batch.requests, batch.row_ranges())):
        for i, row in enumerate(span):
            pos = r.prefix_len + i
            if raw[row] == 0:
                rows.append(RowPlan(row, slot, r.pool_index, pos, 0, Partner.PADDING, None, None, None))
                continue
            if pos % 2 == 0:
                partner, ring_read = Partner.NONE_EVEN, None
            elif i > 0:
                partner, ring_read = Partner.PREVIOUS_ROW, None
            else:
                partner, ring_read = Partner.RING, r.pool_index * R + (pos - 1) % R
            rows.append(
                RowPlan(
                    row=row,
                    request_slot=slot,
                    req=r.pool_index,
                    pos=pos,
                    raw_out_loc=raw[row],
                    partner=partner,
                    partner_ring_row=ring_read,
                    c2_slot=raw[row] // 2 if pos % 2 == 1 else None,
                    parked_in=r.pool_index * R + pos % R if i >= len(span) - R else None,
                )
            )
    for row in range(batch.live_rows, batch.num_rows):
        rows.append(RowPlan(row, None, None, None, raw[row], Partner.PADDING, None, None, None))
    return BatchPlan(batch, ring_size, tuple(rows))
