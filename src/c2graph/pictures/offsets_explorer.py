"""Build a batch, see its ``low_ratio_extend_offsets``, its padding rows, and its replay against eager.

:func:`replay_offsets` is a plain function (tests call it without a browser): give it requests
``(pool_index, prefix_len, extend_len)`` and, optionally, the row count shared by all
data-parallel ranks (``pad_to``). It runs the batch through a prefill graph runner of two layers
(one with the fused gate, one without; buckets 8, 16 and 32; 4 request slots), runs the same
batch eagerly on a copy of the pools, and returns what happened: the bucket (or why it ran
eagerly), the offsets tensor, the padding rows, and every layer's comparison, bitwise.
:func:`offsets_explorer_widget` only binds ipywidgets controls to it and draws the offsets.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ..compressor.batch import ExtendBatch
from ..compressor.compress import compress, layer_path
from ..compressor.config import Config
from ..compressor.model import layer_pools, served_layers
from ..compressor.req_to_token import ReqToTokenPool
from ..prefill.runner import PrefillGraphRunner
from ..measure.compare import Comparison, compare, compare_pools

BUCKETS = (8, 16, 32)
REQUEST_SLOTS = 4
POOL_REQUESTS = 4
MAX_SEQ_LEN = 64


@dataclass
class OffsetsReplay:
    """One batch through the graph runner and eagerly.

    ``batch``: as the runner built it (padded to the bucket) or as eager ran it; ``offsets``:
    ``[2, request_slots]`` int32 (the static tensor after the refresh, when it replayed);
    ``why``: the bucket it replayed in, or why it ran eagerly; ``comparisons``: per layer, the
    caches, the ring and the group rows' latents against eager.
    """

    requests: list[tuple[int, int, int]]
    pad_to: int | None
    mode: str
    bucket: int | None
    why: str
    batch: ExtendBatch
    comparisons: list[tuple[str, list[Comparison]]]

    @property
    def ok(self) -> bool:
        return all(all(cs) for _, cs in self.comparisons)

    @property
    def padding_rows(self) -> range:
        return range(self.batch.live_rows, self.batch.num_rows)

    def summary(self) -> str:
        """What happened, in a few lines."""
        pad = self.padding_rows
        lines = [f"{len(self.requests)} request(s), {self.batch.live_rows} live rows"
                 + ("" if self.pad_to is None else f", pad_to {self.pad_to}") + f": {self.why}",
                 f"low_ratio_extend_offsets = {self.batch.extend_offsets.cpu().tolist()}",
                 f"padding rows: {pad.start}..{pad.stop - 1} (in no request slot)" if pad else "padding rows: none"]
        for name, cs in self.comparisons:
            lines.append(f"{name}: " + ("graph == eager, bitwise" if all(cs) else "; ".join(str(c) for c in cs if not c)))
        return "\n".join(lines)

    __str__ = summary


@functools.lru_cache(maxsize=None)
def _runner() -> PrefillGraphRunner:
    cfg = Config.tiny()
    layers = served_layers(cfg, 2, unfused_every=2, seed=11)
    pools = layer_pools(layers, POOL_REQUESTS, ReqToTokenPool(cfg, POOL_REQUESTS, MAX_SEQ_LEN).kv_slots)
    return PrefillGraphRunner(layers, pools, buckets=list(BUCKETS), request_slots=REQUEST_SLOTS)


def replay_offsets(requests: Sequence[tuple[int, int, int]], pad_to: int | None = None, *, seed: int = 0
                   ) -> OffsetsReplay:
    """Run ``requests`` (pool indices below 4, at most 4 requests, positions below 64) padded to
    ``pad_to`` rows through the graph and eagerly, from the same poisoned pools; see
    :class:`OffsetsReplay`. Bad input raises ``ValueError`` before anything runs."""
    runner = _runner()
    requests = [tuple(r) for r in requests]
    alloc = ReqToTokenPool(runner.layers[0].cfg, POOL_REQUESTS, MAX_SEQ_LEN, seed=seed)
    ExtendBatch.build(requests, alloc, request_slots=REQUEST_SLOTS, pad_to=pad_to)  # checks every argument
    for p in runner.layer_pools:
        p.poison()
    eager_pools = [p.clone() for p in runner.layer_pools]
    live = sum(n for *_, n in requests)
    xs = [layer.random_hidden(live, seed=seed * 7 + i) for i, layer in enumerate(runner.layers)]
    step = runner.run(requests, alloc, xs, pad_to=pad_to)
    batch = ExtendBatch.build(requests, alloc, pad_to=pad_to, device=runner.device)
    want = [compress(layer, x, batch, p) for layer, x, p in zip(runner.layers, xs, eager_pools)]
    groups = step.batch.group_rows
    comparisons = []
    for i, (layer, got, ref) in enumerate(zip(runner.layers, runner.layer_pools, eager_pools)):
        cs = compare_pools(got, ref, skip_slot0=not layer.use_fused_gate)
        cs.append(compare(step.latents[i][groups], want[i][groups], "latent (group rows)"))
        comparisons.append((f"layer {i} ({layer_path(layer)} path)", cs))
    rows = live if pad_to is None else pad_to
    if step.mode == "graph":
        why = f"replayed in the graph of bucket {step.bucket}"
    elif rows > BUCKETS[-1]:
        why = f"ran eagerly: {rows} rows are more than the largest bucket ({BUCKETS[-1]})"
    else:
        why = f"ran eagerly: padding {rows} rows to a bucket would more than double them"
    return OffsetsReplay(requests, pad_to, step.mode, step.bucket, why, step.batch, comparisons)


def offsets_explorer_widget():
    """Sliders for three requests' prefix and extend lengths (extend 0: not in the batch) and a
    dropdown for ``pad_to``, bound to :func:`replay_offsets`; shows the offsets and the result."""
    import io

    import ipywidgets as w
    from IPython.display import Image, display

    from .draw_offsets import draw_offsets

    defaults = [(0, 5), (3, 6), (1, 2)]
    controls = {}
    for p, (prefix, extend) in enumerate(defaults):
        controls[f"prefix{p}"] = w.IntSlider(prefix, 0, 20, description=f"req {p} prefix")
        controls[f"extend{p}"] = w.IntSlider(extend, 0, 12, description=f"req {p} extend")
    controls["pad_to"] = w.Dropdown(options=[("the batch's own rows", 0), *((str(n), n) for n in (8, 12, 16, 24, 32))],
                                    value=16, description="pad_to")

    def show(pad_to, **v):
        requests = [(p, v[f"prefix{p}"], v[f"extend{p}"]) for p in range(3) if v[f"extend{p}"]]
        live = sum(n for *_, n in requests)
        if pad_to and pad_to < live:
            print(f"pad_to {pad_to} is below the {live} live rows: every rank pads to the largest; shown unpadded")
            pad_to = 0
        result = replay_offsets(requests, pad_to or None)
        png = io.BytesIO()
        draw_offsets({"this batch": result.batch}).savefig(png, format="png", dpi=90)
        display(Image(png.getvalue()))  # an image, whatever the matplotlib backend
        print(result.summary())

    rows = [w.HBox([controls[f"prefix{p}"], controls[f"extend{p}"]]) for p in range(3)]
    return w.VBox(rows + [controls["pad_to"], w.interactive_output(show, controls)])
