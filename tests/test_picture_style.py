"""What every picture promises a notebook reader: at most 12 inches wide (the saved image too), no
text under 9 points, one colour per request slot in every picture, and "request slot r" (never a
bare "slot r") for request slots. Checked on small cases and on cases that grow with the rows."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from support import make_case  # noqa: E402

import c2graph as c2  # noqa: E402
from c2graph.prefill.runner import PrefillGraphRunner  # noqa: E402
from c2graph.pictures.draw import draw_batch, draw_gate_weights, draw_path, draw_ring  # noqa: E402
from c2graph.pictures.draw_fused import (  # noqa: E402
    MINIMUM_LABEL,
    draw_extend_offsets,
    draw_launch_counts,
    draw_programs,
)
from c2graph.pictures.draw_graph import draw_graph_nodes, draw_static_buffers, draw_wrong_slots  # noqa: E402
from c2graph.pictures.style import MAX_WIDTH, MIN_FONT, PADDING_COLOUR, request_colour  # noqa: E402

CFG = c2.Config.tiny()


def _batch(requests, pad_to, pool_requests=8, slots=None):
    alloc = c2.ReqToTokenPool(CFG, pool_requests, 96, seed=0)
    return c2.ExtendBatch.build(requests, alloc, pad_to=pad_to, request_slots=slots, device="cpu")


SMALL = dict(requests=[(0, 0, 4), (1, 5, 5), (3, 2, 3)], pad_to=16)
LARGE = dict(requests=[(p, 3 * p + 1, 12) for p in range(4)] + [(4, 30, 11)], pad_to=64, slots=8)


@pytest.fixture(scope="module")
def runner_step():
    """A torch-path runner with 8 request slots after a three-request replay in bucket 32 of 64."""
    layer, alloc, pools = make_case(use_fused_gate=False, pool_requests=8, seed=1)
    runner = PrefillGraphRunner(layer, pools, buckets=[16, 32, 64], request_slots=8)
    step = runner.run([(0, 0, 5), (1, 3, 7), (2, 8, 6)], alloc, layer.random_hidden(18, seed=0))
    return runner, step


def _wrong_slots(requests, pad_to, slots=None):
    batch = _batch(requests, pad_to, slots=slots)
    _, alloc, pools = make_case(pool_requests=8)
    got = pools.clone()
    got.kv_cache += 1.0  # every c2 slot differs
    return draw_wrong_slots(got, pools, batch, CFG.ring_size)


def pictures(case):
    """Every picture of the package, drawn for ``case`` (SMALL or LARGE)."""
    big = case is LARGE
    b = _batch(**case)
    n = 5 if big else 2
    paths = {f"path {i}": 10**i for i in range(n)}
    yield "draw_batch", draw_batch(b, CFG.ring_size)
    yield "draw_ring", draw_ring(b, 8, CFG.ring_size, previous=_batch([(1, 0, 5)], None))
    yield "draw_extend_offsets", draw_extend_offsets(b)
    yield "draw_programs", draw_programs(b, CFG.ring_size)
    yield "draw_path", draw_path(CFG)
    yield "draw_gate_weights", draw_gate_weights(torch.rand(24 if big else 5, 512 if big else CFG.D))
    yield "draw_launch_counts", draw_launch_counts(paths, paths, 0.5, source="a GPU, torch x.y, a date")
    yield "draw_wrong_slots", _wrong_slots(**case)
    nodes = ["aten.mul.Tensor", "aten.add.Tensor"] * (60 if big else 3)
    yield "draw_graph_nodes", draw_graph_nodes({f"graph {i}": nodes for i in range(3 if big else 1)})


@pytest.mark.parametrize("case", [SMALL, LARGE], ids=["small", "large"])
def test_width_and_font_bounds(case):
    for name, fig in pictures(case):
        fig.draw_without_rendering()
        saved = fig.get_tightbbox()  # what a notebook shows (bbox_inches="tight")
        assert fig.get_figwidth() <= MAX_WIDTH and saved.width <= MAX_WIDTH, name
        sizes = {t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}
        assert min(sizes) >= MIN_FONT, f"{name}: text of {min(sizes)} pt"
        plt.close(fig)


def test_runner_pictures_bounds(runner_step):
    runner, step = runner_step
    for fig in (draw_static_buffers(runner, step.batch), draw_static_buffers(runner)):
        fig.draw_without_rendering()
        assert fig.get_figwidth() <= MAX_WIDTH and fig.get_tightbbox().width <= MAX_WIDTH
        assert min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()) >= MIN_FONT


def _faces(fig, gid):
    return [to_hex(a.get_facecolor()) for a in fig.findobj() if getattr(a, "get_gid", lambda: None)() == gid]


def test_one_colour_per_request_slot_in_every_picture(runner_step):
    b = _batch(**SMALL)
    plan = b.plan(CFG.ring_size)
    want = [request_colour(r.request_slot).lower() for r in plan.rows]
    assert want[-1] == PADDING_COLOUR.lower() == request_colour(None).lower()
    for fig in (draw_batch(b, 2), draw_ring(b, 8, 2), draw_extend_offsets(b), draw_programs(b, 2)):
        assert _faces(fig, "row") == want
    runner, step = runner_step
    live = _faces(draw_static_buffers(runner, step.batch), "live")
    assert live[:3] == [request_colour(s).lower() for s in range(3)]
    offsets = _faces(draw_static_buffers(runner, step.batch), "offset")
    assert offsets[::2][:3] == [request_colour(s).lower() for s in range(3)]  # two cells per request slot


def test_request_slots_are_called_request_slots(runner_step):
    runner, step = runner_step
    figs = [fig for _, fig in pictures(SMALL)] + [draw_static_buffers(runner, step.batch)]
    bare = re.compile(r"(?<!request )(?<!c2 )\bslots? \d")
    for fig in figs:
        words = [t.get_text().replace("\n", " ") for t in fig.findobj(Text)]
        assert not [w for w in words if bare.search(w)]
        plt.close(fig)


def test_cost_pictures_say_what_is_measured_and_what_is_computed():
    fig = draw_launch_counts({"torch path": 144, "fused": 1}, {"torch path": 1499.3}, 41.3,
                             source="NVIDIA H200, torch 2.11, 2025-06-01")
    launches, moved = fig.axes
    assert launches.get_xlabel() == "kernel launches (counted)"
    assert [t.get_text() for t in moved.get_yticklabels()] == ["torch path: summed over its ops", MINIMUM_LABEL]
    assert MINIMUM_LABEL == "minimum bytes (computed)"
    assert [p.get_hatch() for p in moved.patches] == [None, "//"]
    assert "counted on: NVIDIA H200, torch 2.11, 2025-06-01" in fig.get_suptitle()
