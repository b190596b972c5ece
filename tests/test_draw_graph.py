"""The prefill-graph pictures: static buffers, node lists, wrong slots. Real artists on small cases,
and nothing registered with pyplot."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from slot_cases import doctored_replay  # noqa: E402
from support import POISON, make_case  # noqa: E402

import c2graph as c2  # noqa: E402
from c2graph.workshop.broken_offsets import BrokenOffsetsRunner  # noqa: E402
from c2graph.pictures.style import PADDING_COLOUR, request_colour  # noqa: E402
from c2graph.pictures.draw_graph import (  # noqa: E402
    DIFFERS,
    EQUAL,
    NEVER_WRITTEN,
    OTHER_COLOUR,
    STALE_COLOUR,
    STATE_COLOURS,
    draw_graph_nodes,
    draw_static_buffers,
    draw_wrong_slots,
    node_label,
)

CFG = c2.Config.tiny()


def by_gid(fig: Figure, gid: str) -> list:
    return [a for a in fig.findobj() if getattr(a, "get_gid", lambda: None)() == gid]


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


def face(artist) -> str:
    return to_hex(artist.get_facecolor())


def close(fig: Figure) -> None:
    assert plt.get_fignums() == [], "a drawing function registered a pyplot figure"
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# (a) static buffers


@pytest.fixture(scope="module")
def torch_runner():
    """A torch-path runner (buckets 16 and 32, 4 request slots) after one two-request batch."""
    layer, alloc, pools = make_case(use_fused_gate=False, seed=1)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[32, 16], request_slots=4)
    step = runner.run([(0, 0, 5), (1, 0, 6)], alloc, layer.random_hidden(11, seed=0))
    assert (step.mode, step.bucket) == ("graph", 16)
    return runner, step, alloc


def test_static_buffers_of_a_torch_path_replay(torch_runner):
    runner, step, _ = torch_runner
    fig = draw_static_buffers(runner, step.batch)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    n = 7  # kv, score, pos, req, raw_out_loc, c2_slot, latent
    assert len(by_gid(fig, "buffer")) == n
    live = by_gid(fig, "live")
    assert len(live) == 2 * n  # one segment per request per buffer
    assert {face(p) for p in live} == {request_colour(0).lower(), request_colour(1).lower()}
    assert sorted(p.get_width() for p in live)[::n] == [5, 6]
    padding = by_gid(fig, "padding")
    assert len(padding) == n and all(p.get_hatch() == "///" and p.get_width() == 16 - 11 for p in padding)
    assert face(padding[0]) == PADDING_COLOUR.lower()
    stale = by_gid(fig, "stale")  # rows 16..31: past this bucket
    assert len(stale) == n and all(p.get_x() == 16 and p.get_width() == 16 for p in stale)
    assert face(stale[0]) == STALE_COLOUR.lower()
    assert len(by_gid(fig, "bucket")) == 2
    offsets = by_gid(fig, "offset")
    assert len(offsets) == 2 * 4
    t = texts(fig)
    assert "kv  [32, 32] fp32" in t and "c2_slot  [32] int64" in t and "latent  [32, 32] bf16" in t
    cells = [x.get_text() for x in fig.axes[1].texts if x.get_text().isdigit()]  # (first row, count) per slot
    assert cells == ["0", "5", "5", "6", "11", "0", "11", "0"]
    assert "bucket 16" in t and "bucket 32" in t
    close(fig)


def test_static_buffers_without_a_batch_and_a_full_bucket(torch_runner):
    runner, _, alloc = torch_runner
    fig = draw_static_buffers(runner)
    assert len(by_gid(fig, "buffer")) == 7
    assert not by_gid(fig, "live") and not by_gid(fig, "padding") and not by_gid(fig, "stale")
    close(fig)
    step = runner.run([(2, 0, 20)], alloc, runner.layer.random_hidden(20, seed=1))
    fig = draw_static_buffers(runner, step.batch)  # bucket 32, the largest: nothing past it
    assert len(by_gid(fig, "live")) == 7 and len(by_gid(fig, "padding")) == 7 and not by_gid(fig, "stale")
    close(fig)


def test_static_buffers_want_a_padded_batch(torch_runner):
    runner, _, alloc = torch_runner
    unpadded = c2.ExtendBatch.build([(3, 0, 11)], alloc)
    with pytest.raises(ValueError, match=r"batch has 11 rows; expected .* \[16, 32\]"):
        draw_static_buffers(runner, unpadded)


def test_static_buffers_of_the_fused_path():
    layer, _, pools = make_case(use_fused_gate=True, seed=2)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[16], request_slots=2)
    fig = draw_static_buffers(runner)
    assert len(by_gid(fig, "buffer")) == 6  # one | kv | score | buffer instead of two
    t = texts(fig)
    assert "projected  [16, 64] fp32" in t and not any(x.startswith("kv  ") for x in t)
    assert len(by_gid(fig, "bucket")) == 1 and len(by_gid(fig, "offset")) == 4
    close(fig)


# ---------------------------------------------------------------------------------------------
# (b) node lists


@pytest.mark.parametrize(
    "node, label",
    [
        ("aten.mul.Tensor", "mul"),
        ("aten._to_copy.default", "_to_copy"),
        ("c2graph.compress_fused.default", "c2graph::compress_fused"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, "
         "std::array<char*, 1ul> >(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)",
         "vectorized_elementwise_kernel"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous "
         "namespace)::OpaqueType<1u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::"
         "OpaqueType<1u>*, unsigned int)", "CatArrayBatchedCopy_contig"),
        ("_compress_fused_kernel", "_compress_fused_kernel"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
    ],
)
def test_node_label(node, label):
    assert node_label(node) == label


def test_draw_graph_nodes_counts_and_colours():
    graphs = {
        "torch": ["aten.mul.Tensor"] * 3 + ["aten.add.Tensor"] * 2 + ["aten.cat.default"],
        "fused": ["c2graph.compress_fused.default"],
    }
    fig = draw_graph_nodes(graphs, top=2)
    assert len(fig.axes) == 2
    nodes = by_gid(fig, "node")
    assert len(nodes) == 7
    torch_cells, fused_cells = nodes[:6], nodes[6:]
    # each graph's most frequent name is coloured (the fused node too, though it is the rarest)
    assert face(torch_cells[0]) != OTHER_COLOUR.lower() and face(fused_cells[0]) != OTHER_COLOUR.lower()
    assert face(torch_cells[0]) != face(fused_cells[0])
    assert {face(c) for c in torch_cells[3:]} == {OTHER_COLOUR.lower()}  # add, cat: past top=2
    # every strip is on the same scale: the one-node graph is one node tall
    assert fused_cells[0].get_height() == pytest.approx(torch_cells[0].get_height())
    counts = [t.get_text() for t in by_gid(fig, "count")]
    assert counts == ["   3 x mul", "   2 x add", "   1 x cat", "   1 x c2graph::compress_fused"]
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["torch: 6 nodes", "fused: 1 node"]
    close(fig)
    with pytest.raises(ValueError, match="graphs is empty"):
        draw_graph_nodes({})


def test_draw_graph_nodes_of_a_captured_runner(torch_runner):
    runner, _, _ = torch_runner
    nodes = runner.nodes(16)
    fig = draw_graph_nodes({"torch path": nodes}, listed=5)
    assert len(by_gid(fig, "node")) == len(nodes) > 100
    assert len(by_gid(fig, "count")) == 5
    assert any("other names" in t for t in texts(fig))
    close(fig)


# ---------------------------------------------------------------------------------------------
# (c) wrong slots


@pytest.fixture
def doctored():
    return doctored_replay()


def test_draw_wrong_slots_colours_each_slot_by_its_state(doctored):
    batch, graph, eager, differs, never = doctored
    fig = draw_wrong_slots(graph, eager, batch, CFG.ring_size, poison=POISON)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    cells = by_gid(fig, "slot")
    assert len(cells) == len(batch.plan(CFG.ring_size).stored_slots) == 4
    assert [face(c) for c in cells] == [STATE_COLOURS[s].lower() for s in (EQUAL, EQUAL, DIFFERS, NEVER_WRITTEN)]
    assert [c.get_hatch() for c in cells] == [None, None, None, "xx"]
    ring = by_gid(fig, "ring")
    assert len(ring) == 4 and face(ring[3]) == STATE_COLOURS[NEVER_WRITTEN].lower()
    assert {face(c) for c in ring[:3]} == {STATE_COLOURS[EQUAL].lower()}
    t = texts(fig)
    assert str(differs) in t and str(never) in t and "row 4\npos 3" in t and "partner:\nring row 2" in t
    assert "request slot 1 (req 1)" in t
    brackets = [ln for ln in fig.axes[0].lines if ln.get_linewidth() == 3.0]  # under each request's cells
    assert [to_hex(ln.get_color()) for ln in brackets] == [request_colour(0).lower(), request_colour(1).lower()]
    assert fig.axes[0].get_title() == "graph vs eager: 2 of 4 c2 slots and 1 of 4 ring rows wrong"
    assert not by_gid(fig, "why")
    close(fig)


def test_draw_wrong_slots_says_why(doctored):
    batch, graph, eager, _, _ = doctored
    one_request = torch.tensor([[0, 7], [7, 0]], dtype=torch.int32)  # frozen: all rows one request
    fig = draw_wrong_slots(graph, eager, batch, CFG.ring_size, poison=POISON, frozen_offsets=one_request)
    assert [t.get_text() for t in by_gid(fig, "why")] == ["graph used:\nrow 3"]  # row 4 pairs across requests
    close(fig)
    rings = (eager.ring.clone(), eager.ring.clone())
    rings[0][2] = POISON  # the graph's ring row 2 was never parked before the batch
    fig = draw_wrong_slots(graph, eager, batch, CFG.ring_size, poison=POISON, rings_before=rings, grid_pairs=3)
    assert [t.get_text() for t in by_gid(fig, "why")] == ["ring row 2\nheld the poison", "pair 3: past\nthe grid's 3"]
    close(fig)


def test_draw_wrong_slots_of_a_broken_runner():
    """The python_ints variant after the test's two batches: the slots it gets wrong are drawn as differing."""
    layer, alloc, pools = make_case(seed=5)
    runner = BrokenOffsetsRunner(layer, pools, variant="python_ints", buckets=[32], request_slots=4)
    ref = pools.clone()
    for i, reqs in enumerate(([(0, 0, 5), (1, 0, 3), (2, 0, 8)], [(0, 5, 6), (1, 3, 7), (2, 8, 5)])):
        x = layer.random_hidden(sum(r[2] for r in reqs), seed=10 + i)
        batch = runner.run(reqs, alloc, x).batch
        c2.compress(layer, x, c2.ExtendBatch.build(reqs, alloc, device=pools.device), ref)
    wrong = set(torch.nonzero((pools.kv_cache.float() != ref.kv_cache.float()).any(dim=1)).flatten().tolist())
    stored = batch.plan(CFG.ring_size).stored_slots
    assert len(wrong) == 2 and wrong <= set(stored)
    fig = draw_wrong_slots(pools, ref, batch, CFG.ring_size, poison=POISON,
                           frozen_offsets=runner.static.extend_offsets)
    cells = dict(zip(stored, by_gid(fig, "slot")))
    assert {s for s, c in cells.items() if face(c) == STATE_COLOURS[DIFFERS].lower()} == wrong
    assert {face(c) for c in by_gid(fig, "ring")} == {STATE_COLOURS[NEVER_WRITTEN].lower()}  # nothing parked
    assert "graph used:\nrow 5" in [t.get_text() for t in by_gid(fig, "why")]  # request 1 paired with request 0
    close(fig)
