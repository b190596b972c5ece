"""The notebooks' explorer: sliders over a few requests, bound to the row plan and its pictures.

:func:`explain_batch` is a plain function (tests call it without a browser): give it a list of
requests ``(pool_index, prefix_len, extend_len)`` and it builds their extend batch and returns its
:class:`~c2graph.compressor.rows.BatchPlan`: for every row its request slot, ``req`` and ``pos``,
whether it completes a group, where its partner comes from, which c2 slot it writes and which ring
row it is parked into (``print(plan)`` shows the table). :func:`explorer_widget` only binds
ipywidgets sliders to it and redraws the pictures of :mod:`c2graph.pictures.draw`.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Sequence

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.rows import BatchPlan, check_ring_size, plan_rows
from .draw import draw_batch, draw_ring

WIDGET_REQUESTS = 3
"""The explorer's sliders drive requests 0, 1 and 2 of a pool of this many requests."""


def explain_batch(
    requests: Sequence[tuple[int, int, int]],
    cfg: Config,
    ring_size: int | None = None,
    *,
    pad_to: int | None = None,
    allocator: ReqToTokenPool | None = None,
) -> BatchPlan:
    """Build the extend batch of ``requests`` (``(pool_index, prefix_len, extend_len)`` each,
    padded to ``pad_to`` rows) and return its row plan.

    ``ring_size`` defaults to ``cfg.ring_size``. Without an ``allocator`` a fresh, seeded
    :class:`ReqToTokenPool` just big enough for the requests hands out the ``raw_out_loc``, so
    the same arguments always give the same c2 slots. Bad input raises ``ValueError`` naming the
    argument, before any page is allocated.
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
    ring_size = cfg.ring_size if ring_size is None else ring_size
    check_ring_size(ring_size)
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
    return plan_rows(batch, ring_size)


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


def explorer_widget(cfg: Config | None = None, *, allocator: ReqToTokenPool | None = None, max_prefix: int = 15,
                    max_extend: int = 12):
    """Sliders for three requests' ``prefix_len`` and ``extend_len`` and a bucket to pad to, bound
    to :func:`explain_batch`; shows the batch and ring pictures and the row table. Needs ipywidgets.

    The sliders start on notebook 01's ragged batch, unpadded. With ``allocator`` (the pool that
    batch was built from) every redraw takes its pages from a copy of it, so the explorer shows the
    notebook's own c2 slots for the same requests and never gives the notebook's pool a page; without
    it, the seeded pool of :func:`explain_batch`."""
    import ipywidgets as w
    from IPython.display import Image, display

    cfg = cfg or Config.tiny()
    if allocator is not None and not isinstance(allocator, ReqToTokenPool):
        raise ValueError(f"allocator is a {type(allocator).__name__}; expected a ReqToTokenPool")
    defaults = [(0, 7), (5, 6), (12, 3)]
    sliders = {}
    for p, (prefix, extend) in enumerate(defaults):
        sliders[f"prefix{p}"] = w.IntSlider(prefix, 0, max_prefix, description=f"req {p} prefix")
        sliders[f"extend{p}"] = w.IntSlider(extend, 0, max_extend, description=f"req {p} extend")
    sliders["bucket"] = w.Dropdown(options=[("no padding", 0), ("16", 16), ("24", 24), ("32", 32), ("48", 48)],
                                   value=0, description="bucket")

    def show(bucket, **v):
        requests = [(p, v[f"prefix{p}"], v[f"extend{p}"]) for p in range(WIDGET_REQUESTS)]
        live = sum(n for _, _, n in requests)
        if bucket and live > bucket:
            print(f"{live} live rows do not fit a bucket of {bucket}: the engine would take a larger bucket, "
                  "or run eager above its largest. Shown unpadded.")
            bucket = 0
        pool = copy.deepcopy(allocator) if allocator is not None else None
        plan = explain_batch(requests, cfg, pad_to=bucket or None, allocator=pool)
        for fig in (draw_batch(plan.batch, plan.ring_size), draw_ring(plan.batch, WIDGET_REQUESTS, plan.ring_size)):
            png = io.BytesIO()
            fig.savefig(png, format="png")  # shown as an image whatever the matplotlib backend
            display(Image(png.getvalue()))
        print(plan.table())

    rows = [w.HBox([sliders[f"prefix{p}"], sliders[f"extend{p}"]]) for p in range(WIDGET_REQUESTS)]
    return w.VBox(rows + [sliders["bucket"], w.interactive_output(show, sliders)])
