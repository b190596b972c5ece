"""What each row of an extend batch does, in words: the logic behind the notebooks' explorer.

:func:`explain_batch` is a plain function (tests call it without a browser): give it a list of
requests ``(pool_index, prefix_len, extend_len)`` and it says, for every row, its request slot,
``req`` and ``pos``, whether it completes a group, where its partner comes from, which c2 slot it
writes, and which ring row it is parked into. :func:`explorer_widget` only binds ipywidgets
sliders to it and redraws the pictures of :mod:`c2graph.draw`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.req_to_token import ReqToTokenPool

PADDING = "padding"
PREVIOUS_ROW = "previous row"
EVEN_ROW = "none: even row"


@dataclass(frozen=True)
class RowInfo:
    """One row of the batch, explained. Fields that do not apply are ``None`` (padding rows have no
    ``request_slot``, ``req`` or ``pos``; even rows have no ``c2_slot``).

    ``partner`` is ``"previous row"``, ``"ring row N"``, ``"none: even row"`` or ``"padding"``;
    ``partner_ring_row`` is ``N`` in the second case. ``parked_in`` is the ring row the row is
    written to after the batch (it is one of its request's last ``ring_size`` rows).
    """

    row: int
    request_slot: int | None
    req: int | None
    pos: int | None
    raw_out_loc: int
    completes_group: bool
    partner: str
    partner_ring_row: int | None
    c2_slot: int | None
    parked_in: int | None

    @property
    def is_padding(self) -> bool:
        return self.request_slot is None


@dataclass(frozen=True)
class BatchExplanation:
    """Every row of ``batch`` explained (:class:`RowInfo`), for a ring of ``ring_size`` rows per
    pool request. ``pool_requests`` is the size of the request pool the batch was built against."""

    batch: ExtendBatch
    ring_size: int
    pool_requests: int
    rows: tuple[RowInfo, ...]

    @property
    def group_rows(self) -> list[int]:
        """Rows that complete a group (odd ``pos``), in batch order."""
        return [r.row for r in self.rows if r.completes_group]

    @property
    def ring_reads(self) -> dict[int, int]:
        """``{batch row: ring row}`` for the rows whose partner is read from the ring."""
        return {r.row: r.partner_ring_row for r in self.rows if r.partner_ring_row is not None}

    @property
    def stored_slots(self) -> list[int]:
        """c2 slots the batch writes, one per group row, in batch order."""
        return [r.c2_slot for r in self.rows if r.c2_slot is not None]

    @property
    def parked(self) -> dict[int, int]:
        """``{ring row: batch row}`` written into the ring after the batch."""
        return {r.parked_in: r.row for r in self.rows if r.parked_in is not None}

    def table(self) -> str:
        """The rows as a text table, one line a row, then the ring writes."""
        head = ("row", "slot", "req", "pos", "group?", "partner", "c2 slot", "parked in")
        dash = "-"
        lines = [
            (
                str(r.row),
                dash if r.request_slot is None else str(r.request_slot),
                dash if r.req is None else str(r.req),
                dash if r.pos is None else str(r.pos),
                "yes" if r.completes_group else dash,
                r.partner,
                dash if r.c2_slot is None else str(r.c2_slot),
                dash if r.parked_in is None else f"ring row {r.parked_in}",
            )
            for r in self.rows
        ]
        widths = [max(len(s) for s in col) for col in zip(head, *lines)]
        fmt = "  ".join(f"{{:>{w}}}" if i < 5 or i == 6 else f"{{:<{w}}}" for i, w in enumerate(widths))
        out = [fmt.format(*head).rstrip()] + [fmt.format(*line).rstrip() for line in lines]
        parked = ", ".join(f"row {row} -> ring row {ring}" for ring, row in sorted(self.parked.items()))
        out.append(f"ring writes (after every read): {parked or 'none'}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


def explain(batch: ExtendBatch, ring_size: int, pool_requests: int | None = None) -> BatchExplanation:
    """Explain every row of an already built ``batch`` (read on the host, from its request list
    and ``raw_out_loc``). ``pool_requests`` defaults to one more than the largest pool index."""
    _check_ring_size(ring_size)
    if not isinstance(batch, ExtendBatch):
        raise ValueError(f"batch is a {type(batch).__name__}; expected an ExtendBatch")
    needed = 1 + max((r.pool_index for r in batch.requests), default=0)
    if pool_requests is None:
        pool_requests = needed
    elif isinstance(pool_requests, bool) or not isinstance(pool_requests, int) or pool_requests < needed:
        raise ValueError(
            f"pool_requests = {pool_requests!r}; expected an int >= {needed} (the batch has pool_index {needed - 1})"
        )
    raw = batch.raw_out_loc.cpu().tolist()
    rows: list[RowInfo] = []
    start = 0
    for slot, r in enumerate(batch.requests):
        n = r.extend_len
        for i in range(n):
            row, pos = start + i, r.prefix_len + i
            odd = pos % 2 == 1
            if not odd:
                partner, ring_read = EVEN_ROW, None
            elif i > 0:
                partner, ring_read = PREVIOUS_ROW, None
            else:
                ring_read = r.pool_index * ring_size + (pos - 1) % ring_size
                partner = f"ring row {ring_read}"
            rows.append(
                RowInfo(
                    row=row,
                    request_slot=slot,
                    req=r.pool_index,
                    pos=pos,
                    raw_out_loc=raw[row],
                    completes_group=odd,
                    partner=partner,
                    partner_ring_row=ring_read,
                    c2_slot=raw[row] // 2 if odd else None,
                    parked_in=r.pool_index * ring_size + pos % ring_size if i >= n - ring_size else None,
                )
            )
        start += n
    for row in range(start, batch.num_rows):
        rows.append(RowInfo(row, None, None, None, raw[row], False, PADDING, None, None, None))
    return BatchExplanation(batch, ring_size, pool_requests, tuple(rows))


def explain_batch(
    requests: Sequence[tuple[int, int, int]],
    cfg: Config,
    ring_size: int | None = None,
    *,
    pad_to: int | None = None,
    allocator: ReqToTokenPool | None = None,
) -> BatchExplanation:
    """Build the extend batch of ``requests`` (``(pool_index, prefix_len, extend_len)`` each,
    padded to ``pad_to`` rows) and explain every row of it.

    ``ring_size`` defaults to ``cfg.ring_size``. Without an ``allocator`` a fresh, seeded
    :class:`ReqToTokenPool` just big enough for the requests hands out the ``raw_out_loc``, so
    the same arguments always give the same c2 slots. Bad input raises ``ValueError`` naming the
    argument, before any page is allocated.
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
    ring_size = cfg.ring_size if ring_size is None else ring_size
    _check_ring_size(ring_size)
    reqs = _check_requests(requests)
    if allocator is None:
        allocator = ReqToTokenPool(
            cfg,
            pool_requests=1 + max((p for p, _, _ in reqs), default=0),
            max_seq_len=max([p + n for _, p, n in reqs] + [1]),
        )
    elif not isinstance(allocator, ReqToTokenPool):
        raise ValueError(f"allocator is a {type(allocator).__name__}; expected a ReqToTokenPool")
    batch = ExtendBatch.build(reqs, allocator, pad_to=pad_to, device="cpu")
    return explain(batch, ring_size, allocator.pool_requests)


def _check_ring_size(ring_size) -> None:
    if isinstance(ring_size, bool) or not isinstance(ring_size, int) or ring_size < 2:
        raise ValueError(f"ring_size = {ring_size!r}; expected an int >= 2")


def _check_requests(requests) -> list[tuple[int, int, int]]:
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise ValueError(
            f"requests is a {type(requests).__name__}; expected a list of (pool_index, prefix_len, extend_len)"
        )
    out = []
    for i, r in enumerate(requests):
        if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 3:
            raise ValueError(f"requests[{i}] = {r!r}; expected (pool_index, prefix_len, extend_len)")
        for name, v in zip(("pool_index", "prefix_len", "extend_len"), r):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"requests[{i}].{name} = {v!r}; expected an int >= 0")
        out.append(tuple(r))
    return out


def explorer_widget(cfg: Config | None = None, *, max_prefix: int = 15, max_extend: int = 12):
    """Sliders for three requests' ``prefix_len`` and ``extend_len`` and a bucket to pad to, bound
    to :func:`explain_batch`; shows the batch and ring pictures and the row table. Needs ipywidgets."""
    import io

    import ipywidgets as w
    from IPython.display import Image, display

    from .draw import draw_batch, draw_ring

    cfg = cfg or Config.tiny()
    defaults = [(0, 7), (5, 6), (12, 3)]
    sliders = {}
    for p, (prefix, extend) in enumerate(defaults):
        sliders[f"prefix{p}"] = w.IntSlider(prefix, 0, max_prefix, description=f"req {p} prefix")
        sliders[f"extend{p}"] = w.IntSlider(extend, 0, max_extend, description=f"req {p} extend")
    sliders["bucket"] = w.Dropdown(options=[("no padding", 0), ("16", 16), ("24", 24), ("32", 32), ("48", 48)],
                                   value=24, description="bucket")

    def show(bucket, **v):
        requests = [(p, v[f"prefix{p}"], v[f"extend{p}"]) for p in range(3)]
        live = sum(n for _, _, n in requests)
        if bucket and live > bucket:
            print(f"{live} live rows do not fit a bucket of {bucket}: the engine would take a larger bucket, "
                  "or run eager above its largest. Shown unpadded.")
            bucket = 0
        ex = explain_batch(requests, cfg, pad_to=bucket or None)
        for fig in (draw_batch(ex.batch, ex.ring_size), draw_ring(ex.batch, ex.pool_requests, ex.ring_size)):
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=90)  # shown as an image whatever the matplotlib backend
            display(Image(png.getvalue()))
        print(ex.table())

    rows = [w.HBox([sliders[f"prefix{p}"], sliders[f"extend{p}"]]) for p in range(3)]
    return w.VBox(rows + [sliders["bucket"], w.interactive_output(show, sliders)])
